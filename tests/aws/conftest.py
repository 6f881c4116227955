"""Fixtures for the AWS provider tests: moto in-process (``mock_aws``) and in server mode."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from cloud_providers.aws import AwsProvider, RetryPolicy
from cloud_providers.base import SPOT, TAG_CONTROLLER, TAG_DECISION, TAG_JOB, TAG_MARKET, LaunchRequest, Offering

from .harness import DUMMY_ENV, MOTO_ENV, TEST_SPOT_PRICES, MotoServer, any_image_id

REGIONS = ("us-east-1", "us-west-2")
ZONES = ("us-east-1a", "us-east-1b", "us-west-2a")


class FakeClock:
    """Wall time that only moves when told to (moto stamps launches with real time, to the second)."""

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
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in (DUMMY_ENV | MOTO_ENV).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def moto_in_process(aws_env: None) -> Iterator[None]:
    with mock_aws():
        yield


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def boto_factory(endpoint_url: str | None = None) -> Callable[[str], Any]:
    clients: dict[str, Any] = {}

    def factory(region: str) -> Any:
        if region not in clients:
            kwargs: dict[str, Any] = {"region_name": region}
            if endpoint_url:
                kwargs["endpoint_url"] = endpoint_url
            clients[region] = boto3.client("ec2", **kwargs)
        return clients[region]

    return factory


def make_test_provider(clock: FakeClock, sleeps: SleepRecorder, **overrides: Any) -> AwsProvider:
    settings: dict[str, Any] = {
        "regions": list(REGIONS),
        "zones": list(ZONES),
        "controller_id": f"ctl-{uuid.uuid4().hex[:8]}",
        "image_id": any_image_id(),
        "spot_price_overrides": TEST_SPOT_PRICES,
        "retry": RetryPolicy(max_attempts=4, sleep=sleeps),
        "clock": clock,
    }
    if "client_factory" not in overrides and "session" not in overrides:
        settings["client_factory"] = boto_factory()
    settings.update(overrides)
    return AwsProvider(**settings)


def request_factory(provider: AwsProvider) -> Callable[..., LaunchRequest]:
    """The contract's ``launch_request_factory``: a g4dn.xlarge (cheapest catalog type) offering."""
    offerings = [o for o in provider.offerings() if o.instance_type == "g4dn.xlarge"]
    assert offerings, "moto should offer g4dn.xlarge"

    def make(
        *, job: str, market: str, decision_id: str | None = None, offering: Offering | None = None
    ) -> LaunchRequest:
        decision = decision_id or f"dec-{uuid.uuid4().hex}"
        return LaunchRequest(
            offering=offering or offerings[0],
            market=market,
            decision_id=decision,
            tags={TAG_JOB: job, TAG_CONTROLLER: provider.controller_id, TAG_MARKET: market, TAG_DECISION: decision},
        )

    return make


__all__ = ["FakeClock", "SPOT", "SleepRecorder", "boto_factory", "make_test_provider", "request_factory"]
