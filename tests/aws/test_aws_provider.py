"""AWS provider behaviour on moto: offerings, prices, failover, interruptions, recovery, factory."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from cloud_providers.aws import AwsProvider, RetryPolicy, make_provider
from cloud_providers.aws.pricing import SpotPriceCache
from cloud_providers.base import (
    ON_DEMAND,
    SPOT,
    TAG_CONTROLLER,
    TAG_DECISION,
    TAG_JOB,
    InstanceState,
    LaunchRequest,
    Offering,
)
from cloud_providers.errors import CapacityUnavailable, CredentialsError, QuotaExceeded

from .conftest import FakeClock, SleepRecorder, boto_factory, make_test_provider, request_factory
from .faults import Faults, in_zone, of_type
from .harness import complete_spot_interruption, deliver_spot_interruption, mark_spot_interruption

pytestmark = pytest.mark.aws


@pytest.fixture
def faults() -> Faults:
    return Faults()


@pytest.fixture
def provider(moto_in_process: None, clock: FakeClock, sleeps: SleepRecorder, faults: Faults) -> AwsProvider:
    factory = boto_factory()
    return make_test_provider(clock, sleeps, client_factory=lambda region: faults.attach(factory(region)))


def requests_for(
    provider: AwsProvider, job: str, candidates: list[tuple[str, str]], market: str = SPOT
) -> list[LaunchRequest]:
    by_place = {(o.zone, o.instance_type): o for o in provider.offerings()}
    return [
        LaunchRequest(offering=by_place[place], market=market, decision_id=f"{job}-{i}",
                      tags={TAG_JOB: job, TAG_CONTROLLER: provider.controller_id})
        for i, place in enumerate(candidates)
    ]


def test_offerings_use_gpu_info_zones_and_prices(provider: AwsProvider) -> None:
    offerings = provider.offerings()
    assert {o.zone for o in offerings} == {"us-east-1a", "us-east-1b", "us-west-2a"}
    by_key = {o.key: o for o in offerings}
    t4 = by_key["aws/us-east-1a/g4dn.12xlarge/T4:4"]
    assert (t4.region, t4.gpus, t4.on_demand_price_usd_per_hour, t4.spot_price_usd_per_hour) == (
        "us-east-1", 4, 3.912, 1.1736)
    assert all(o.spot_available is None and o.notice_seconds == 120.0 for o in offerings)
    # moto has no p3 types: the catalog's V100s are simply not offered (no InvalidInstanceType).
    assert not any(o.accelerator == "V100" for o in offerings)


def test_offerings_in_one_region_without_zone_filter(moto_in_process: None, clock: FakeClock,
                                                     sleeps: SleepRecorder) -> None:
    provider = make_test_provider(clock, sleeps, regions=["us-west-2"], zones=None, spot_price_overrides={})
    offerings = provider.offerings()
    assert len({o.zone for o in offerings}) >= 3
    assert all(o.region == "us-west-2" for o in offerings)
    # No overrides: moto's own (fake) spot price history is what we report.
    assert all(o.spot_price_usd_per_hour == pytest.approx(0.00001) for o in offerings)


def test_spot_prices_are_paginated_newest_wins_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    client = boto3.client("ec2", region_name="us-east-1")
    clock = FakeClock()
    old = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    new = dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)
    entry = {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX"}
    with Stubber(client) as stubber:
        stubber.add_response("describe_spot_price_history", {
            "SpotPriceHistory": [entry | {"SpotPrice": "0.30", "Timestamp": old}], "NextToken": "page2"},
            {"InstanceTypes": ["g5.xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY,
             "MaxResults": 1000})
        stubber.add_response("describe_spot_price_history", {
            "SpotPriceHistory": [entry | {"SpotPrice": "0.40", "Timestamp": new},
                                 entry | {"AvailabilityZone": "us-east-1b", "SpotPrice": "0.50", "Timestamp": old},
                                 entry | {"ProductDescription": "Windows", "SpotPrice": "9", "Timestamp": new}],
            "NextToken": ""},
            {"InstanceTypes": ["g5.xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY,
             "MaxResults": 1000, "NextToken": "page2"})
        cache = SpotPriceCache(client_for=lambda r: client, retry=RetryPolicy(), clock=clock, ttl_s=300,
                               overrides={"us-east-1b/g5.xlarge": 0.45})
        assert cache.price("us-east-1", "us-east-1a", "g5.xlarge", lambda: ["g5.xlarge"]) == 0.40
        assert cache.price("us-east-1", "us-east-1b", "g5.xlarge", lambda: ["g5.xlarge"]) == 0.45
        clock.advance(299)
        assert cache.price("us-east-1", "us-east-1a", "g5.xlarge", lambda: ["g5.xlarge"]) == 0.40  # cached
        stubber.assert_no_pending_responses()
        stubber.add_response("describe_spot_price_history", {"SpotPriceHistory": []}, None)
        clock.advance(2)
        assert cache.price("us-east-1", "us-east-1a", "g5.xlarge", lambda: ["g5.xlarge"]) is None  # refreshed
        stubber.assert_no_pending_responses()


def test_a_capacity_error_names_its_zone_and_another_zone_launches(provider: AwsProvider, faults: Faults) -> None:
    """What the policy's failover reads (``policy/jobmath.cap_refused``): a typed error with its zone."""
    faults.fail("RunInstances", "InsufficientInstanceCapacity", when=in_zone("us-east-1a"))
    first, second = requests_for(provider, "fo-zone", [("us-east-1a", "g5.xlarge"), ("us-east-1b", "g5.xlarge")])
    with pytest.raises(CapacityUnavailable) as info:
        provider.launch(first)
    assert info.value.zone == "us-east-1a"
    assert provider.launch(second).zone == "us-east-1b"
    assert [i.zone for i in provider.list_instances({TAG_JOB: "fo-zone"})] == ["us-east-1b"]


