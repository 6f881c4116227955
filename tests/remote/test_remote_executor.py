"""The controller's side: RemoteExecutor (the Executor contract over agent reports), the agents' HTTP
endpoints and their credentials, the provider overlay, and an agent talking to the real endpoints."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from autoscaler.remote.executor import (
    AgentGatedProvider,
    RemoteExecutor,
    agent_credential,
    agent_db_url,
    decision_of,
    ensure_agent_token,
)
from autoscaler.state import Store
from cloud_providers.base import Billing, Instance, InstanceState, LaunchRequest, Offering
from cloud_providers.errors import ProviderError
from cloud_providers.executor import GangState, WorkerLaunch
from cloud_providers.remote.agent import Agent, ControllerChannel
from cloud_providers.remote.wire import STATE_EXITED, Report
from remote_support import JOB, FakeClock, agent_config, drive
from support import agent_signer

TOKEN = "agent-token-for-tests"


def launch(instance_id: str = "i-1", *, attempt: int = 1, ranks: Sequence[int] = (0,), run: str = "exit 0",
           cwd: str = "/tmp") -> WorkerLaunch:
    return WorkerLaunch(instance_id=instance_id, job_id=JOB, attempt=attempt, run=run, setup=None, cwd=cwd,
                        ranks=list(ranks), world_size=2, master_addr="10.0.0.1", master_port=29500,
                        env={"SPOTRAIN_JOB_ID": JOB}, log_dir="/nonexistent")


@pytest.fixture
def executor(store: Store, clock: FakeClock) -> RemoteExecutor:
    return RemoteExecutor(store, agent_token=TOKEN, lost_after_s=30.0, clock=clock, monotonic=clock)


@pytest.fixture
def client(executor: RemoteExecutor) -> TestClient:
    from autoscaler.remote.endpoints import agent_router

    app = FastAPI()
    app.include_router(agent_router(executor))
    return TestClient(app)


def auth(decision_id: str, token: str = TOKEN) -> Any:
    """Signs a request as the agent of ``decision_id`` does (with a credential of ``token``)."""
    return agent_signer(agent_credential(token, decision_id))


# ----- credentials and storage -----
def test_a_credential_is_bound_to_one_decision_and_one_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cred = agent_credential(TOKEN, "d-1")
    assert decision_of(TOKEN, cred) == "d-1"
    assert decision_of("other-token", cred) is None
    assert decision_of(TOKEN, cred.replace("d-1:", "d-2:")) is None
    assert decision_of(TOKEN, "no-separator") is None
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path))
    token = ensure_agent_token()
    assert ensure_agent_token() == token and len(token) >= 32
    assert (tmp_path / "agent-token").stat().st_mode & 0o777 == 0o600
    from autoscaler.home import ensure_token

    assert ensure_token() != token  # the user API token is another secret


def test_agent_tables_live_beside_a_sqlite_file_or_in_a_server_database() -> None:
    assert agent_db_url("sqlite:////var/x/spotrain.db") == "sqlite:////var/x/spotrain-agents.db"
    assert agent_db_url("postgresql://u@h/db") == "postgresql://u@h/db"
    with pytest.raises(ValueError, match="database file"):
        agent_db_url("sqlite://")


# ----- the Executor contract -----
def test_status_follows_the_agents_reports(executor: RemoteExecutor, clock: FakeClock) -> None:
    assert executor.status("i-1", 1).state is GangState.ABSENT
    executor.start(launch())
    executor.start(launch())  # idempotent
    assert executor.status("i-1", 1).state is GangState.RUNNING  # assigned, agent not there yet
    executor.record_report("i-1", Report(attempt=1, state="running", exit_codes={}))
    clock.now += 20
    executor.record_report("i-1", Report(attempt=1, state="running", exit_codes={0: 85}))
    st = executor.status("i-1", 1)
    assert (st.state, dict(st.exit_codes)) == (GangState.RUNNING, {0: 85})
    executor.record_report("i-1", Report(attempt=1, state="exited", exit_codes={0: 85}))
    assert executor.status("i-1", 1).state is GangState.EXITED
    # A new attempt: the old report says nothing about it; the agent going silent makes it LOST.
    executor.start(launch(attempt=2))
    assert executor.status("i-1", 2).state is GangState.RUNNING
    assert executor.status("i-1", 1).state is GangState.EXITED
    clock.now += 31
    assert executor.status("i-1", 2).state is GangState.LOST
    executor.record_report("i-1", Report(attempt=2, state="stopped"))
    assert executor.status("i-1", 2).state is GangState.LOST


def test_a_controller_restart_does_not_make_agents_look_lost(store: Store, clock: FakeClock) -> None:
    first = RemoteExecutor(store, agent_token=TOKEN, clock=clock, monotonic=clock)
    first.start(launch())
    first.record_report("i-1", Report(attempt=1, state="running"))
    clock.now += 600  # the controller was down for ten minutes
    second = RemoteExecutor(store, agent_token=TOKEN, lost_after_s=30.0, clock=clock, monotonic=clock)
    assert second.status("i-1", 1).state is GangState.RUNNING
    clock.now += 31
    assert second.status("i-1", 1).state is GangState.LOST


def test_notify_stop_and_the_assignment_an_agent_reads(executor: RemoteExecutor) -> None:
    executor.notify("i-1", {"reason": "rescale"})  # nothing assigned: nothing to tell
    assert executor.assignment("i-1").launch is None
    executor.start(launch(ranks=[0, 1]))
    executor.notify("i-1", {"reason": "preemption", "deadline_unix_s": 5.0})
    executor.notify("i-1", {"reason": "rescale"})  # the first notice of an attempt stands
    a = executor.assignment("i-1")
    assert a.launch is not None and (a.launch.attempt, list(a.launch.ranks), a.launch.master_port) == (1, [0, 1], 29500)
    assert a.notice == {"reason": "preemption", "deadline_unix_s": 5.0} and a.stop_attempt == 0
    executor.stop("i-1")
    executor.stop("i-1")
    assert executor.assignment("i-1").stop_attempt == 1
    executor.start(launch(attempt=2))
    a = executor.assignment("i-1")
    assert a.launch is not None and a.launch.attempt == 2 and a.notice is None and a.stop_attempt == 1


def test_progress_comes_from_the_agent_holding_rank_0_of_the_latest_attempt(executor: RemoteExecutor) -> None:
    executor.start(launch("i-1", ranks=[0]))
    executor.start(launch("i-2", ranks=[1]))
    assert executor.progress(JOB) is None
    executor.record_report("i-2", Report(attempt=1, state="running", progress={"step": 99}))
    assert executor.progress(JOB) is None  # rank 1 does not speak for the job
    executor.record_report("i-1", Report(attempt=1, state="running", progress={"step": 3}))
    assert executor.progress(JOB) == {"step": 3}
    executor.start(launch("i-2", attempt=2, ranks=[0]))
    executor.record_report("i-2", Report(attempt=2, state="running", progress={"step": 4}))
    executor.record_report("i-1", Report(attempt=1, state="exited", progress={"step": 3}))
    assert executor.progress(JOB) == {"step": 4}


def test_an_invalid_progress_record_is_ignored_and_the_last_good_one_stays(
        executor: RemoteExecutor, caplog: pytest.LogCaptureFixture) -> None:
    executor.start(launch("i-1", ranks=[0]))
    executor.record_report("i-1", Report(attempt=1, state="running", progress={"step": 3}))
    with caplog.at_level("WARNING"):
        executor.record_report("i-1", Report(attempt=1, state="running", progress={"step": "4"}))
    assert executor.progress(JOB) == {"step": 3}
    assert [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()] == [
        f"agent of i-1: progress of {JOB} ignored: progress field step: expected int, got '4'"]


def test_rendezvous_is_the_agents_address_else_the_clouds(executor: RemoteExecutor) -> None:
    with pytest.raises(ProviderError, match="no private address"):
        executor.rendezvous("i-1")
    executor.address_of = {"i-1": "10.0.0.9"}.get
    assert executor.rendezvous("i-1") == ("10.0.0.9", 29500)
    executor.record_report("i-1", Report(attempt=0, state="idle", address="192.168.1.5"))
    assert executor.rendezvous("i-1") == ("192.168.1.5", 29500)
    with pytest.raises(ValueError, match="master_port"):
        RemoteExecutor(executor.store, agent_token=TOKEN, master_port=0)


# ----- the HTTP endpoints -----
def test_agents_need_their_own_credential_and_reach_only_their_instance(client: TestClient) -> None:
    assert client.get("/v1/agent/assignment").status_code == 401
    assert client.get("/v1/agent/assignment", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401
    # The credential itself is no longer a bearer token: requests must be signed with it (finding 14).
    bearer = {"Authorization": f"Bearer {agent_credential(TOKEN, 'd-1')}"}
    assert client.get("/v1/agent/assignment", headers=bearer).status_code == 401
    assert client.get("/v1/agent/assignment", auth=auth("d-1", "stolen")).status_code == 401
    assert client.get("/v1/agent/assignment", auth=auth("d-9")).status_code == 404  # not launched yet
    r = client.get("/v1/agent/assignment", params={"instance_id": "i-2"}, auth=auth("d-1"))
    assert r.status_code == 403  # d-1 launched i-1
    assert client.get("/v1/agent/assignment", auth=auth("d-3")).status_code == 410  # i-3 is terminated
    r = client.get("/v1/agent/assignment", auth=auth("d-1"))
    assert r.status_code == 200 and r.json() == {"instance_id": "i-1", "launch": None, "notice": None, "stop_attempt": 0}
    bad = client.post("/v1/agent/report", json={"attempt": 1, "state": "dancing"}, auth=auth("d-1"))
    assert bad.status_code == 422 and "state: 'dancing'" in bad.text


def test_a_report_answers_with_the_assignment(client: TestClient, executor: RemoteExecutor) -> None:
    executor.start(launch("i-2", ranks=[1]))
    r = client.post("/v1/agent/report", auth=auth("d-2"),
                    json=Report(attempt=1, state="exited", exit_codes={1: 0}, instance_id="i-2").to_json())
    assert r.status_code == 200 and r.json()["launch"]["ranks"] == [1]
    st = executor.status("i-2", 1)
    assert (st.state, dict(st.exit_codes)) == (GangState.EXITED, {1: 0})


def test_an_agent_runs_its_ranks_through_the_real_endpoints(
    tmp_path: Path, executor: RemoteExecutor, client: TestClient
) -> None:
    """The agent and the controller's endpoints end to end (in-process HTTP), with real rank processes."""
    config = agent_config(tmp_path, decision_id="d-1", agent_credential=agent_credential(TOKEN, "d-1"),
                          instance_id=None, advertise_address="127.0.0.1")
    agent = Agent(config, channel=ControllerChannel(config, http=client), sources=[])
    drive(agent, lambda: executor.seen(["i-1"]) != {})
    assert executor.rendezvous("i-1") == ("127.0.0.1", 29500)
    run = 'echo "{\\"step\\": 7}" > "$SPOTRAIN_PROGRESS_FILE"; exit 0'
    executor.start(launch("i-1", ranks=[0], run=run, cwd=str(tmp_path)))
    drive(agent, lambda: executor.status("i-1", 1).state is GangState.EXITED)
    assert dict(executor.status("i-1", 1).exit_codes) == {0: 0}
    assert executor.progress(JOB) == {"step": 7}
    assert agent.state() == STATE_EXITED


