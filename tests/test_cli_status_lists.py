"""``spotrain status``'s list and ``spotrain cancel --all`` (issue 24, item 8): the live jobs and the 10
newest ended ones by default, ``--all`` for every job, ``--state`` to filter (a bad state is one line
naming it), a WORKERS column that summarises instead of listing every offering (it reached 135
columns), a table that fits the terminal, and ``cancel --all``. The same from the database (no
controller) and from a real controller over HTTP; real CLI processes, real SQLite.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from autoscaler.home import db_url
from autoscaler.state import Job, Store
from autoscaler.state.models import InstanceRow
from support import run_cli, start_controller, write_pw_spec

ENDED_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
OFFERINGS = [("aws/us-east-1a/g4dn.xlarge/T4:1", "spot"), ("aws/us-east-1b/g4dn.12xlarge/T4:4", "spot"),
             ("gcp/us-central1-a/n1-standard-8/T4:1", "on-demand"), ("gcp/europe-west4-b/n1-standard-16/T4:2", "spot")]


def add_jobs(ended: int, live: int = 0) -> tuple[list[str], list[str]]:
    """``ended`` ended jobs (states in turn, submitted a second apart) and ``live`` RUNNING ones, each
    on six workers of four offerings; their ids, oldest first."""
    spec = json.dumps({"name": "x", "run": "true", "resources": {"accelerators": ["T4:1"]}})
    store = Store(db_url())
    done, running = [], []
    try:
        with store.session() as s:
            for i in range(ended + live):
                is_live = i >= ended
                job_id = f"{'live' if is_live else 'old'}-{i:02d}"
                state = "RUNNING" if is_live else ENDED_STATES[i % 3]
                (running if is_live else done).append(job_id)
                s.add(Job(job_id=job_id, name=job_id, controller_id="c", cloud="local", spec_json=spec, workdir="/",
                          checkpoint_uri="file:///x", state=state, reason="", submitted_at=1000.0 + i,
                          submitted_clock_s=float(i), finished_at=None if is_live else 1100.0 + i,
                          finished_clock_s=None if is_live else 100.0 + i, step=5, total_steps=640,
                          cost_usd=0.25 * i))
                if is_live:
                    for k, (offering, market) in enumerate(OFFERINGS + OFFERINGS[:2]):
                        s.add(InstanceRow(instance_id=f"{job_id}-i{k}", job_id=job_id, cloud=offering.split("/")[0],
                                          offering_key=offering, market=market, state="running", decision_id=f"d{k}",
                                          launched_at_s=0.0, gpus=1))
            s.commit()
    finally:
        store.engine.dispose()
    return done, running


def listed(*args: str, env: dict[str, str] | None = None) -> list[str]:
    r = run_cli("status", *args, "--json", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout.strip().splitlines()[-1])
    return [j["job_id"] for j in data]


def table_ids(text: str) -> list[str]:
    return [ln.split()[0] for ln in text.strip().splitlines()[1:]]


@pytest.mark.parametrize("driver", ["sqlite", "sqlite+pysqlite"])
def test_status_lists_live_and_10_newest_ended_and_filters_from_the_database(
        spotrain_home: Path, driver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sqlite:///`` is read with the standard library's sqlite3, any other URL through the Store
    (as PostgreSQL would be): both select the same jobs."""
    monkeypatch.setenv("SPOTRAIN_DB_URL", f"{driver}:///{spotrain_home / 'spotrain.db'}")
    done, running = add_jobs(ended=13, live=2)
    default = listed()
    assert default == done[-10:] + running  # oldest first: the 3 oldest ended ones are left out
    human = run_cli("status", timeout=60)
    assert human.returncode == 0 and table_ids(human.stdout) == default, human.stdout
    assert listed("--all") == done + running
    failed = [j for i, j in enumerate(done) if ENDED_STATES[i % 3] == "FAILED"]  # 4 of them
    assert listed("--state", "FAILED") == failed
    assert listed("--state", "running,failed") == failed + running
    assert listed("--state", "RUNNING") == running
    assert listed("--state", "SUCCEEDED,CANCELLED") == [j for j in done if j not in failed][-10:]
    assert listed("--state", "SUCCEEDED,CANCELLED", "--all") == [j for j in done if j not in failed]
    none = run_cli("status", "--state", "PENDING", timeout=60)
    assert none.returncode == 0 and none.stdout.strip() == "no jobs in state PENDING"
    both = run_cli("status", running[0], "--state", "RUNNING", timeout=60)
    assert both.returncode == 2 and "not with JOB" in both.stderr and len(both.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", ["BOGUS", "RUNNING,sleeping", ","])
def test_a_bad_state_is_one_line_naming_it(spotrain_home: Path, bad: str) -> None:
    r = run_cli("status", "--state", bad, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--state" in lines[0] and "RUNNING" in lines[0], lines
    named = [n.strip().upper() for n in bad.split(",") if n.strip() and n.strip().upper() != "RUNNING"]
    assert all(f"{n} is not a job state" in lines[0] for n in named), lines
    assert "Traceback" not in r.stderr


def test_the_workers_column_is_short_and_the_table_fits_the_terminal(spotrain_home: Path) -> None:
    add_jobs(ended=2, live=2)
    wide = run_cli("status", env={"COLUMNS": "200"}, timeout=60).stdout
    assert "6 workers (5 spot, 1 on-demand)" in wide and max(len(ln) for ln in wide.splitlines()) < 90, wide
    for width in (70, 60, 50):
        text = run_cli("status", env={"COLUMNS": str(width)}, timeout=60).stdout
        assert max(len(ln) for ln in text.splitlines()) <= width, (width, text)
        for needed in ("live-03", "RUNNING", "5/640", "$0.7500", "old-00", "SUCCEEDED"):
            assert needed in text, (width, text)
    one = run_cli("status", "live-02", env={"COLUMNS": "60"}, timeout=60).stdout
    assert max(len(ln) for ln in one.split("\n\n")[0].splitlines()) <= 60 and "RUNNING" in one


def wait_live(names: list[str], timeout_s: float = 60) -> list[dict[str, Any]]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = run_cli("status", "--json", "--state", "PENDING,PROVISIONING,RUNNING", timeout=60)
        assert r.returncode == 0, r.stderr
        jobs = json.loads(r.stdout.strip().splitlines()[-1])
        if sorted(j["name"] for j in jobs if j["workers"]) == sorted(names):
            return list(jobs)
        time.sleep(0.3)
    raise AssertionError(f"{names} never ran")


@pytest.mark.e2e
def test_status_filters_and_cancel_all_with_a_controller(spotrain_home: Path, tmp_path: Path) -> None:
    done, _ = add_jobs(ended=12)
    env = {"PW_STEPS": "100000", "PW_STEP_S": "0.05"}
    ctl = start_controller(spotrain_home, env=env)
    try:
        empty = run_cli("cancel", "--all", timeout=60)
        assert empty.returncode == 0 and empty.stdout.strip() == "no live jobs to cancel", empty
        ids = []
        for name in ("first", "second"):
            r = run_cli("submit", str(write_pw_spec(tmp_path, name=name, workers="{min: 1, max: 1}")), "--json",
                        env=env, timeout=60)
            assert r.returncode == 0, r.stderr
            ids.append(json.loads(r.stdout.strip().splitlines()[-1])["job_id"])
        live = wait_live(["first", "second"])
        assert sorted(j["job_id"] for j in live) == sorted(ids)
        assert listed() == done[-10:] + ids  # over HTTP: the same selection as from the database
        # Wide enough for the whole WORKERS text whatever COLUMNS the test runner inherited (xdist sets one).
        human = run_cli("status", timeout=60, env={"COLUMNS": "200"}).stdout
        assert table_ids(human) == done[-10:] + ids and "1x " in human and " spot " in human, human
        assert listed("--all") == done + ids
        assert listed("--state", "FAILED") == [j for i, j in enumerate(done) if ENDED_STATES[i % 3] == "FAILED"]
        bad = run_cli("status", "--state", "RUNNNING", timeout=60)
        assert bad.returncode == 2 and "RUNNNING is not a job state" in bad.stderr
        neither = run_cli("cancel", timeout=60)
        assert neither.returncode == 2 and "--all" in neither.stderr
        r = run_cli("cancel", "--all", timeout=60)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.strip().splitlines()) == sorted(f"{i}: CANCELLED" for i in ids), r.stdout
        assert listed("--state", "CANCELLED", "--all")[-2:] == ids
        again = run_cli("cancel", "--all", timeout=60)
        assert again.returncode == 0 and again.stdout.strip() == "no live jobs to cancel"
    finally:
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=15)
        except subprocess.TimeoutExpired:
            ctl.kill()