def test_spot_price_is_capacity_and_the_vcpu_limit_is_quota(provider: AwsProvider, faults: Faults) -> None:
    faults.fail("RunInstances", "SpotMaxPriceTooLow", when=of_type("g5.xlarge"))
    faults.fail("RunInstances", "VcpuLimitExceeded", when=in_zone("us-east-1b"))
    price, vcpus, other = requests_for(provider, "fo-type", [("us-east-1a", "g5.xlarge"), ("us-east-1b", "g6.xlarge"),
                                                             ("us-west-2a", "g6.xlarge")])
    with pytest.raises(CapacityUnavailable):
        provider.launch(price)
    with pytest.raises(QuotaExceeded):
        provider.launch(vcpus)
    instance = provider.launch(other)
    assert (instance.region, instance.instance_type) == ("us-west-2", "g6.xlarge")


def test_an_auth_failure_is_credentials_and_not_retried(provider: AwsProvider, faults: Faults) -> None:
    faults.fail("RunInstances", "AuthFailure")
    with pytest.raises(CredentialsError):
        provider.launch(requests_for(provider, "fo-auth", [("us-east-1a", "g5.xlarge")])[0])
    assert sum(1 for op, code in faults.injected if code == "AuthFailure") == 1, "no retry on auth errors"


def test_throttled_run_instances_is_retried_without_a_second_instance(provider: AwsProvider, faults: Faults,
                                                                      sleeps: SleepRecorder) -> None:
    faults.fail("RunInstances", "RequestLimitExceeded", times=2, status=503)
    (request,) = requests_for(provider, "thr", [("us-east-1a", "g4dn.xlarge")])
    instance = provider.launch(request)
    assert len(sleeps.calls) == 2
    assert [i.instance_id for i in provider.list_instances({TAG_JOB: "thr"})] == [instance.instance_id]


