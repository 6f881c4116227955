"""Helpers for the remote executor and instance agent tests: a fake controller channel, a fake clock,
agent configs and assignments, and a helper that drives an agent's loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud_providers.launch import WorkerLaunch
from cloud_providers.remote.agent import Agent, ControllerUnreachable, InstanceGone
from cloud_providers.remote.config import AgentConfig
from cloud_providers.remote.wire import Assignment, Report

JOB = "job-1"


class FakeChannel:
    """The controller as an agent sees it, scripted by the test."""

    def __init__(self, instance_id: str = "i-1") -> None:
        self.current = Assignment(instance_id=instance_id)
        self.reports: list[Report] = []
        self.down = False
        self.gone = False

    def _answer(self) -> Assignment:
        if self.down:
            raise ControllerUnreachable("connection refused")
        if self.gone:
            raise InstanceGone("terminated")
        return self.current

    def assignment(self, instance_id: str | None) -> Assignment | None:
        return self._answer()

    def report(self, report: Report) -> Assignment | None:
        answer = self._answer()
        self.reports.append(report)
        return answer

    def assign(self, launch: WorkerLaunch, *, notice: dict[str, Any] | None = None, stop_attempt: int = 0) -> None:
        self.current = Assignment(instance_id=self.current.instance_id, launch=launch, notice=notice,
                                  stop_attempt=stop_attempt)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def rank_assignment(cwd: Path, run: str, *, attempt: int = 1, ranks: list[int] | None = None, world_size: int = 1,
                    setup: str | None = None) -> WorkerLaunch:
    return WorkerLaunch(job_id=JOB, attempt=attempt, run=run, setup=setup, cwd=str(cwd), ranks=ranks or [0],
                          world_size=world_size, master_addr="10.0.0.7", master_port=29511,
                          env={"SPOTRAIN_JOB_ID": JOB, "SPOTRAIN_ATTEMPT": str(attempt)})


def agent_config(tmp_path: Path, **overrides: Any) -> AgentConfig:
    settings: dict[str, Any] = {
        "controller_url": "http://127.0.0.1:9", "agent_credential": "d-1:00", "decision_id": "d-1",
        "instance_id": "i-1", "state_dir": str(tmp_path / "state"), "poll_s": 0.05, "report_s": 0.2,
    }
    settings.update(overrides)
    return AgentConfig(**settings)


def drive(agent: Agent, until: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    """Turn the agent's loop until ``until()`` holds (AssertionError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agent.step()
        if until():
            return
        time.sleep(0.02)
    raise AssertionError(f"agent did not get there in {timeout_s} s; last report {agent.report()}")
