"""``spotrain controller start --cloud gcp`` and ``make_provider``: credentials checked once, one-line errors
(no credentials, no SDK, no stand-in endpoint for --executor local), and a preemption while the controller is
down. A controller serving on the fake, from start-up and recovery on, is in ``test_gcp_remote.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_packaging import run_blocked

from autoscaler.controller import Controller
from autoscaler.home import db_url
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.state import Store
from cloud_providers.errors import CredentialsError
from cloud_providers.gcp import RetryPolicy, make_provider
from cloud_providers.local.executor import LocalExecutor
from support import PROTOCOL_WORKER, REPO, worker_pids, write_pw_spec

from .fake_compute import FakeCompute

pytestmark = pytest.mark.gcp

NO_CREDENTIALS = {"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/spotrain-test-key.json",
                  "CLOUDSDK_CONFIG": "/nonexistent/gcloud", "GCE_METADATA_HOST": "127.0.0.1:9",
                  "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "True"}


def _controller_start(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRAIN_GCP_", "GOOGLE_"))}
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--cloud", "gcp", "--port", "0", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**clean, "SPOTRAIN_HOME": str(tmp_path / "home"), **env},
    )


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spotrain: "), res.stderr
    return lines[0]


def test_missing_credentials_are_one_line_at_start(tmp_path: Path) -> None:
    line = _one_line(_controller_start(tmp_path, "--executor", "remote", env={
        **NO_CREDENTIALS, "SPOTRAIN_GCP_PROJECT": "p"}))
    assert "gcp: GCP credentials not found" in line and "gcloud auth application-default login" in line


def test_local_executor_needs_a_stand_in_endpoint(tmp_path: Path) -> None:
    line = _one_line(_controller_start(tmp_path, env={"SPOTRAIN_GCP_PROJECT": "p"}))
    assert "SPOTRAIN_GCP_ENDPOINT" in line and "--executor remote" in line


def test_without_the_sdk_gcp_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    res = run_blocked("""
        import sys
        from autoscaler.cli.main import main
        sys.exit(main(["controller", "start", "--cloud", "gcp", "--port", "0"]))
    """, env={"SPOTRAIN_HOME": str(tmp_path / "home"), "SPOTRAIN_GCP_ENDPOINT": "http://127.0.0.1:9",
              "SPOTRAIN_GCP_PROJECT": "p"})
    line = _one_line(res)
    assert "pip install 'spotrain[gcp]'" in line


def test_make_provider_checks_credentials_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in NO_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SPOTRAIN_GCP_ENDPOINT", raising=False)
    with pytest.raises(CredentialsError) as info:
        make_provider(controller_id="c", project="p")
    assert "\n" not in str(info.value)


def test_make_provider_rejects_bad_settings(gcp_fake_env: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown GCP provider setting"):
        make_provider(controller_id="c", region="us-central1")
    with pytest.raises(ValueError, match="controller_id"):
        make_provider()
    with pytest.raises(ValueError, match="must be http"):
        make_provider(controller_id="c", endpoint="127.0.0.1:9")
    with pytest.raises(ValueError, match="not zones of regions"):
        make_provider(controller_id="c", regions="us-east1", zones="us-central1-a")
    monkeypatch.setenv("SPOTRAIN_GCP_SPOT_PRICES", "[1, 2]")
    with pytest.raises(ValueError, match="SPOTRAIN_GCP_SPOT_PRICES"):
        make_provider(controller_id="c")
    monkeypatch.setenv("SPOTRAIN_GCP_SPOT_PRICES", '{"g2-standard-4": 0.25}')
    monkeypatch.delenv("SPOTRAIN_GCP_PROJECT")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    with pytest.raises(ValueError, match="SPOTRAIN_GCP_PROJECT"):
        make_provider(controller_id="c")


def _controller(cid: str, fake: FakeCompute, root: Path) -> Controller:
    """A controller as ``controller start --cloud gcp --executor local`` builds it, in this process."""
    provider = make_provider(controller_id=cid, endpoint=fake.endpoint, project=fake.project, zones=list(fake.zones),
                             retry=RetryPolicy(max_attempts=2, sleep=lambda _s: None))
    return Controller(store=Store(db_url()), provider=provider, executor=LocalExecutor(root), policy=get_policy(),
                      controller_id=cid, tick_s=0.1)


def _tick_until(ctl: Controller, job_id: str, done: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.time() + timeout_s
    job = ctl.job_info(job_id)
    while not done(job) and time.time() < deadline:
        ctl.tick()
        job = ctl.job_info(job_id)
        time.sleep(0.1)
    return job


@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_a_preemption_while_the_controller_is_down_counts_as_one(spotrain_home: Path, tmp_path: Path,
                                                                  gcp_fake_wall: FakeCompute,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Compute preempts and deletes the job's Spot VM while no controller runs; the next controller's
    recovery counts a preemption (ended with its notice), not a lost instance, and the job resumes.
    The controllers run in this process: the first is dropped as a crash would leave it (nothing shut
    down, only the database and the executor's directory survive), the second starts from those."""
    monkeypatch.setenv("PW_STEPS", "60")
    monkeypatch.setenv("PW_STEP_S", "0.05")
    cid = f"down-{uuid.uuid4().hex[:6]}"
    first = _controller(cid, gcp_fake_wall, tmp_path / "executor")
    first.recover()
    spec, workdir = load_spec(write_pw_spec(tmp_path, name="down", workers="{min: 1, max: 1}"))
    job_id = first.submit(spec, workdir)["job_id"]
    job = _tick_until(first, job_id, lambda j: j["state"] == "RUNNING" and j["workers"] and (j.get("step") or 0) >= 3, 30)
    assert job["state"] == "RUNNING" and job["workers"], job
    del first  # the controller dies; its workers run on, on their VM
    name = str(job["workers"][0]["instance_id"])
    preempted_at = time.time()
    gcp_fake_wall.preempt(name, complete=True)
    for pid in worker_pids(str(PROTOCOL_WORKER), str(spotrain_home)):  # they died with the VM
        os.kill(pid, signal.SIGKILL)
    second = _controller(cid, gcp_fake_wall, tmp_path / "executor")
    counts = second.recover()
    with second.store.session() as s:
        (row,) = [r for r in second.store.instances(s, job_id) if r.instance_id == name]
        assert row.interruption == "preemption" and row.terminated_at_s is not None
        assert row.terminated_at_s <= preempted_at + 30 + 1  # ended with its notice, not at the restart
    job = _tick_until(second, job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), 60)
    assert job["state"] == "SUCCEEDED" and job["step"] == 60, job
    assert job["preemptions"] == 1 and job["attempts"] >= 2, (job, counts)
    with second.store.session() as s:
        reasons = [e.reason for e in second.store.events(s, job_id)]
    assert f"{name} terminated (preemption) while the controller was down" in reasons, reasons
    assert [i["name"] for i in gcp_fake_wall.instances()] == []
    assert worker_pids(str(PROTOCOL_WORKER), str(spotrain_home)) == []