def test_restarted_controller_finds_the_decision(provider: AwsProvider, clock: FakeClock,
                                                 sleeps: SleepRecorder) -> None:
    """A crash between run_instances and recording its result: the new provider (same controller id)
    returns the instance already launched for the decision and launches nothing."""
    (request,) = requests_for(provider, "crash", [("us-east-1a", "g4dn.xlarge")])
    first = provider.launch(request)
    restarted = make_test_provider(clock, sleeps, controller_id=provider.controller_id)
    again = restarted.launch(request)
    assert again.instance_id == first.instance_id
    listed = restarted.list_instances({TAG_CONTROLLER: provider.controller_id})
    assert [i.tags[TAG_DECISION] for i in listed] == [request.decision_id]
    assert restarted.billing(listed[0]).cost_usd == pytest.approx(provider.billing(first).cost_usd)


def test_spot_interruption_in_process(provider: AwsProvider, clock: FakeClock, sleeps: SleepRecorder) -> None:
    (request,) = requests_for(provider, "intr", [("us-east-1a", "g4dn.xlarge")])
    instance = provider.launch(request)
    assert [i.state for i in provider.poll()] == [InstanceState.RUNNING]
    notices: list[tuple[str, float]] = []
    deadline = mark_spot_interruption(instance.instance_id, notice_s=120, clock=clock,
                                      on_notice=lambda i, d: notices.append((i, d)))
    (noticed,) = provider.poll()
    assert noticed.state is InstanceState.NOTICE and noticed.interruption == "preemption"
    assert noticed.notice_deadline_s == pytest.approx(deadline, abs=0.01)
    assert notices == [(instance.instance_id, deadline)]
    assert provider.poll() == []
    clock.advance(120)
    complete_spot_interruption(instance.instance_id)
    (ended,) = provider.poll()
    assert ended.state is InstanceState.TERMINATED and ended.interruption == "preemption"
    assert ended.terminated_at_s is not None
    bill = provider.billing(ended)
    assert bill.cost_usd < bill.on_demand_cost_usd
    # A restarted controller cleaning up an hour later must not bill the hour: EC2 says when it ended.
    clock.advance(3600)
    restarted = make_test_provider(clock, sleeps, controller_id=provider.controller_id)
    restarted.terminate(instance.instance_id)
    (cleaned,) = restarted.list_instances({TAG_JOB: "intr"})
    assert restarted.billing(cleaned).billed_seconds < 600


def test_spot_interruption_server_mode_background(moto_server: Any, clock: FakeClock, sleeps: SleepRecorder) -> None:
    provider = make_provider(controller_id="ctl-intr", regions="us-east-1", zones="us-east-1a",
                             image_id="ami-12345678", spot_price_overrides={"g4dn.xlarge": 0.16},
                             retry=RetryPolicy(sleep=sleeps), clock=clock)
    (request,) = requests_for(provider, "intr-srv", [("us-east-1a", "g4dn.xlarge")])
    instance = provider.launch(request)
    waited: list[float] = []
    thread = deliver_spot_interruption(instance.instance_id, notice_s=120, sleep=waited.append, background=True)
    assert thread is not None
    thread.join(timeout=10)
    assert waited == [120]
    (ended,) = [i for i in provider.poll() if i.instance_id == instance.instance_id]
    assert ended.state is InstanceState.TERMINATED and ended.interruption == "preemption"


