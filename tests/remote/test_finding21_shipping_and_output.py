"""Issue 21, finding 2 (the workdir archive is built off the tick) and finding 5 (a job's output on the
controller's disk is capped and rotated), on the remote executor with its agents' endpoint."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import autoscaler.jobs.workdir as workdir_module
from autoscaler.client.logs import job_logs
from autoscaler.home import logs_dir
from autoscaler.remote.executor import RemoteExecutor, agent_credential
from autoscaler.state import Store
from cloud_providers.executor import WorkerLaunch
from cloud_providers.protocol import ENV_CHECKPOINT_URI
from cloud_providers.remote.wire import MAX_OUTPUT_CHUNK, OUTPUT_PATH
from remote_support import JOB, FakeClock
from support import agent_signer

TOKEN = "agent-token-for-tests"
ENV_JOB_LOG_MAX_MB = "SPOTRAIN_JOB_LOG_MAX_MB"


def dir_bytes(d: Path) -> int:
    return sum(f.lstat().st_size for f in d.iterdir())


@pytest.fixture
def executor(store: Store, clock: FakeClock, spotrain_home: Path) -> RemoteExecutor:
    return RemoteExecutor(store, agent_token=TOKEN, lost_after_s=30.0, clock=clock)


def launch(cwd: Path, store_uri: str) -> WorkerLaunch:
    return WorkerLaunch(instance_id="i-1", job_id=JOB, attempt=1, run="python train.py", setup=None, cwd=str(cwd),
                        ranks=[0], world_size=1, master_addr="10.0.0.1", master_port=29500,
                        env={"SPOTRAIN_JOB_ID": JOB, ENV_CHECKPOINT_URI: store_uri}, log_dir="/nonexistent")


def test_finding2_the_archive_is_built_off_the_caller_and_the_agent_waits_for_it(
        tmp_path: Path, executor: RemoteExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    release, packing = threading.Event(), threading.Event()
    real_ship = workdir_module.ship

    def slow_ship(*args: object, **kwargs: object) -> object:  # a workdir that takes long to pack
        packing.set()
        release.wait(20)
        return real_ship(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(workdir_module, "ship", slow_ship)
    started = threading.Thread(target=executor.start, args=(launch(code, f"file://{tmp_path / 'store' / JOB}"),),
                               daemon=True)
    t0 = time.perf_counter()
    started.start()
    started.join(5)
    try:
        assert not started.is_alive(), "start (the tick) waited while the workdir was packed"
        assert time.perf_counter() - t0 < 5
        assert packing.wait(5)
        assert executor.assignment("i-1").launch is None  # the agent waits for the archive
    finally:
        release.set()
    executor.shipper.wait(JOB, 20)
    la = executor.assignment("i-1").launch
    assert la is not None and la.workdir is not None and set(la.workdir) == {"uri", "sha256", "size"}
    # Stored with the launch: a restarted controller hands the same archive out without packing again.
    fresh = RemoteExecutor(executor.store, agent_token=TOKEN, lost_after_s=30.0)
    assert fresh.assignment("i-1").launch == la


def test_finding2_a_workdir_that_cannot_be_shipped_reaches_the_agent_as_its_one_line_error(
        tmp_path: Path, executor: RemoteExecutor) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "loop").symlink_to("loop")
    executor.start(launch(code, f"file://{tmp_path / 'store' / JOB}"))
    executor.shipper.wait(JOB, 20)
    la = executor.assignment("i-1").launch
    assert la is not None and la.workdir is not None
    assert "loop is a symbolic link loop" in str(la.workdir["error"]) and "\n" not in str(la.workdir["error"])


def test_finding2_a_store_that_refuses_the_archive_is_retried_then_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoscaler.remote.shipper import MAX_TRIES, PENDING, RETRY_S, WorkdirShipper
    from cloud_providers.errors import ProviderError

    calls: list[int] = []

    def refusing_ship(*_args: object, **_kwargs: object) -> object:
        calls.append(1)
        raise ProviderError("workdir: cannot put the archive at s3://b/x: AccessDenied")

    monkeypatch.setattr(workdir_module, "ship", refusing_ship)
    now = [0.0]
    shipper = WorkdirShipper(clock=lambda: now[0])
    outcomes = []
    for _ in range(MAX_TRIES):
        outcomes.append(shipper.ref(JOB, tmp_path, "s3://b/x"))
        shipper.wait(JOB, 10)
        assert shipper.ref(JOB, tmp_path, "s3://b/x") == PENDING or len(calls) == MAX_TRIES  # no retry before RETRY_S
        now[0] += RETRY_S
    assert len(calls) == MAX_TRIES and all(o == PENDING for o in outcomes)
    final = shipper.ref(JOB, tmp_path, "s3://b/x")
    assert "AccessDenied" in final["error"] and f"after {MAX_TRIES} tries" in final["error"]


def test_finding5_an_agents_output_is_capped_and_rotated_per_job(
        tmp_path: Path, executor: RemoteExecutor, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_JOB_LOG_MAX_MB, "1")
    executor.ship_workdir = False
    executor.start(launch(tmp_path, ""))
    app = FastAPI()
    from autoscaler.remote.endpoints import agent_router

    app.include_router(agent_router(executor))
    client = TestClient(app)
    auth = agent_signer(agent_credential(TOKEN, "d-1"))
    offset, sent = 0, 0
    line = b"spam " * 13 + b"\n"
    chunk = (line * (MAX_OUTPUT_CHUNK // len(line)))[:MAX_OUTPUT_CHUNK]
    for _ in range(80):  # 5 MiB, five times the job's cap
        r = client.post(OUTPUT_PATH, json={"attempt": 1, "rank": 0, "offset": offset,
                                           "data": base64.b64encode(chunk).decode()}, auth=auth)
        assert r.status_code == 200
        offset = r.json()["next_offset"]
        sent += len(chunk)
    assert offset == sent  # offsets count every byte received, rotated out or not
    on_disk = dir_bytes(logs_dir(JOB))
    assert on_disk <= 1024 * 1024 + MAX_OUTPUT_CHUNK + 4096, on_disk
    text = job_logs(store, JOB)
    assert "output rotated" in text and "SPOTRAIN_JOB_LOG_MAX_MB" in text
