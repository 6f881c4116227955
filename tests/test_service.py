"""The controller as a service: real HTTP between CLI and controller, token auth, crash recovery."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support import PROTOCOL_WORKER, assert_no_workers, run_cli, start_controller, worker_pids, write_pw_spec


def last_json(out: str) -> object:
    return json.loads(out.strip().splitlines()[-1])


def wait_state(job_id: str, states: set[str], timeout_s: float = 60) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = run_cli("status", job_id, "--json")
        assert r.returncode == 0, r.stderr
        job = last_json(r.stdout)
        assert isinstance(job, dict)
        if job["state"] in states:
            return job
        time.sleep(0.3)
    raise AssertionError(f"{job_id} never reached {states}")


@pytest.mark.e2e
def test_sigkilled_controller_recovers_and_job_finishes(spotrain_home: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_STEPS", "400")
    monkeypatch.setenv("PW_STEP_S", "0.05")
    ctl = start_controller(spotrain_home)
    try:
        token = spotrain_home / "token"
        assert token.stat().st_mode & 0o777 == 0o600
        r = run_cli("submit", str(write_pw_spec(tmp_path)), "--json")
        assert r.returncode == 0, r.stderr
        job = last_json(r.stdout)
        assert isinstance(job, dict)
        assert {"job_id", "name", "state", "preemptions", "cost_usd", "on_demand_cost_usd", "metric", "final_model"} <= set(job)
        job_id = job["job_id"]
        running = wait_state(job_id, {"RUNNING"})
        assert running["workers"]
        # Wide enough for the WORKERS summary of two zones (at 80 columns it reads "2 workers").
        table = run_cli("status", env={"COLUMNS": "200"})
        assert table.returncode == 0 and job_id in table.stdout and "spot" in table.stdout, table.stdout

        ctl.send_signal(signal.SIGKILL)
        ctl.wait()
        assert worker_pids(str(PROTOCOL_WORKER)), "workers must outlive the controller"
        # With no controller, status still answers from SPOTRAIN_HOME.
        offline = run_cli("status", job_id, "--json")
        assert offline.returncode == 0 and last_json(offline.stdout)["job_id"] == job_id  # type: ignore[index]

        ctl = start_controller(spotrain_home)
        done = wait_state(job_id, {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"})
        assert done["state"] == "SUCCEEDED", done
        assert done["final_model"]
        assert_no_workers(str(PROTOCOL_WORKER))
        logs = run_cli("logs", job_id)
        assert logs.returncode == 0 and "controller-restart" in logs.stdout and "SUCCEEDED" in logs.stdout

        # A wrong token is refused with one line.
        bad = run_cli("status", env={"SPOTRAIN_TOKEN": "wrong"})
        assert bad.returncode != 0 and "refused the API token" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    finally:
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=10)
        except subprocess.TimeoutExpired:
            ctl.kill()


@pytest.mark.e2e
def test_cancel_over_http(spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_STEPS", "100000")
    ctl = start_controller(spotrain_home)
    try:
        job = last_json(run_cli("submit", str(write_pw_spec(tmp_path)), "--json").stdout)
        assert isinstance(job, dict)
        wait_state(job["job_id"], {"RUNNING"})
        dup = run_cli("submit", str(write_pw_spec(tmp_path)))
        assert dup.returncode != 0 and "already exists" in dup.stderr
        r = run_cli("cancel", job["job_id"])
        assert r.returncode == 0 and "CANCELLED" in r.stdout
        assert_no_workers(str(PROTOCOL_WORKER))
        missing = run_cli("cancel", "no-such-job")
        assert missing.returncode != 0 and "no job" in missing.stderr
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(timeout=10)
    assert not (spotrain_home / "controller.json").exists()


def test_unreachable_controller_is_one_line(spotrain_home: Path, tmp_path: Path) -> None:
    r = run_cli("submit", str(write_pw_spec(tmp_path)), env={"SPOTRAIN_CONTROLLER_URL": "http://127.0.0.1:9"})
    assert r.returncode != 0
    assert "cannot reach the controller" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_a_killed_spotrain_run_is_reaped_by_the_next_one(spotrain_home: Path, tmp_path: Path) -> None:
    """SIGKILL takes the embedded controller of `spotrain run` down with it; its workers and its live
    job would stay forever (and the job's name taken). The next `spotrain run` ends that job FAILED,
    stops its workers, and runs."""
    import os
    import sys

    spec = write_pw_spec(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "run", str(spec), "--quiet"],
                         env={**os.environ, "PW_STEPS": "100000", "PW_STEP_S": "0.05"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            if worker_pids(str(PROTOCOL_WORKER)):
                break
            time.sleep(0.2)
        assert worker_pids(str(PROTOCOL_WORKER)), "the first run never started its workers"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    old = json.loads(run_cli("status", "--json").stdout.strip().splitlines()[-1])
    assert [j["state"] for j in old] in (["RUNNING"], ["PROVISIONING"], ["PENDING"]), old
    r = run_cli("run", str(spec), "--quiet", "--json", env={"PW_STEPS": "20", "PW_STEP_S": "0.02"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["state"] == "SUCCEEDED"
    jobs = {j["job_id"]: j for j in json.loads(run_cli("status", "--json").stdout.strip().splitlines()[-1])}
    first = jobs[old[0]["job_id"]]
    assert first["state"] == "FAILED" and "killed" in first["reason"], first
    deadline = time.time() + 10
    while worker_pids(str(PROTOCOL_WORKER)) and time.time() < deadline:
        time.sleep(0.2)
    assert not worker_pids(str(PROTOCOL_WORKER))


def test_metrics_need_the_token_and_a_wide_token_file_is_narrowed(spotrain_home: Path) -> None:
    import urllib.error
    import urllib.request

    token = spotrain_home / "token"
    token.write_text("sekret-token\n")
    token.chmod(0o644)
    ctl = start_controller(spotrain_home)
    try:
        url = json.loads((spotrain_home / "controller.json").read_text())["url"]
        assert token.stat().st_mode & 0o777 == 0o600
        try:
            urllib.request.urlopen(url + "/metrics", timeout=10)
            raise AssertionError("/metrics answered without the token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        req = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer sekret-token"})
        body = urllib.request.urlopen(req, timeout=10).read().decode()
        assert "spotrain_jobs" in body
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(timeout=30)