# ----- the provider overlay -----
class FakeProvider:
    """A cloud whose instances the test sets directly."""

    name = "aws"

    def __init__(self) -> None:
        self.instances: dict[str, Instance] = {}
        self.changed: list[Instance] = []
        self.terminated: list[str] = []

    def now_s(self) -> float:
        return 1000.0

    def offerings(self) -> Sequence[Offering]:
        return []

    def launch(self, request: LaunchRequest) -> Instance:
        raise NotImplementedError

    def terminate(self, instance_id: str) -> None:
        self.terminated.append(instance_id)
        self.instances[instance_id] = dataclasses.replace(self.instances[instance_id], state=InstanceState.TERMINATED)

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        return list(self.instances.values())

    def poll(self) -> Sequence[Instance]:
        out, self.changed = self.changed, []
        return out

    def billing(self, instance: Instance) -> Billing:
        return Billing(0.0, 0.0, 0.0)

    def set(self, inst: Instance) -> None:
        self.instances[inst.instance_id] = inst
        self.changed.append(inst)

    def extra(self) -> str:
        return "passed through"


def instance(instance_id: str, state: InstanceState = InstanceState.RUNNING, launched_at_s: float = 900.0) -> Instance:
    return Instance(instance_id=instance_id, cloud="aws", region="us-east-1", zone="us-east-1a",
                    instance_type="g4dn.xlarge", market="spot", state=state, tags={}, launched_at_s=launched_at_s,
                    address="10.0.0.3")


