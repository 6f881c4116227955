"""Issue 21, the agents' findings: the agent key is the fleet's (3), liveness is measured on a monotonic
clock (8), and a captured agent request cannot be replayed (14). The fleet takeover itself, with real
controllers and agents, is ``tests/reliability/test_remote_fleet_takeover.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from autoscaler.remote.executor import RemoteExecutor, agent_credential, decision_of, ensure_agent_token
from autoscaler.state import Store
from cloud_providers.executor import GangState, WorkerLaunch
from cloud_providers.remote.agent import Agent, ControllerChannel
from cloud_providers.remote.wire import REPORT_PATH, Report
from remote_support import JOB, FakeClock, agent_config, drive

TOKEN = "agent-token-for-tests"


def launch(instance_id: str = "i-1", attempt: int = 1) -> WorkerLaunch:
    return WorkerLaunch(instance_id=instance_id, job_id=JOB, attempt=attempt, run="exit 0", setup=None, cwd="/tmp",
                        ranks=[0], world_size=1, master_addr="10.0.0.1", master_port=29500,
                        env={"SPOTRAIN_JOB_ID": JOB}, log_dir="/nonexistent")


# ----- finding 3: one agent key per fleet -------------------------------------------------------------
def test_finding3_the_controllers_of_a_fleet_share_one_agent_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader and its standby (a home each, one SPOTRAIN_FLEET_DIR) issue and accept the same agent
    credentials; on main each made its own key in its home, so the standby refused every agent."""
    fleet = tmp_path / "fleet"
    monkeypatch.setenv("SPOTRAIN_FLEET_DIR", str(fleet))
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "home-a"))
    key_a = ensure_agent_token()
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "home-b"))
    key_b = ensure_agent_token()
    assert key_a == key_b and len(key_a) >= 32
    assert decision_of(key_b, agent_credential(key_a, "d-1")) == "d-1"  # the standby accepts the leader's agents
    path = fleet / "agent-token"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in fleet.iterdir()) == ["agent-token"]  # no temporary left behind


def test_finding3_controllers_starting_together_agree_on_one_key(tmp_path: Path) -> None:
    """Four controllers of one fleet making the key at once all read the first one's, whole."""
    fleet = tmp_path / "fleet"
    code = "from autoscaler.remote.executor import ensure_agent_token; print(ensure_agent_token())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "SPOTRAIN_FLEET_DIR": str(fleet),
                                   "SPOTRAIN_HOME": str(tmp_path / f"home-{n}")}) for n in range(4)]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(keys) == 1 and "" not in keys, keys
    assert (fleet / "agent-token").read_text().strip() in keys


def test_finding3_an_upgraded_controller_seeds_the_fleet_key_with_its_own(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that kept its key in its home (before the fix) keeps its agents once the fleet
    shares a key: the home's key becomes the fleet's. An empty key file is refused, not used."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agent-token").write_text("the-old-home-key\n")
    monkeypatch.setenv("SPOTRAIN_HOME", str(home))
    monkeypatch.setenv("SPOTRAIN_FLEET_DIR", str(tmp_path / "fleet"))
    assert ensure_agent_token() == "the-old-home-key"
    (tmp_path / "fleet" / "agent-token").write_text("")
    from autoscaler.errors import SpotrainError

    with pytest.raises(SpotrainError, match="is empty"):
        ensure_agent_token()


# ----- finding 8: liveness on a monotonic clock ---------------------------------------------------------
class SteppedWallClock:
    """The wall clock as the controller's clock seam gives it: the time that passes (``mono``) plus
    a step injected by the test."""

    def __init__(self, mono: FakeClock) -> None:
        self.mono = mono
        self.step_s = 0.0

    def __call__(self) -> float:
        return 1_700_000_000.0 + self.mono.now + self.step_s


def test_finding8_a_wall_clock_step_neither_loses_healthy_agents_nor_hides_a_dead_one(store: Store) -> None:
    """The executor's wall clock (its ``clock`` seam) jumps +60 s, then -1 h, while time passes on the
    monotonic seam. On main liveness compared wall times: the +60 s step made the healthy agent LOST
    at once, and after the -1 h step a dead agent stayed RUNNING for an hour."""
    mono = FakeClock()
    wall = SteppedWallClock(mono)
    executor = RemoteExecutor(store, agent_token=TOKEN, lost_after_s=1.0, clock=wall, monotonic=mono)
    executor.start(launch("i-1"))
    executor.start(launch("i-2"))
    executor.record_report("i-1", Report(attempt=1, state="running"))
    executor.record_report("i-2", Report(attempt=1, state="running"))
    assert executor.status("i-1", 1).state is GangState.RUNNING
    wall.step_s = 60.0  # NTP steps the clock forward
    executor.record_report("i-1", Report(attempt=1, state="running"))  # i-1 keeps reporting
    assert executor.status("i-1", 1).state is GangState.RUNNING
    assert executor.status("i-2", 1).state is GangState.RUNNING  # i-2 went silent just now
    wall.step_s = -3600.0  # and back an hour
    mono.now += 1.2  # i-2 stays silent for longer than lost_after_s
    executor.record_report("i-1", Report(attempt=1, state="running"))
    assert executor.status("i-1", 1).state is GangState.RUNNING
    assert executor.status("i-2", 1).state is GangState.LOST


