"""Failover: two controllers of one fleet on a real PostgreSQL; the leader is SIGKILLed mid-job.

Two ``spotrain controller start`` processes run with the same ``--id`` and ``SPOTRAIN_DB_URL`` (a
throwaway PostgreSQL, tests/pg_support.py), each with a SPOTRAIN_HOME of its own (its
``controller.json``, log and API token) and one ``SPOTRAIN_FLEET_DIR`` (the local cloud's machines,
the worker logs and the default checkpoint store: what both see on this one machine). The first
leads; the second is a standby that serves the read API and takes writes to the database. A job of
the torch-free protocol worker is submitted *to the standby*; once it is RUNNING with progress the
leader is SIGKILLed. The standby must take the lease and have recovered within 30 s (the default 10 s
lease), and carry the job to SUCCEEDED with its final model; no decision may have launched twice, every
instance is one the database records as launched, and nothing is left running. The takeover time is
printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from autoscaler.state.lease import read_lease
from cloud_providers.base import TAG_DECISION
from support import PROTOCOL_WORKER, assert_no_workers, run_cli, worker_pids, write_pw_spec

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FLEET = "fleet-ha"
PW_STEPS, PW_STEP_S = 300, 0.1  # 30 s of "training"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
TAKEOVER_LIMIT_S = 30.0


def spawn(home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "controller.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--cloud", "local",
             "--executor", "local", "--id", FLEET, "--port", "0", "--tick", "0.2"],
            env={**os.environ, **env, "SPOTRAIN_HOME": str(home)}, stdout=subprocess.DEVNULL, stderr=log,
        )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if json.loads((home / "controller.json").read_text())["pid"] == proc.pid:
                return proc
        except (OSError, ValueError, KeyError):
            pass
        if proc.poll() is not None:
            raise AssertionError(f"controller exited: {(home / 'controller.log').read_text()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("controller did not start")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"SPOTRAIN_HOME": str(home)})


def job_status(home: Path, job_id: str) -> dict[str, Any]:
    r = cli(home, "status", job_id, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(out, dict)
    return out


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(240)
def test_the_standby_takes_over_when_the_leader_is_sigkilled(spotrain_home: Path, tmp_path: Path, postgres_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fleet_dir = tmp_path / "fleet"
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    env = {"SPOTRAIN_DB_URL": postgres_url, "SPOTRAIN_FLEET_DIR": str(fleet_dir),
           "PW_STEPS": str(PW_STEPS), "PW_STEP_S": str(PW_STEP_S)}
    for k, v in env.items():  # for the CLI calls too (support.run_cli passes os.environ on)
        monkeypatch.setenv(k, v)
    engine = create_engine(postgres_url)
    leader = standby = None
    try:
        leader = spawn(home_a, env)
        standby = spawn(home_b, env)
        lease = read_lease(engine, FLEET)
        assert lease is not None and lease["holder_info"]["pid"] == leader.pid, lease
        deadline = time.time() + 10  # it says so on stderr right after it recorded its address
        while "standby: fleet" not in (home_b / "controller.log").read_text():
            assert time.time() < deadline, (home_b / "controller.log").read_text()[-2000:]
            time.sleep(0.05)

        roles = [json.loads(cli(h, "controller", "status", "--json").stdout)["role"] for h in (home_a, home_b)]
        assert roles == ["leader", "standby"], roles  # `spotrain controller status` says which is which

        # Writes at the standby go to the database; the leader picks the job up.
        # One worker, so that no rescale can have the gang between attempts when the leader is killed.
        r = cli(home_b, "submit", str(write_pw_spec(tmp_path, name="ha", workers="{min: 1, max: 1}")), "--json")
        assert r.returncode == 0, r.stderr
        job_id = json.loads(r.stdout.strip().splitlines()[-1])["job_id"]
        deadline = time.time() + 90
        info = job_status(home_b, job_id)  # the standby serves reads from the shared database
        while not (info["state"] == "RUNNING" and (info.get("step") or 0) >= 20):
            assert time.time() < deadline and info["state"] not in TERMINAL, info
            time.sleep(0.2)
            info = job_status(home_b, job_id)
        step_at_kill = info["step"]
        logs = cli(home_b, "logs", job_id)
        assert logs.returncode == 0 and f"== events of {job_id}" in logs.stdout

        leader.send_signal(signal.SIGKILL)
        killed_at = time.time()
        leader.wait()
        assert worker_pids(str(PROTOCOL_WORKER), str(home_a)), "the workers outlive their controller"
        # Taken over: the standby holds the lease and has recovered (it logs so before its first tick).
        leading = f"leading fleet {FLEET} (epoch 2)"
        while True:
            lease = read_lease(engine, FLEET)
            assert lease is not None
            if lease["holder_info"].get("pid") == standby.pid and leading in (home_b / "controller.log").read_text():
                break
            assert time.time() - killed_at < TAKEOVER_LIMIT_S, f"no takeover within {TAKEOVER_LIMIT_S:g} s: {lease}"
            time.sleep(0.1)
        takeover_s = time.time() - killed_at
        assert lease["epoch"] == 2, lease
        assert json.loads(cli(home_b, "controller", "status", "--json").stdout)["role"] == "leader"

        deadline = time.time() + 120
        info = job_status(home_b, job_id)
        while info["state"] not in TERMINAL:
            assert time.time() < deadline, info
            time.sleep(0.3)
            info = job_status(home_b, job_id)
        assert info["state"] == "SUCCEEDED", info
        assert info["step"] == PW_STEPS and Path(info["final_model"].removeprefix("file://")).is_file(), info
        logs = cli(home_b, "logs", job_id)  # events, and the output of workers the old leader started
        assert logs.returncode == 0 and "controller-restart" in logs.stdout and "== worker output: attempt 1" in logs.stdout
    finally:
        stop(standby)
        stop(leader)

    # The cloud's record: one instance per decision at most, each one the database knows as launched,
    # none left running, and no worker process left.
    cloud = json.loads((fleet_dir / "localcloud" / FLEET / "cloud" / "cloud.json").read_text())
    instances = list(cloud["instances"].values())
    per_decision = Counter(i["tags"].get(TAG_DECISION) for i in instances)
    twice = {d: n for d, n in per_decision.items() if n > 1}
    assert None not in per_decision and twice == {}, per_decision
    with engine.begin() as conn:
        statuses = dict(conn.execute(text("SELECT status, COUNT(*) FROM decisions GROUP BY status")).all())
        launched = dict(conn.execute(text("SELECT decision_id, instance_id FROM decisions WHERE status = 'launched'")).all())
        adopted = conn.execute(text("SELECT COUNT(*) FROM events WHERE kind = 'adopted'")).scalar_one()
        restarts = conn.execute(text("SELECT COUNT(*) FROM events WHERE kind = 'controller-restart'")).scalar_one()
    engine.dispose()
    assert statuses.get("pending", 0) == 0, statuses
    assert {i["tags"][TAG_DECISION]: i["instance_id"] for i in instances} == launched
    still_up = [i["instance_id"] for i in instances if i["state"] != "terminated"]
    assert still_up == [], still_up
    assert_no_workers(str(PROTOCOL_WORKER), str(home_a))
    assert_no_workers(str(PROTOCOL_WORKER), str(home_b))
    figures = {"takeover_s": round(takeover_s, 2), "lease_ttl_s": 10.0, "step_at_kill": step_at_kill,
               "instances": len(instances), "decisions": sum(statuses.values()),
               "decisions_failed": statuses.get("failed", 0), "adopted_events": adopted,
               "recoveries_noted": restarts, "decisions_launched_twice": len(twice),
               "instances_left_running": len(still_up)}
    print(f"\nfailover on PostgreSQL: the standby took over {takeover_s:.1f} s after the leader's SIGKILL")
    print(json.dumps(figures))