def test_the_overlay_gates_on_check_in_and_relays_the_agents_notice(executor: RemoteExecutor) -> None:
    cloud = FakeProvider()
    gated = AgentGatedProvider(cloud, executor, boot_timeout_s=300.0)
    assert gated.extra() == "passed through" and gated.name == "aws"
    cloud.set(instance("i-1"))
    cloud.set(instance("i-2", launched_at_s=0.0))  # launched long ago; its agent never checked in
    states = {i.instance_id: i.state for i in gated.poll()}
    assert states == {"i-1": InstanceState.PENDING, "i-2": InstanceState.TERMINATED}
    assert cloud.terminated == ["i-2"]
    assert gated.address_of("i-1") == "10.0.0.3"
    assert gated.poll() == []  # nothing new
    executor.record_report("i-1", Report(attempt=0, state="idle"))
    (changed,) = gated.poll()
    assert changed.state is InstanceState.RUNNING
    executor.record_report("i-1", Report(attempt=0, state="idle",
                                         notice={"reason": "preemption", "source": "aws-imds", "deadline_unix_s": 1100.0}))
    (changed,) = gated.poll()
    assert (changed.state, changed.interruption, changed.notice_deadline_s) == (InstanceState.NOTICE, "preemption", 1100.0)
    assert [i.state for i in gated.list_instances({})] == [InstanceState.NOTICE, InstanceState.TERMINATED]
    cloud.set(dataclasses.replace(instance("i-1"), state=InstanceState.TERMINATED, interruption="preemption"))
    (changed,) = gated.poll()
    assert changed.state is InstanceState.TERMINATED
    assert gated.poll() == []


def test_make_cloud_rejects_a_remote_executor_without_a_real_cloud(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoscaler.fleet.clouds import make_cloud

    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "home"))

    with pytest.raises(ValueError, match="real cloud"):
        make_cloud("local", cloud_id="c", executor="remote", store=store, advertise_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="advertised URL"):
        make_cloud("aws", cloud_id="c", executor="remote", store=store)
    with pytest.raises(ValueError, match="--advertise-url: 'ftp://x'"):
        make_cloud("aws", cloud_id="c", executor="remote", store=store, advertise_url="ftp://x")
    assert not (tmp_path / "home" / "agent-token").exists()  # checked before any secret is made
    with pytest.raises(ValueError, match="unknown executor"):
        make_cloud("aws", cloud_id="c", executor="ssh")
