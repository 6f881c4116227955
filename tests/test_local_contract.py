"""The provider contract suite against the local cloud (its market clock driven by a fake wall clock)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from cloud_providers.base import SPOT, TAG_CONTROLLER, TAG_DECISION, TAG_JOB, TAG_MARKET, LaunchRequest
from cloud_providers.local.provider import LocalProvider
from tests.contract.provider_contract import ProviderContract


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


class TestLocalProvider(ProviderContract):
    @pytest.fixture
    def clock(self) -> Clock:
        return Clock()

    @pytest.fixture
    def provider(self, tmp_path: Path, clock: Clock) -> LocalProvider:
        return LocalProvider(root=tmp_path / "cloud", time_scale=60, clock=clock)

    @pytest.fixture
    def launch_request_factory(self, provider: LocalProvider) -> Callable[..., LaunchRequest]:
        def make(*, job: str, market: str, decision_id: str | None = None) -> LaunchRequest:
            # The test reads the room from the trace: the cloud itself reports none (as AWS and GCP).
            offering = max(
                (o for o in provider.trace.offerings_at(provider.now_s())
                 if market != SPOT or (o.spot_price_usd_per_hour and o.spot_available)),
                key=lambda o: (o.spot_available or 0, o.key),
            )
            did = decision_id or f"d-{uuid.uuid4().hex[:12]}"
            return LaunchRequest(offering=offering, market=market, decision_id=did, tags={
                TAG_JOB: job, TAG_CONTROLLER: "contract", TAG_MARKET: market, TAG_DECISION: did,
            })

        return make

    @pytest.fixture
    def advance_time(self, clock: Clock, provider: LocalProvider) -> Callable[[float], None]:
        def advance(seconds: float) -> None:
            clock.t += seconds / provider.time_scale

        return advance
