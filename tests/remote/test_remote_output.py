"""Remote workers' output reaches the controller (``POST /v1/agent/output``): the agent ships each rank's
log in chunks, the controller appends them to its copy under SPOTRAIN_HOME, so ``spotrain logs`` and
``logs -f`` (``GET /v1/jobs/JOB/output``) show a remote worker's output as a local one's."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from autoscaler.client.logs import read_output
from autoscaler.remote.executor import RemoteExecutor, agent_credential
from autoscaler.state import Store
from cloud_providers.executor import GangState, WorkerLaunch
from cloud_providers.remote.agent import Agent, ControllerChannel
from cloud_providers.remote.wire import MAX_OUTPUT_CHUNK, OUTPUT_PATH, OutputChunk, WireError
from remote_support import JOB, FakeClock, agent_config, drive
from support import agent_signer

TOKEN = "agent-token-for-tests"


@pytest.fixture
def executor(store: Store, clock: FakeClock, spotrain_home: Path) -> RemoteExecutor:
    return RemoteExecutor(store, agent_token=TOKEN, lost_after_s=30.0, clock=clock, monotonic=clock)


@pytest.fixture
def client(executor: RemoteExecutor) -> TestClient:
    from autoscaler.remote.endpoints import agent_router

    app = FastAPI()
    app.include_router(agent_router(executor))
    return TestClient(app)


def launch(run: str, cwd: str, *, instance_id: str = "i-1", ranks: tuple[int, ...] = (0,)) -> WorkerLaunch:
    return WorkerLaunch(instance_id=instance_id, job_id=JOB, attempt=1, run=run, setup=None, cwd=cwd, ranks=list(ranks),
                        world_size=2, master_addr="10.0.0.1", master_port=29500, env={"SPOTRAIN_JOB_ID": JOB},
                        log_dir="/nonexistent")


def test_a_remote_ranks_output_reaches_the_controllers_log(tmp_path: Path, executor: RemoteExecutor,
                                                           client: TestClient) -> None:
    config = agent_config(tmp_path, decision_id="d-1", agent_credential=agent_credential(TOKEN, "d-1"),
                          instance_id=None, advertise_address="127.0.0.1")
    agent = Agent(config, channel=ControllerChannel(config, http=client), sources=[])
    drive(agent, lambda: executor.seen(["i-1"]) != {})
    # More than one chunk of output, then a last line.
    run = f"python3 -c \"print('x' * {MAX_OUTPUT_CHUNK + 100})\"; echo remote-line-from-rank-0"
    executor.start(launch(run, str(tmp_path)))
    drive(agent, lambda: executor.status("i-1", 1).state is GangState.EXITED)
    drive(agent, lambda: b"remote-line-from-rank-0" in read_output(JOB, attempt=1, rank=0, offset=MAX_OUTPUT_CHUNK)[0])
    copy, size = read_output(JOB, attempt=1, rank=0, offset=0)
    local = (tmp_path / "state" / "logs" / JOB / "attempt-1-rank-0.log").read_bytes()
    assert copy == local and size == len(local) > MAX_OUTPUT_CHUNK


def test_chunks_are_appended_once_and_only_for_the_callers_own_ranks(tmp_path: Path, executor: RemoteExecutor,
                                                                     client: TestClient) -> None:
    executor.start(launch("true", str(tmp_path), ranks=(0,)))

    def send(decision: str, **chunk: object) -> tuple[int, object]:
        body = {"attempt": 1, "rank": 0, "offset": 0, "data": base64.b64encode(b"hello\n").decode(), **chunk}
        r = client.post(OUTPUT_PATH, json=body, auth=agent_signer(agent_credential(TOKEN, decision)))
        return r.status_code, r.json()

    assert send("d-1") == (200, {"next_offset": 6})
    assert send("d-1") == (200, {"next_offset": 6})  # the same chunk again: not appended twice
    assert send("d-1", offset=4, data=base64.b64encode(b"o\nworld\n").decode()) == (200, {"next_offset": 12})
    assert send("d-1", offset=50)[1] == {"next_offset": 12}  # a gap: send from 12
    assert read_output(JOB, attempt=1, rank=0, offset=0)[0] == b"hello\nworld\n"
    assert send("d-1", rank=1)[0] == 422  # not a rank of i-1
    assert send("d-1", attempt=2)[0] == 422
    assert send("d-2")[0] == 422  # i-2 runs nothing of this job's attempt
    assert send("d-1", data="not base64!")[0] == 422
    with pytest.raises(WireError):
        OutputChunk(attempt=1, rank=0, offset=0, data=b"x" * (MAX_OUTPUT_CHUNK + 1))
    bad = client.post(OUTPUT_PATH, json={"attempt": 1, "rank": 0, "offset": 0, "data": ""},
                      auth=agent_signer(agent_credential("other-token", "d-1")))
    assert bad.status_code == 401