def test_interruption_reaches_the_agent_through_imds(moto_server: Any, clock: FakeClock,
                                                     sleeps: SleepRecorder) -> None:
    """The whole notice path of the issue: the harness marks the moto instance and serves the IMDSv2
    notice; the agent's IMDS client (``cloud_providers.remote.metadata``) sees a preemption with the
    same deadline the controller sees through ``poll``; then the instance ends with
    Server.SpotInstanceTermination."""
    from cloud_providers.remote.metadata import AwsImds
    from tests.fakes.imds import FakeMetadataServer

    provider = make_provider(controller_id="ctl-imds", regions="us-east-1", zones="us-east-1b",
                             image_id="ami-12345678", spot_price_overrides={"g5.xlarge": 0.36},
                             retry=RetryPolicy(sleep=sleeps))
    (request,) = requests_for(provider, "imds", [("us-east-1b", "g5.xlarge")])
    instance = provider.launch(request)
    with FakeMetadataServer(instance_id=instance.instance_id) as imds:
        agent_view = AwsImds(imds.endpoint)
        assert agent_view.check() is None
        thread = deliver_spot_interruption(instance.instance_id, notice_s=1.0, imds=imds, background=True)
        assert thread is not None
        deadline = time.time() + 5
        while agent_view.check() is None and time.time() < deadline:
            time.sleep(0.05)
        notice = agent_view.check()
        assert notice is not None
        (seen,) = [i for i in provider.poll() if i.instance_id == instance.instance_id]
        assert seen.state is InstanceState.NOTICE
        assert notice["reason"] == "preemption" and notice["deadline_unix_s"] is not None
        assert abs(notice["deadline_unix_s"] - (seen.notice_deadline_s or 0)) <= 1.5
        thread.join(timeout=10)
    (ended,) = [i for i in provider.poll() if i.instance_id == instance.instance_id]
    assert ended.state is InstanceState.TERMINATED and ended.interruption == "preemption"


def test_real_ec2_spot_notice_from_spot_request_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real EC2 marks the spot request ``marked-for-termination`` during the two-minute notice."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    client = boto3.client("ec2", region_name="us-east-1")
    marked = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    record = {"InstanceId": "i-0123456789abcdef0", "InstanceType": "g5.xlarge", "InstanceLifecycle": "spot",
              "SpotInstanceRequestId": "sir-1", "State": {"Name": "running", "Code": 16},
              "Placement": {"AvailabilityZone": "us-east-1a"}, "LaunchTime": marked - dt.timedelta(hours=1),
              "Tags": [{"Key": TAG_CONTROLLER, "Value": "ctl"}]}
    with Stubber(client) as stubber:
        stubber.add_response("describe_instances", {"Reservations": [{"Instances": [record]}]}, None)
        stubber.add_response("describe_spot_instance_requests", {"SpotInstanceRequests": [
            {"SpotInstanceRequestId": "sir-1", "InstanceId": "i-0123456789abcdef0",
             "Status": {"Code": "marked-for-termination", "UpdateTime": marked}}]},
            {"SpotInstanceRequestIds": ["sir-1"]})
        provider = AwsProvider(regions=["us-east-1"], controller_id="ctl", client_factory=lambda r: client,
                               clock=FakeClock())
        (noticed,) = provider.poll()
        assert noticed.state is InstanceState.NOTICE
        assert noticed.notice_deadline_s == marked.timestamp() + 120


def test_billing_is_per_second_with_a_minute_minimum(provider: AwsProvider, clock: FakeClock) -> None:
    (request,) = requests_for(provider, "bill", [("us-east-1a", "g4dn.xlarge")], market=ON_DEMAND)
    instance = provider.launch(request)
    assert provider.billing(instance).billed_seconds == 60.0
    clock.advance(3600)
    bill = provider.billing(instance)
    assert bill.billed_seconds == pytest.approx(clock.now_s - instance.launched_at_s)
    assert 3598 <= bill.billed_seconds <= 3602
    assert bill.cost_usd == pytest.approx(bill.billed_seconds * 0.526 / 3600)


def test_boot_config_round_trips_through_user_data(moto_in_process: None, clock: FakeClock,
                                                  sleeps: SleepRecorder) -> None:
    hostile = {"job_id": "j", "run": "python train.py; $(rm -rf /)", "setup": "echo '\"\n`id`"}
    provider = make_test_provider(clock, sleeps, boot_config_for=lambda request: hostile)
    instance = provider.launch(request_factory(provider)(job="boot", market=SPOT))
    assert provider.boot_config(instance) == hostile


