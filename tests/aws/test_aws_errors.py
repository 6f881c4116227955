"""Every typed error path of the AWS provider, injected with botocore's Stubber, and throttling backoff."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from cloud_providers.aws import AwsProvider, RetryPolicy
from cloud_providers.base import ON_DEMAND, SPOT, TAG_CONTROLLER, TAG_DECISION, TAG_JOB, LaunchRequest, Offering
from cloud_providers.errors import (
    CapacityUnavailable,
    CredentialsError,
    InvalidRequest,
    ProviderError,
    QuotaExceeded,
    Throttled,
)

from .conftest import FakeClock, SleepRecorder

pytestmark = pytest.mark.aws

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
OFFERING = Offering(cloud="aws", region="us-east-1", zone="us-east-1b", instance_type="g5.xlarge",
                    accelerator="A10G", gpus=1, on_demand_price_usd_per_hour=1.006, spot_price_usd_per_hour=0.36)


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Stubber]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    client = boto3.client("ec2", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def provider_for(client: Any, sleeps: SleepRecorder, *, max_attempts: int = 4) -> AwsProvider:
    return AwsProvider(regions=["us-east-1"], controller_id="ctl", client_factory=lambda region: client,
                       image_id="ami-12345678", spot_price_overrides={"g5.xlarge": 0.36},
                       retry=RetryPolicy(max_attempts=max_attempts, base_s=1.0, cap_s=8.0, sleep=sleeps,
                                         rng=random.Random(7)),
                       clock=FakeClock())


def request(market: str = SPOT, decision: str = "dec-1") -> LaunchRequest:
    return LaunchRequest(offering=OFFERING, market=market, decision_id=decision,
                         tags={TAG_JOB: "job-1", TAG_CONTROLLER: "ctl", TAG_DECISION: decision})


def expect_no_existing(stubber: Stubber) -> None:
    stubber.add_response("describe_instances", {"Reservations": []}, {"Filters": ANY})


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("InsufficientInstanceCapacity", CapacityUnavailable),
        ("SpotMaxPriceTooLow", CapacityUnavailable),
        ("MaxSpotInstanceCountExceeded", CapacityUnavailable),
        ("Unsupported", CapacityUnavailable),
        ("VcpuLimitExceeded", QuotaExceeded),
        ("InstanceLimitExceeded", QuotaExceeded),
        ("AuthFailure", CredentialsError),
        ("UnauthorizedOperation", CredentialsError),
        ("InvalidParameterValue", InvalidRequest),
        ("InvalidAMIID.NotFound", InvalidRequest),
        ("IdempotentParameterMismatch", InvalidRequest),
        ("SomethingNew", ProviderError),
    ],
)
def test_run_instances_errors_are_typed(ec2: tuple[Any, Stubber], sleeps: SleepRecorder, code: str,
                                        kind: type[ProviderError]) -> None:
    client, stubber = ec2
    expect_no_existing(stubber)
    stubber.add_client_error("run_instances", service_error_code=code,
                             service_message=f"{code} happened\nsecond line", http_status_code=400)
    with pytest.raises(kind) as info:
        provider_for(client, sleeps).launch(request())
    err = info.value
    assert type(err) is kind
    assert (err.cloud, err.region, err.zone, err.instance_type) == ("aws", "us-east-1", "us-east-1b", "g5.xlarge")
    assert err.attempts == 1 and sleeps.calls == []
    assert "\n" not in str(err) and SECRET not in str(err)
    assert err.__cause__ is not None and type(err.__cause__).__name__ == "ClientError"


def test_credentials_error_names_the_fix_in_one_line(ec2: tuple[Any, Stubber], sleeps: SleepRecorder) -> None:
    client, stubber = ec2
    stubber.add_client_error("describe_instances", service_error_code="UnauthorizedOperation",
                             service_message="You are not authorized. Encoded authorization failure message: xyz")
    with pytest.raises(CredentialsError) as info:
        provider_for(client, sleeps).list_instances({TAG_JOB: "job-1"})
    message = str(info.value)
    assert "DescribeInstances" in message and "docs/aws.md" in message
    assert "Encoded" not in message and SECRET not in message and "\n" not in message


def test_missing_credentials_are_credentials_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                   sleeps: SleepRecorder) -> None:
    """No stub: a real client with no credentials anywhere fails while signing (NoCredentialsError)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached
    provider = AwsProvider(regions=["us-east-1"], controller_id="ctl", retry=RetryPolicy(sleep=sleeps))
    with pytest.raises(CredentialsError, match="credentials not found") as info:
        provider.list_instances({})
    assert type(info.value.__cause__).__name__ == "NoCredentialsError"
    assert sleeps.calls == []


