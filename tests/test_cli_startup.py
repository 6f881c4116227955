"""``status``, ``logs``, ``cancel`` and ``attach`` without a controller import nothing heavy (issue 13: < 0.5 s),
nor does ``status`` with one (issue 24: within 1.5x of ``--help``; no httpx, no SSL context, no pydantic).

Checked on the import graph, not the clock (a timed test flakes on a loaded machine): each command
runs in a fresh interpreter against a database holding one job, and what it imported is read from
``sys.modules`` at exit. ``benchmarks/cli_startup.py`` prints the wall times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.home import db_url
from autoscaler.state import Event, Job, Store
from support import start_controller

HEAVY = {"scipy", "numpy", "torch", "pandas", "sqlalchemy", "httpx", "httpcore", "trio", "anyio",
         "autoscaler.controller", "autoscaler.policy", "fastapi", "yaml", "pydantic"}
PROBE = """
import atexit, json, runpy, sys
def report():
    sys.stderr.write("\\nMODULES=" + json.dumps(sorted(sys.modules)) + "\\n")
atexit.register(report)
sys.argv = ["spotrain"] + json.loads(sys.argv[1])
runpy.run_module("autoscaler.cli.main", run_name="__main__")
"""


@pytest.fixture()
def one_job(spotrain_home: Path) -> str:
    store = Store(db_url())
    spec = {"name": "j", "run": "true", "resources": {"accelerators": ["T4:1"]}, "objective": {"deadline": "7200s"}}
    with store.session() as s:
        s.add(Job(job_id="j-1", name="j", controller_id="c", cloud="local", spec_json=json.dumps(spec), workdir="/",
                  checkpoint_uri="file:///x", state="FAILED", reason="user code failed\n    Traceback (x)\n    E: e",
                  submitted_at=1000.0, submitted_clock_s=0.0, finished_at=1100.0, finished_clock_s=100.0))
        s.add(Event(job_id="j-1", ts=1100.0, kind="state", from_state="RUNNING", to_state="FAILED",
                    reason="user code failed"))
        s.commit()
    return "j-1"


def imported(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(args))], capture_output=True, text=True,
                       env=dict(os.environ), timeout=60)
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("MODULES="))
    return r, set(json.loads(line[len("MODULES="):]))


@pytest.mark.parametrize("args", [("status",), ("status", "j-1"), ("status", "--json"), ("logs", "j-1"),
                                  ("cancel", "j-1"), ("status", "nope"), ("attach", "j-1")])
def test_status_logs_and_cancel_import_nothing_heavy(one_job: str, args: tuple[str, ...]) -> None:
    r, modules = imported(*args)
    heavy = sorted(m for m in modules if m in HEAVY or m.split(".")[0] in HEAVY)
    assert heavy == [], (args, heavy)
    if args == ("status", "--json"):
        [job] = json.loads(r.stdout.strip().splitlines()[-1])
        assert job["job_id"] == "j-1" and job["deadline_met"] is False
        assert job["reason"] == "user code failed" and job["error_tail"] == "Traceback (x)\nE: e"
    elif args[0] == "logs":
        assert "RUNNING -> FAILED" in r.stdout and "user code failed" in r.stdout
    elif args == ("status", "nope"):
        assert r.returncode == 5 and "no job 'nope'" in r.stderr
    elif args[0] == "cancel":  # an ended job, from the database (issue 24): nothing to cancel
        assert r.returncode == 0 and r.stdout.strip() == "j-1: FAILED (it had already ended)", (r.stdout, r.stderr)
    elif args[0] == "attach":  # an ended job, from the database (issue 24)
        assert r.returncode == 1 and "job         j-1  (FAILED)" in r.stdout


def test_offline_status_matches_the_controllers_summary(one_job: str) -> None:
    """The sqlite3 reader and the SQLAlchemy store give the same JSON."""
    from autoscaler.cli.offline import offline_summaries
    from autoscaler.jobs.summary import job_summary

    store = Store(db_url())
    with store.session() as s:
        row = store.job(s, one_job)
        assert row is not None
        via_store = job_summary(row, store.instances(s, one_job), now=0.0).to_json_dict()
    via_sqlite = offline_summaries(db_url(), one_job)
    assert via_sqlite == via_store


def test_a_fresh_home_has_no_jobs(spotrain_home: Path) -> None:
    r, modules = imported("status")
    assert r.returncode == 0 and r.stdout.strip() == "no jobs" and "sqlalchemy" not in modules


def test_status_with_a_controller_imports_nothing_heavy(one_job: str, spotrain_home: Path) -> None:
    """``status`` asks the controller over the standard library's HTTP and prints the API's JSON as it
    came: no httpx (its import and SSL context were ~0.8 s of a 0.47 s idle, 2-3 s loaded, status) and
    no pydantic, yet the same JSON as the database gives."""
    offline = imported("status", "--json")[0].stdout.strip().splitlines()[-1]
    proc = start_controller(spotrain_home)
    try:
        for args in (("status",), ("status", "j-1"), ("status", "--json"), ("status", "j-1", "--json"),
                     ("status", "--all", "--json")):
            r, modules = imported(*args)
            assert r.returncode == 0, (args, r.stderr[-2000:])
            assert "autoscaler.client.plainhttp" in modules, args  # it did ask the controller
            heavy = sorted(m for m in modules if m in HEAVY or m.split(".")[0] in HEAVY)
            assert heavy == [], (args, heavy)
            if args == ("status", "--json"):
                assert json.loads(r.stdout.strip().splitlines()[-1]) == json.loads(offline)  # 0.0 == 0
            elif args == ("status", "j-1", "--json"):
                assert json.loads(r.stdout.strip().splitlines()[-1]) == json.loads(offline)[0]
            else:
                assert "j-1" in r.stdout and "FAILED" in r.stdout
        r, _ = imported("status", "nope")
        assert r.returncode == 5 and "no job 'nope'" in r.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