def test_finding8_silence_is_counted_on_the_monotonic_seam(store: Store) -> None:
    """The same on fake clocks: only the monotonic one decides, and a report taken by another
    controller of the fleet (a changed row) counts as heard."""
    wall, mono = FakeClock(), FakeClock()
    executor = RemoteExecutor(store, agent_token=TOKEN, lost_after_s=30.0, clock=wall, monotonic=mono)
    other = RemoteExecutor(store, agent_token=TOKEN, lost_after_s=30.0, clock=wall, monotonic=mono)
    executor.start(launch("i-1"))
    assert executor.status("i-1", 1).state is GangState.RUNNING
    wall.now += 10_000  # the wall clock alone moves: nothing changes
    assert executor.status("i-1", 1).state is GangState.RUNNING
    mono.now += 20
    other.record_report("i-1", Report(attempt=1, state="running"))  # through the fleet's other controller
    mono.now += 20  # 40 s after the assignment, but the row changed: heard now
    assert executor.status("i-1", 1).state is GangState.RUNNING
    wall.now -= 7_200
    mono.now += 29
    assert executor.status("i-1", 1).state is GangState.RUNNING
    mono.now += 2
    assert executor.status("i-1", 1).state is GangState.LOST


# ----- finding 14: replayed agent requests ---------------------------------------------------------------
def test_finding14_a_captured_signed_report_cannot_be_replayed(tmp_path: Path, store: Store) -> None:
    """A real agent reports through the real endpoints; its report request, captured on the wire
    (headers and body as sent), is sent again: refused (409), and nothing it says is taken. On main
    the same replay was taken (200): the bearer credential in the request was all it checked."""
    from autoscaler.remote.endpoints import agent_router

    executor = RemoteExecutor(store, agent_token=TOKEN)
    app = FastAPI()
    app.include_router(agent_router(executor))
    captured: list[httpx.Request] = []
    agent_http = TestClient(app)
    agent_http.event_hooks = {"request": [lambda r: captured.append(r) if r.url.path == REPORT_PATH else None],
                              "response": []}
    config = agent_config(tmp_path, decision_id="d-1", agent_credential=agent_credential(TOKEN, "d-1"),
                          instance_id=None, advertise_address="127.0.0.1")
    agent = Agent(config, channel=ControllerChannel(config, http=agent_http), sources=[])
    drive(agent, lambda: executor.seen(["i-1"]) != {})
    first = captured[0]
    seen_before = executor.seen(["i-1"])["i-1"].reported_at

    attacker = TestClient(app)
    replay = attacker.send(httpx.Request(first.method, str(first.url), headers=dict(first.headers), content=first.content))
    assert replay.status_code == 409, replay.text
    assert executor.seen(["i-1"])["i-1"].reported_at == seen_before  # nothing of the replay was recorded
    # Nor can the body be changed under the captured signature (a new counter needs the credential).
    forged = first.content.replace(b'"idle"', b'"exited"')
    r = attacker.send(httpx.Request(first.method, str(first.url), headers=dict(first.headers), content=forged))
    assert r.status_code == 401, r.text
    # The agent itself goes on: its next requests carry higher counters.
    drive(agent, lambda: executor.seen(["i-1"])["i-1"].reported_at != seen_before, timeout_s=5)


def test_finding14_an_agent_that_lost_its_counter_catches_up(tmp_path: Path, store: Store) -> None:
    """An agent whose counter file is gone (a re-imaged state dir) starts at 1, is told the last
    counter taken (409 + X-Spotrain-Last-Seq) and carries on above it, on the same call."""
    from autoscaler.remote.endpoints import agent_router

    executor = RemoteExecutor(store, agent_token=TOKEN)
    app = FastAPI()
    app.include_router(agent_router(executor))
    config = agent_config(tmp_path, decision_id="d-1", agent_credential=agent_credential(TOKEN, "d-1"))
    channel = ControllerChannel(config, http=TestClient(app))
    for _ in range(3):
        assert channel.assignment("i-1") is not None
    (tmp_path / "state" / "agent-seq.json").unlink()
    fresh = ControllerChannel(config, http=TestClient(app))
    assert fresh.assignment("i-1") is not None
    assert fresh.report(Report(attempt=0, state="idle", instance_id="i-1")) is not None