def test_make_provider_validates_settings(aws_env: None) -> None:
    with pytest.raises(ValueError, match="unknown AWS provider setting.*colour"):
        make_provider(controller_id="c", colour="red")
    with pytest.raises(ValueError, match="controller_id"):
        make_provider()
    with pytest.raises(ValueError, match="zones"):
        make_provider(controller_id="c", regions="us-east-1", zones="eu-west-1a")
    provider = make_provider(controller_id="c", regions="us-east-1, us-west-2", security_group_ids="sg-1,sg-2")
    assert provider.regions == ("us-east-1", "us-west-2")
    assert provider.image_id.startswith("resolve:ssm:/aws/service/deeplearning/")


def test_make_provider_reads_the_environment(moto_in_process: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller calls ``make_provider(controller_id=...)`` only; the rest comes from the env."""
    monkeypatch.setenv("SPOTRAIN_AWS_REGIONS", "us-west-2")
    monkeypatch.setenv("SPOTRAIN_AWS_ZONES", "us-west-2b")
    monkeypatch.setenv("SPOTRAIN_AWS_SPOT_PRICES", '{"g5.xlarge": 0.3621, "us-west-2b/g6.xlarge": 0.33}')
    monkeypatch.setenv("SPOTRAIN_AWS_IMAGE_ID", "ami-0abcdef1234567890")
    provider = make_provider(controller_id="ctl-env")
    assert (provider.regions, provider.zones, provider.image_id) == (
        ("us-west-2",), frozenset({"us-west-2b"}), "ami-0abcdef1234567890")
    prices = {o.instance_type: o.spot_price_usd_per_hour for o in provider.offerings()}
    assert prices["g5.xlarge"] == 0.3621 and prices["g6.xlarge"] == 0.33
    monkeypatch.setenv("SPOTRAIN_AWS_SPOT_PRICES", "[1, 2]")
    with pytest.raises(ValueError, match="SPOTRAIN_AWS_SPOT_PRICES"):
        make_provider(controller_id="ctl-env")


def test_offering_from_another_provider_is_rejected(provider: AwsProvider) -> None:
    from cloud_providers.errors import InvalidRequest

    gcp = Offering(cloud="gcp", region="us-central1", zone="us-central1-a", instance_type="n1-standard-8",
                   accelerator="T4", gpus=1, on_demand_price_usd_per_hour=0.73, spot_price_usd_per_hour=0.2)
    with pytest.raises(InvalidRequest, match="not an AWS offering"):
        provider.launch(LaunchRequest(offering=gcp, market=SPOT, decision_id="d", tags={}))




def test_iam_policy_in_docs_allows_every_call_the_provider_makes(moto_in_process: None, clock: FakeClock,
                                                                 sleeps: SleepRecorder) -> None:
    """The least-privilege policy in docs/aws.md must keep up with the code: run a whole lifecycle,
    record each EC2 operation called, and find it in the policy."""
    import json
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "aws.md").read_text()
    policy = json.loads(re.search(r"```json\n(.*?)```", doc, re.S).group(1))  # type: ignore[union-attr]
    allowed = set()
    for statement in policy["Statement"]:
        actions = statement["Action"]
        allowed.update([actions] if isinstance(actions, str) else actions)
    called: set[str] = set()
    factory = boto_factory()

    def recording(region: str) -> Any:
        client = factory(region)
        client.meta.events.register("before-call.ec2.*", lambda model, **_: called.add(f"ec2:{model.name}"))
        return client

    provider = make_test_provider(clock, sleeps, client_factory=recording, spot_price_overrides={})
    instance = provider.launch(request_factory(provider)(job="iam", market=SPOT))
    provider.poll()
    provider.list_instances({TAG_JOB: "iam"})
    provider.boot_config(instance)
    provider.terminate(instance.instance_id)
    assert {"ec2:RunInstances", "ec2:DescribeSpotPriceHistory", "ec2:TerminateInstances"} <= called
    assert called <= allowed, f"missing from docs/aws.md policy: {sorted(called - allowed)}"
    assert "ec2:DescribeSpotInstanceRequests" in allowed  # called on real EC2 only (spot request status)
