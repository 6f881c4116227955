"""The provider contract suite against the AWS provider, on moto in-process and in server mode."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from cloud_providers.aws import AwsProvider, RetryPolicy, make_provider
from cloud_providers.base import LaunchRequest
from tests.contract.provider_contract import ProviderContract

from .conftest import REGIONS, ZONES, FakeClock, SleepRecorder, make_test_provider, request_factory
from .harness import TEST_SPOT_PRICES, MotoServer, any_image_id

pytestmark = pytest.mark.aws


class TestAwsInProcess(ProviderContract):
    """moto's ``mock_aws``: boto3 calls are answered inside this process."""

    @pytest.fixture
    def provider(self, moto_in_process: None, clock: FakeClock, sleeps: SleepRecorder) -> AwsProvider:
        return make_test_provider(clock, sleeps)

    @pytest.fixture
    def launch_request_factory(self, provider: AwsProvider) -> Callable[..., LaunchRequest]:
        return request_factory(provider)

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
    def launch_request_factory(self, provider: AwsProvider) -> Callable[..., LaunchRequest]:
        return request_factory(provider)

    @pytest.fixture
    def advance_time(self, clock: FakeClock) -> Callable[[float], None]:
        return clock.advance