def test_throttling_backs_off_with_full_jitter_then_succeeds(
    ec2: tuple[Any, Stubber], sleeps: SleepRecorder
) -> None:
    client, stubber = ec2
    expect_no_existing(stubber)
    for code in ("RequestLimitExceeded", "Throttling", "RequestLimitExceeded"):
        stubber.add_client_error("run_instances", service_error_code=code, http_status_code=503)
    stubber.add_response("run_instances", {"Instances": [{"InstanceId": "i-0123456789abcdef0",
                                                          "InstanceType": "g5.xlarge",
                                                          "Placement": {"AvailabilityZone": "us-east-1b"},
                                                          "State": {"Name": "pending", "Code": 0},
                                                          "InstanceLifecycle": "spot"}]})
    instance = provider_for(client, sleeps).launch(request())
    assert instance.instance_id == "i-0123456789abcdef0"
    assert len(sleeps.calls) == 3
    for attempt, delay in enumerate(sleeps.calls, start=1):
        assert 0.0 <= delay <= min(8.0, 1.0 * 2 ** (attempt - 1))
    # Full jitter: seeded, so not all equal to the cap (which would be plain exponential backoff).
    assert sleeps.calls != [1.0, 2.0, 4.0]


def test_throttling_gives_up_after_bounded_attempts(ec2: tuple[Any, Stubber], sleeps: SleepRecorder) -> None:
    client, stubber = ec2
    for _ in range(3):
        stubber.add_client_error("describe_instances", service_error_code="RequestLimitExceeded",
                                 http_status_code=503)
    with pytest.raises(Throttled) as info:
        provider_for(client, sleeps, max_attempts=3).list_instances({TAG_JOB: "job-1"})
    assert info.value.attempts == 3 and len(sleeps.calls) == 2
    assert info.value.region == "us-east-1"


def test_transient_server_errors_are_retried(ec2: tuple[Any, Stubber], sleeps: SleepRecorder) -> None:
    client, stubber = ec2
    stubber.add_client_error("terminate_instances", service_error_code="InternalError", http_status_code=500)
    stubber.add_response("terminate_instances", {"TerminatingInstances": []},
                         {"InstanceIds": ["i-0123456789abcdef0"]})
    provider_for(client, sleeps).terminate("i-0123456789abcdef0")
    assert len(sleeps.calls) == 1


def test_terminate_unknown_instance_is_not_an_error(ec2: tuple[Any, Stubber], sleeps: SleepRecorder) -> None:
    client, stubber = ec2
    stubber.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound")
    provider_for(client, sleeps).terminate("i-0123456789abcdef0")


def test_launch_sends_client_token_market_options_tags_and_imdsv2(ec2: tuple[Any, Stubber],
                                                                   sleeps: SleepRecorder) -> None:
    client, stubber = ec2
    expect_no_existing(stubber)
    expected = {
        "ImageId": "ami-12345678",
        "InstanceType": "g5.xlarge",
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": "dec-9",
        "UserData": ANY,
        "Placement": {"AvailabilityZone": "us-east-1b"},
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
        "TagSpecifications": ANY,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}},
    }
    stubber.add_client_error("run_instances", service_error_code="InsufficientInstanceCapacity",
                             expected_params=expected)
    with pytest.raises(CapacityUnavailable):
        provider_for(client, sleeps).launch(request(decision="dec-9"))


def test_on_demand_launch_has_no_market_options(ec2: tuple[Any, Stubber], sleeps: SleepRecorder) -> None:
    client, stubber = ec2
    expect_no_existing(stubber)
    seen: dict[str, Any] = {}

    def capture(params: dict[str, Any], **_: Any) -> None:
        seen.update(params)

    client.meta.events.register("provide-client-params.ec2.RunInstances", capture)
    stubber.add_client_error("run_instances", service_error_code="InsufficientInstanceCapacity")
    with pytest.raises(CapacityUnavailable):
        provider_for(client, sleeps).launch(request(market=ON_DEMAND))
    assert "InstanceMarketOptions" not in seen
    tags = {t["Key"]: t["Value"] for t in seen["TagSpecifications"][0]["Tags"]}
    assert tags["spotrain-market"] == ON_DEMAND and tags[TAG_DECISION] == "dec-1"
    assert tags["spotrain-price-usd-per-hour"] == "1.006000"


@pytest.mark.parametrize("decision", ["", "x" * 65, "naïve", "tab\there"])
def test_bad_decision_ids_are_invalid_requests(
    ec2: tuple[Any, Stubber], sleeps: SleepRecorder, decision: str
) -> None:
    client, _ = ec2
    with pytest.raises(InvalidRequest, match="decision_id"):
        provider_for(client, sleeps).launch(request(decision=decision))


def test_foreign_controller_tag_is_rejected(ec2: tuple[Any, Stubber], sleeps: SleepRecorder) -> None:
    client, _ = ec2
    foreign = LaunchRequest(offering=OFFERING, market=SPOT, decision_id="d", tags={TAG_CONTROLLER: "other"})
    with pytest.raises(InvalidRequest, match="controller"):
        provider_for(client, sleeps).launch(foreign)
