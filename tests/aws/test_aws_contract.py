"""The provider contract suite against the AWS provider, on moto in-process and in server mode."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from cloud_providers.aws import AwsProvider, RetryPolicy, make_provider
from cloud_providers.base import LaunchRequest
from tests.contract.provider_contract import ProviderContract

from .conftest import REGIONS, ZONES, FakeClock, SleepRecorder, make_test_provider, request_factory
from .harness import TEST_SPOT_PRICES, MotoServer, any_image_id

pytestmark = pytest.mark.aws


def synced_factory(provider: AwsProvider, clock: FakeClock) -> Callable[..., LaunchRequest]:
    """Requests as ``request_factory`` makes them, with the frozen test clock caught up to the wall
    clock just before: moto stamps a launch with real time, and a loaded machine can spend seconds
    between the clock's creation and the launch (fixtures, catalog discovery)."""
    make = request_factory(provider)

    def synced(**kwargs: object) -> LaunchRequest:
        request = make(**kwargs)
        clock.now_s = max(clock.now_s, time.time())
        return request

    return synced


class TestAwsInProcess(ProviderContract):
    """moto's ``mock_aws``: boto3 calls are answered inside this process."""

    @pytest.fixture
    def provider(self, moto_in_process: None, clock: FakeClock, sleeps: SleepRecorder) -> AwsProvider:
        return make_test_provider(clock, sleeps)

    @pytest.fixture
    def launch_request_factory(self, provider: AwsProvider, clock: FakeClock) -> Callable[..., LaunchRequest]:
        return synced_factory(provider, clock)

    @pytest.fixture
    def advance_time(self, clock: FakeClock) -> Callable[[float], None]:
        return clock.advance


class TestAwsServerMode(ProviderContract):
    """moto's server on a loopback port, reached through AWS_ENDPOINT_URL by the controller's own
    factory (``make_provider`` with boto3's default session)."""

    @pytest.fixture
    def provider(self, moto_server: MotoServer, clock: FakeClock, sleeps: SleepRecorder) -> AwsProvider:
        return make_provider(
            regions=",".join(REGIONS),
            zones=list(ZONES),
            controller_id=f"ctl-{uuid.uuid4().hex[:8]}",
            image_id=any_image_id(),
            spot_price_overrides=TEST_SPOT_PRICES,
            retry=RetryPolicy(max_attempts=4, sleep=sleeps),
            clock=clock,
        )

    @pytest.fixture
    def launch_request_factory(self, provider: AwsProvider, clock: FakeClock) -> Callable[..., LaunchRequest]:
        return synced_factory(provider, clock)

    @pytest.fixture
    def advance_time(self, clock: FakeClock) -> Callable[[float], None]:
        return clock.advance
