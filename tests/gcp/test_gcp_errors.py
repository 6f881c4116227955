"""Typed errors at the GCP edge, through the real google-cloud-compute clients and the loopback fake:
stockouts are capacity errors of their zone, quota is quota (not credentials), throttling is retried with full
jitter and then reported, 401/403 are credentials, 400 is an invalid request, a 404 on an instance is
InstanceNotFound, and network trouble is a ProviderError; every message is one line without secrets."""

from __future__ import annotations

import pytest

from cloud_providers.base import ON_DEMAND, SPOT, TAG_JOB
from cloud_providers.errors import (
    CapacityUnavailable,
    CredentialsError,
    InstanceNotFound,
    InvalidRequest,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from cloud_providers.gcp import GcpProvider

from .conftest import FakeClock, SleepRecorder, make_test_provider, request_factory
from .fake_compute import FakeCompute

pytestmark = pytest.mark.gcp


def _one_line(exc: BaseException) -> None:
    text = str(exc)
    assert text and "\n" not in text, text
    assert "Bearer" not in text and "token" not in text.lower(), text


def test_stockout_is_capacity_and_fails_over_to_another_zone(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    make_a = request_factory(gcp_provider, zone="us-central1-a")
    make_b = request_factory(gcp_provider, zone="us-central1-b")
    gcp_fake.stockout("us-central1-a", "n1-standard-8")
    first, second = make_a(job="so", market=SPOT), make_b(job="so", market=SPOT)
    with pytest.raises(CapacityUnavailable) as info:
        gcp_provider.launch(first)
    err = info.value
    assert (err.cloud, err.zone, err.instance_type) == ("gcp", "us-central1-a", "n1-standard-8")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(err)
    _one_line(err)
    # The same decision again is the same failed operation (requestId), not a second try.
    with pytest.raises(CapacityUnavailable):
        gcp_provider.launch(first)
    assert gcp_fake.count("POST", r"/zones/us-central1-a/instances$") == 2
    # Another zone has room (the policy moves there: ``policy/jobmath.cap_refused``).
    instance = gcp_provider.launch(second)
    assert instance.zone == "us-central1-b"
    assert {i["name"] for i in gcp_fake.instances()} == {instance.instance_id}


def test_stockout_with_details_and_spot_only_stockouts(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    make = request_factory(gcp_provider, zone="us-central1-c")
    gcp_fake.stockout("us-central1-c", spot_only=True, with_details=True)
    with pytest.raises(CapacityUnavailable, match="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"):
        gcp_provider.launch(make(job="sod", market=SPOT))
    assert gcp_provider.launch(make(job="sod", market=ON_DEMAND)).market == ON_DEMAND
    gcp_fake.clear_stockouts()
    assert gcp_provider.launch(make(job="sod", market=SPOT)).market == SPOT


@pytest.mark.parametrize("http", [False, True], ids=["operation", "http-403"])
def test_quota_is_quota_not_credentials(gcp_fake: FakeCompute, gcp_provider: GcpProvider, http: bool) -> None:
    make = request_factory(gcp_provider)
    gcp_fake.quota(metric="NVIDIA_T4_GPUS", http=http)
    with pytest.raises(QuotaExceeded) as info:
        gcp_provider.launch(make(job="quota", market=SPOT))
    assert "NVIDIA_T4_GPUS" in str(info.value) and info.value.zone == make(job="q", market=SPOT).offering.zone
    _one_line(info.value)
    assert gcp_fake.instances() == []  # nothing was bought


def test_throttling_is_retried_with_full_jitter_then_succeeds(
    gcp_fake: FakeCompute, gcp_provider: GcpProvider, sleeps: SleepRecorder
) -> None:
    make = request_factory(gcp_provider)
    gcp_fake.throttle(2, method="POST", path=r"/instances$")
    instance = gcp_provider.launch(make(job="thr", market=SPOT))
    assert instance.alive
    assert len(sleeps.calls) == 2
    # Full jitter: U(0, min(cap, base * 2**(n-1))) with the default base 0.5 s.
    assert 0 <= sleeps.calls[0] <= 0.5 and 0 <= sleeps.calls[1] <= 1.0
    # The retried insert carried the same requestId: one instance.
    ids = {q["requestId"] for m, p, q in gcp_fake.queries if m == "POST" and p.endswith("/instances")}
    assert len(ids) == 1 and len(gcp_fake.instances()) == 1


def test_throttling_that_persists_is_throttled_with_attempts(
    gcp_fake: FakeCompute, gcp_provider: GcpProvider, sleeps: SleepRecorder
) -> None:
    gcp_provider.offerings()
    gcp_fake.throttle(100)
    with pytest.raises(Throttled) as info:
        gcp_provider.list_instances({TAG_JOB: "x"})
    assert info.value.attempts == 4 and len(sleeps.calls) == 3
    _one_line(info.value)
    # 403 rateLimitExceeded (Compute's per-user limit) is throttling too, not credentials.
    gcp_fake.clear_failures()
    gcp_fake.fail(403, "rateLimitExceeded", "Rate Limit Exceeded", times=100, domain="usageLimits")
    with pytest.raises(Throttled):
        gcp_provider.poll()


def test_server_errors_are_retried(gcp_fake: FakeCompute, gcp_provider: GcpProvider, sleeps: SleepRecorder) -> None:
    gcp_fake.fail(503, "backendError", "Backend Error", times=2)
    assert gcp_provider.offerings()
    assert len(sleeps.calls) == 2


@pytest.mark.parametrize(
    ("status", "reason", "needle"),
    [
        (401, "authError", "gcloud auth application-default login"),
        (403, "forbidden", "docs/gcp.md"),
        (403, "accessNotConfigured", "gcloud services enable compute.googleapis.com"),
    ],
)
def test_401_and_403_are_credentials_errors_in_one_line(
    gcp_fake: FakeCompute, gcp_provider: GcpProvider, sleeps: SleepRecorder, status: int, reason: str, needle: str
) -> None:
    gcp_fake.fail(status, reason, "Request had invalid authentication credentials. ya29.SECRET", times=None)
    with pytest.raises(CredentialsError) as info:
        gcp_provider.offerings()
    assert needle in str(info.value)
    assert "ya29" not in str(info.value) and "SECRET" not in str(info.value)
    assert sleeps.calls == [], "credentials errors are not retried"
    _one_line(info.value)


def test_400_is_an_invalid_request(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    make = request_factory(gcp_provider)
    gcp_fake.fail(400, "invalid", "Invalid value for field 'resource.disks[0].initializeParams.sourceImage'",
                  method="POST", path=r"/instances$")
    with pytest.raises(InvalidRequest, match="sourceImage") as info:
        gcp_provider.launch(make(job="bad", market=SPOT))
    _one_line(info.value)
    # A bad image the fake itself rejects, through the same path.
    broken = make_test_provider(gcp_fake, gcp_provider.now_s, lambda s: None, image="x", zones=["us-central1-a"])
    gcp_fake.fail(400, "invalid", "The resource 'x' is not a valid image", method="POST", path=r"/instances$")
    with pytest.raises(InvalidRequest):
        broken.launch(request_factory(broken)(job="bad", market=ON_DEMAND))


def test_404_on_an_instance_is_instance_not_found(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    make = request_factory(gcp_provider)
    instance = gcp_provider.launch(make(job="nf", market=ON_DEMAND))
    gcp_fake.reset()
    gcp_provider.terminate(instance.instance_id)  # idempotent: a 404 on delete is fine
    gcp_provider.terminate("sp-never-existed")
    with pytest.raises(InstanceNotFound):
        gcp_provider.boot_config(instance)


def test_unknown_zone_and_offering_are_invalid_requests(gcp_provider: GcpProvider) -> None:
    import dataclasses

    request = request_factory(gcp_provider)(job="iz", market=SPOT)
    wrong_type = dataclasses.replace(request.offering, gpus=3)
    with pytest.raises(InvalidRequest, match="catalog"):
        gcp_provider.launch(dataclasses.replace(request, offering=wrong_type))
    aws = dataclasses.replace(request.offering, cloud="aws")
    with pytest.raises(InvalidRequest, match="not a GCP offering"):
        gcp_provider.launch(dataclasses.replace(request, offering=aws))


def test_network_errors_are_provider_errors(clock: FakeClock, sleeps: SleepRecorder) -> None:
    fake = FakeCompute(clock=clock).start()
    provider = make_test_provider(fake, clock, sleeps)
    fake.stop()
    with pytest.raises(ProviderError) as info:
        provider.offerings()
    assert type(info.value) is ProviderError and info.value.attempts == 4
    _one_line(info.value)


def test_a_project_the_api_does_not_know_is_invalid(gcp_fake: FakeCompute, clock: FakeClock,
                                                    sleeps: SleepRecorder) -> None:
    provider = make_test_provider(gcp_fake, clock, sleeps, project="no-such-project")
    with pytest.raises(InvalidRequest, match="no-such-project"):
        provider.offerings()
