"""Fixtures for the GCP provider tests: the loopback Compute fake and providers built on real clients.

For other test modules (and the GCP store / end-to-end helpers), the entry points are:

``gcp_fake``
    A started ``FakeCompute`` (function scope, so each test has a clean project) sharing the test's
    ``clock``: ``.endpoint``, ``.project``, ``.env()`` (``SPOTRAIN_GCP_*`` for a controller subprocess),
    ``.stockout(zone, machine_type)``, ``.quota(...)``, ``.throttle(n)``, ``.fail(status, reason)``,
    ``.preempt(name)`` / ``.complete_preemption(name)``, ``.on_preempt`` hooks, ``.instances()``.
``gcp_fake_wall``
    A started ``FakeCompute`` on wall time, for a controller subprocess (which reads the wall clock).
``gcp_fake_env``
    ``gcp_fake`` with its ``SPOTRAIN_GCP_*`` variables set in this process (``make_provider`` finds it).
``api_job(job_id)``
    The job's summary from the running controller's API, for polling loops.
``gcp_provider``
    A ``GcpProvider`` on ``gcp_fake`` through the real compute_v1 REST clients, with a no-op retry sleep
    (recorded in ``sleeps``) and the fake ``clock``. ``make_test_provider(fake, clock, sleeps, **overrides)``
    builds more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cloud_providers.base import SPOT, TAG_CONTROLLER, TAG_DECISION, TAG_JOB, TAG_MARKET, LaunchRequest, Offering
from cloud_providers.gcp import GcpProvider, RetryPolicy
from cloud_providers.gcp._google import make_client_factory

from .fake_compute import FakeCompute

ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")


class FakeClock:
    """Wall time that only moves when told to (shared by the fake's timestamps and the provider)."""

    def __init__(self) -> None:
        self.now_s = time.time()

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


class SleepRecorder:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def gcp_fake(clock: FakeClock) -> Iterator[FakeCompute]:
    with FakeCompute(clock=clock) as fake:
        yield fake


@pytest.fixture
def gcp_fake_wall() -> Iterator[FakeCompute]:
    with FakeCompute() as fake:
        yield fake


@pytest.fixture
def gcp_fake_env(gcp_fake: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> FakeCompute:
    for key, value in gcp_fake.env().items():
        monkeypatch.setenv(key, value)
    return gcp_fake


def api_job(job_id: str) -> dict[str, Any]:
    """The job as ``spotrain status JOB --json`` prints it, read from the running controller's API in
    this process (the CLI costs a Python start per call, which a polling loop should not spend)."""
    from autoscaler.client.http import Client

    return Client(timeout_s=30).job(job_id).to_json_dict()


def make_test_provider(fake: FakeCompute, clock: Callable[[], float], sleeps: Callable[[float], None],
                       **overrides: Any) -> GcpProvider:
    settings: dict[str, Any] = {
        "project": fake.project,
        "zones": list(ZONES),
        "controller_id": f"ctl-{uuid.uuid4().hex[:8]}",
        "retry": RetryPolicy(max_attempts=4, sleep=sleeps),
        "clock": clock,
    }
    if "client_factory" not in overrides and "endpoint" not in overrides:
        settings["client_factory"] = make_client_factory(endpoint=fake.endpoint)
    settings.update(overrides)
    return GcpProvider(**settings)


@pytest.fixture
def gcp_provider(gcp_fake: FakeCompute, clock: FakeClock, sleeps: SleepRecorder) -> GcpProvider:
    return make_test_provider(gcp_fake, clock, sleeps)


def request_factory(provider: GcpProvider, *, machine_type: str = "n1-standard-8", accelerator: str = "T4",
                    zone: str | None = None) -> Callable[..., LaunchRequest]:
    """The contract's ``launch_request_factory``: an n1-standard-8 + T4 (the cheapest catalog entry)."""
    offerings = [o for o in provider.offerings() if o.instance_type == machine_type and o.accelerator == accelerator
                 and (zone is None or o.zone == zone)]
    assert offerings, f"the fake should offer {machine_type} with {accelerator}"

    def make(
        *, job: str, market: str, decision_id: str | None = None, offering: Offering | None = None
    ) -> LaunchRequest:
        decision = decision_id or str(uuid.uuid4())
        return LaunchRequest(
            offering=offering or offerings[0],
            market=market,
            decision_id=decision,
            tags={TAG_JOB: job, TAG_CONTROLLER: provider.controller_id, TAG_MARKET: market, TAG_DECISION: decision},
        )

    return make


__all__ = ["FakeClock", "SPOT", "SleepRecorder", "ZONES", "api_job", "make_test_provider", "request_factory"]
