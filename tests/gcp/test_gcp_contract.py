"""The provider contract suite against the GCP provider, on the loopback Compute fake through the real
google-cloud-compute clients: built directly with a client factory, and by the controller's own
``make_provider`` from ``SPOTRAIN_GCP_ENDPOINT`` / ``SPOTRAIN_GCP_PROJECT``."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from cloud_providers import catalog
from cloud_providers.base import LaunchRequest
from cloud_providers.gcp import GcpProvider, RetryPolicy, make_provider
from tests.contract.provider_contract import ProviderContract

from .conftest import ZONES, FakeClock, SleepRecorder, make_test_provider, request_factory
from .fake_compute import FakeCompute

pytestmark = pytest.mark.gcp

# The contract checks every offering against the shared catalog (cloud_providers/catalog.py), which
# lists fewer GCP entries than the GCP provider's bundled one; the contract runs on those.
SHARED = [f"{t.instance_type}/{t.accelerator}:{t.gpus}" for t in catalog.INSTANCE_TYPES if t.cloud == "gcp"]


class TestGcpClientFactory(ProviderContract):
    @pytest.fixture
    def provider(self, gcp_fake: FakeCompute, clock: FakeClock, sleeps: SleepRecorder) -> GcpProvider:
        return make_test_provider(gcp_fake, clock, sleeps, machine_types=SHARED)

    @pytest.fixture
    def launch_request_factory(self, provider: GcpProvider) -> Callable[..., LaunchRequest]:
        return request_factory(provider)

    @pytest.fixture
    def advance_time(self, clock: FakeClock) -> Callable[[float], None]:
        return clock.advance


class TestGcpFromEnvironment(ProviderContract):
    """``make_provider`` as ``controller start --cloud gcp`` calls it, configured by the environment."""

    @pytest.fixture
    def provider(self, gcp_fake_env: FakeCompute, clock: FakeClock, sleeps: SleepRecorder) -> GcpProvider:
        return make_provider(controller_id=f"ctl-{uuid.uuid4().hex[:8]}", machine_types=",".join(SHARED),
                             retry=RetryPolicy(max_attempts=4, sleep=sleeps), clock=clock)

    @pytest.fixture
    def launch_request_factory(self, provider: GcpProvider) -> Callable[..., LaunchRequest]:
        assert set(provider.zones) >= set(ZONES)
        return request_factory(provider)

    @pytest.fixture
    def advance_time(self, clock: FakeClock) -> Callable[[float], None]:
        return clock.advance
