"""The provider contract suite: what every cloud provider (local, AWS, GCP) must do for the controller.

Subclass ``ProviderContract`` in a test module (name the subclass ``Test...``) and provide three
fixtures, usually as methods of the subclass or in the module:

``provider``
    A fresh object satisfying ``cloud_providers.base.Provider``. Tests isolate themselves by unique
    job tags, so a provider may share a cloud with other tests.
``launch_request_factory``
    ``factory(*, job: str, market: str, decision_id: str | None = None) -> LaunchRequest`` for an
    offering of ``provider`` that supports ``market`` (spot offerings need a spot price). The request's
    tags must include ``spotrain-job = job`` and the controller, market and decision tags; a None
    ``decision_id`` means a fresh one.
``advance_time``
    ``advance(seconds: float) -> None``: make at least that much time pass on the provider's clock
    (an injected fake clock, compressed market time or, failing those, a real sleep).

A provider that can't be made to fail on demand still has to pass ``test_errors_are_provider_errors``,
which launches an offering in a zone that does not exist.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import pytest

from cloud_providers.base import (
    ON_DEMAND,
    SPOT,
    TAG_CONTROLLER,
    TAG_DECISION,
    TAG_JOB,
    TAG_MARKET,
    Billing,
    InstanceState,
    LaunchRequest,
    Provider,
)
from cloud_providers.catalog import ACCELERATORS, CLOUDS, find
from cloud_providers.errors import ProviderError

RequestFactory = Callable[..., LaunchRequest]
Advance = Callable[[float], None]

LIVE = (InstanceState.PENDING, InstanceState.RUNNING)


def _job() -> str:
    return f"contract-{uuid.uuid4().hex[:10]}"


def _ids(instances: object) -> set[str]:
    return {i.instance_id for i in instances}  # type: ignore[attr-defined]


class ProviderContract:
    """Provider-agnostic tests; see the module docstring for the fixtures a subclass provides."""

    def test_is_a_provider(self, provider: Provider) -> None:
        assert isinstance(provider, Provider)
        assert provider.name in CLOUDS
        assert provider.now_s() >= 0  # market clocks start at 0

    def test_offerings_are_well_formed(self, provider: Provider) -> None:
        offerings = provider.offerings()
        assert offerings, "a provider must offer something"
        keys = [o.key for o in offerings]
        assert len(keys) == len(set(keys)), "offering keys must be unique"
        for o in offerings:
            assert o.cloud in CLOUDS
            assert o.accelerator in ACCELERATORS, o
            assert o.gpus >= 1, o
            assert find(o.cloud, o.instance_type, o.accelerator) is not None, f"{o.key} not in the catalog"
            assert o.on_demand_price_usd_per_hour > 0, o
            assert o.spot_price_usd_per_hour is None or o.spot_price_usd_per_hour > 0, o
            assert o.spot_available is None or o.spot_available >= 0, o
            assert o.notice_seconds > 0, o

    @pytest.mark.parametrize("market", [SPOT, ON_DEMAND])
    def test_launch_returns_live_tagged_instance(
        self, provider: Provider, launch_request_factory: RequestFactory, market: str
    ) -> None:
        request = launch_request_factory(job=_job(), market=market)
        before_s = provider.now_s()
        instance = provider.launch(request)
        assert instance.state in LIVE
        assert instance.alive
        assert instance.market == market
        assert instance.zone == request.offering.zone
        assert instance.instance_type == request.offering.instance_type
        assert instance.offering_key == request.offering.key
        for key, value in request.tags.items():
            assert instance.tags.get(key) == value, f"tag {key} missing or changed"
        for key in (TAG_JOB, TAG_CONTROLLER, TAG_MARKET, TAG_DECISION):
            assert key in instance.tags
        # Clouds stamp launch times to the second.
        assert instance.launched_at_s <= provider.now_s() + 1.0
        assert instance.launched_at_s >= before_s - 5.0

    def test_launch_is_idempotent_on_decision_id(
        self, provider: Provider, launch_request_factory: RequestFactory
    ) -> None:
        job = _job()
        request = launch_request_factory(job=job, market=SPOT)
        first = provider.launch(request)
        second = provider.launch(request)
        assert second.instance_id == first.instance_id
        assert _ids(provider.list_instances({TAG_JOB: job})) == {first.instance_id}
        other = provider.launch(launch_request_factory(job=job, market=SPOT))
        assert other.instance_id != first.instance_id, "a new decision must launch a new instance"

    def test_list_instances_filters_by_tags(self, provider: Provider, launch_request_factory: RequestFactory) -> None:
        job_a, job_b = _job(), _job()
        a = provider.launch(launch_request_factory(job=job_a, market=SPOT))
        b = provider.launch(launch_request_factory(job=job_b, market=ON_DEMAND))
        listed_a = provider.list_instances({TAG_JOB: job_a})
        assert _ids(listed_a) == {a.instance_id}
        assert all(i.tags[TAG_JOB] == job_a for i in listed_a)
        assert _ids(provider.list_instances({TAG_JOB: job_b, TAG_MARKET: ON_DEMAND})) == {b.instance_id}
        assert not provider.list_instances({TAG_JOB: job_b, TAG_MARKET: SPOT})
        assert not provider.list_instances({TAG_JOB: _job()})

    def test_terminate_is_idempotent(self, provider: Provider, launch_request_factory: RequestFactory) -> None:
        job = _job()
        instance = provider.launch(launch_request_factory(job=job, market=SPOT))
        provider.terminate(instance.instance_id)
        provider.terminate(instance.instance_id)
        listed = provider.list_instances({TAG_JOB: job})
        assert all(i.state is InstanceState.TERMINATED for i in listed), listed
        assert all(i.terminated_at_s is not None and i.terminated_at_s >= i.launched_at_s for i in listed)

    def test_poll_reports_each_change_once(self, provider: Provider, launch_request_factory: RequestFactory) -> None:
        instance = provider.launch(launch_request_factory(job=_job(), market=ON_DEMAND))
        provider.poll()
        provider.terminate(instance.instance_id)
        changed = [i for i in provider.poll() if i.instance_id == instance.instance_id]
        assert [i.state for i in changed] == [InstanceState.TERMINATED]
        assert instance.instance_id not in _ids(provider.poll())

    def test_billing(self, provider: Provider, launch_request_factory: RequestFactory, advance_time: Advance) -> None:
        instance = provider.launch(launch_request_factory(job=_job(), market=SPOT))
        first = provider.billing(instance)
        _check_bill(first)
        advance_time(120.0)
        later = provider.billing(instance)
        _check_bill(later)
        assert later.billed_seconds >= first.billed_seconds
        assert later.cost_usd >= first.cost_usd
        assert later.billed_seconds > 0 and later.cost_usd > 0
        provider.terminate(instance.instance_id)
        (ended,) = [i for i in provider.list_instances({TAG_DECISION: instance.tags[TAG_DECISION]})
                    if i.instance_id == instance.instance_id]
        final = provider.billing(ended)
        assert final.cost_usd >= later.cost_usd
        advance_time(600.0)
        assert provider.billing(ended) == final, "a terminated instance's bill must stop growing"

    def test_on_demand_bill_equals_its_on_demand_cost(
        self, provider: Provider, launch_request_factory: RequestFactory, advance_time: Advance
    ) -> None:
        instance = provider.launch(launch_request_factory(job=_job(), market=ON_DEMAND))
        advance_time(60.0)
        bill = provider.billing(instance)
        _check_bill(bill)
        assert bill.cost_usd == pytest.approx(bill.on_demand_cost_usd)

    def test_errors_are_provider_errors(self, provider: Provider, launch_request_factory: RequestFactory) -> None:
        request = launch_request_factory(job=_job(), market=ON_DEMAND)
        nowhere = dataclasses.replace(request.offering, zone=f"{request.offering.region}-nowhere")
        with pytest.raises(ProviderError):
            provider.launch(dataclasses.replace(request, offering=nowhere))


def _check_bill(bill: Billing) -> None:
    assert bill.billed_seconds >= 0
    assert bill.cost_usd >= 0
    assert bill.on_demand_cost_usd >= bill.cost_usd - 1e-12

