"""The spotrain policy as the controller calls it: quickstart behaviour, budget, purity, latency."""

from __future__ import annotations

import dataclasses
import time

import pytest
from conftest import make_spec

from autoscaler.jobs.domain import Outcome
from autoscaler.policy import Held, JobView, PolicyInput, get_policy
from autoscaler.policy.spotrain import SpotrainPolicy
from cloud_providers.base import ON_DEMAND, SPOT, Offering
from cloud_providers.local.market import MarketTrace


def quickstart_spec():  # type: ignore[no-untyped-def]
    return make_spec(resources={"accelerators": ["T4:1"], "clouds": ["aws", "gcp"], "spot": "auto"},
                     workers={"min": 1, "max": 2}, training={"logical_workers": 2, "global_batch_size": 64},
                     objective={"budget_usd": 5}, simulate={"work_gpu_hours": 1.0})


def _decide(job: JobView, offerings, now: float = 0.0):  # type: ignore[no-untyped-def]
    return get_policy("default").decide(PolicyInput(now_s=now, jobs=[job], offerings=offerings))[0]


def test_default_is_spotrain_and_cheapest_remains() -> None:
    assert isinstance(get_policy("default"), SpotrainPolicy)
    assert get_policy("cheapest").name == "cheapest"
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")


def test_quickstart_two_spot_workers_then_replacement_then_on_demand() -> None:
    trace = MarketTrace.bundled()
    offers = trace.offerings_at(0)
    job = JobView("q", quickstart_spec(), submitted_s=0, progress=0.0)
    a = _decide(job, offers)
    cheapest = min((o for o in offers if o.accelerator == "T4" and (o.spot_available or 0) >= 2),
                   key=lambda o: o.spot_price_usd_per_hour)
    assert a.outcome is None
    assert [(p.offering_key, p.market, p.instances) for p in a.placements] == [(cheapest.key, SPOT, 2)]
    # At 600 s the market takes one back: replace it with the next best spot offering with room.
    offers = trace.offerings_at(600)
    held = (Held(cheapest.key, SPOT, 1),)
    b = _decide(dataclasses.replace(job, held=held, progress=0.2, restarting=True), offers, 600)
    assert b.workers({o.key: o for o in offers}) == 2
    assert all(p.market == SPOT for p in b.placements)
    assert any(p.offering_key == cheapest.key for p in b.placements)
    # No spot room anywhere: on demand.
    no_spot = [dataclasses.replace(o, spot_available=0) for o in offers]
    c = _decide(dataclasses.replace(job, held=(), progress=0.2), no_spot, 600)
    assert c.placements and all(p.market == ON_DEMAND for p in c.placements)


def test_keeps_its_allocation_without_a_reason_to_move() -> None:
    offers = MarketTrace.bundled().offerings_at(0)
    job = JobView("q", quickstart_spec(), submitted_s=0, progress=0.1)
    first = _decide(job, offers)
    held = tuple(Held(p.offering_key, p.market, p.instances) for p in first.placements)
    # A slightly cheaper offering appears elsewhere: not worth a restart.
    cheaper = [dataclasses.replace(o, spot_price_usd_per_hour=o.spot_price_usd_per_hour * 0.97)
               if o.key != first.placements[0].offering_key and o.spot_price_usd_per_hour else o for o in offers]
    again = _decide(dataclasses.replace(job, held=held), cheaper, 60)
    assert again.placements == first.placements


def test_budget_fails_early_with_a_clear_reason() -> None:
    offers = MarketTrace.bundled().offerings_at(0)
    spec = make_spec(resources={"accelerators": ["T4:1"], "clouds": ["aws"]}, objective={"budget_usd": 5},
                     simulate={"work_gpu_hours": 400})
    a = _decide(JobView("b", spec, submitted_s=0, progress=0.0), offers)
    assert a.outcome is Outcome.BUDGET and "$" in a.reason and a.placements == ()
    # Nearly spent: finishing cannot fit any more.
    small = make_spec(resources={"accelerators": ["T4:1"], "clouds": ["aws"]}, objective={"budget_usd": 5},
                      simulate={"work_gpu_hours": 1})
    b = _decide(JobView("b", small, submitted_s=0, progress=0.5, cost_so_far_usd=4.99999), offers)
    assert b.outcome is Outcome.BUDGET


def test_budget_that_only_spot_fits_waits_for_spot_room_instead_of_failing() -> None:
    t4 = Offering("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "T4", 1, 0.526, 0.158, spot_available=2)
    spec = make_spec(resources={"accelerators": ["T4:1"], "clouds": ["aws"]}, objective={"budget_usd": 6},
                     simulate={"work_gpu_hours": 10})
    job = JobView("w", spec, submitted_s=0, progress=0.0, restart_overhead_s=300)
    # 10 V100-hours are 25 T4-hours: $6 covers them on spot ($3.96) but not on demand ($13.15); no
    # spot room at the moment is no reason to fail.
    out = _decide(job, [dataclasses.replace(t4, spot_available=0)])
    assert out.outcome is None and out.placements == () and "waiting for spot room" in out.reason
    assert out.next_decision_s is not None
    back = _decide(job, [t4])
    assert [(p.offering_key, p.market) for p in back.placements] == [(t4.key, SPOT)]
    # A budget between the cost without preemptions and the expected one still runs (it fails only
    # once finishing without further preemptions no longer fits).
    tight = make_spec(resources={"accelerators": ["T4:1"], "clouds": ["aws"]}, objective={"budget_usd": 3.99},
                      simulate={"work_gpu_hours": 10})
    run = _decide(JobView("t", tight, submitted_s=0, progress=0.0, restart_overhead_s=300), [t4])
    assert run.outcome is None and [(p.offering_key, p.market) for p in run.placements] == [(t4.key, SPOT)]


def test_deadline_behind_goes_on_demand_when_no_spot() -> None:
    offers = [dataclasses.replace(o, spot_available=0) for o in MarketTrace.bundled().offerings_at(0)]
    spec = make_spec(objective={"deadline": "10h"}, simulate={"work_gpu_hours": 9})
    # One hour of slack: wait for spot while the slack is above the reserve (Safety Net + a restart
    # cycle per expected preemption), then progress on demand from the wake-up time on.
    first = _decide(JobView("d", spec, submitted_s=0, progress=0.0), offers)
    assert first.placements == () and first.next_decision_s is not None and 0 < first.next_decision_s < 3600
    a = _decide(JobView("d", spec, submitted_s=0, progress=0.0), offers, first.next_decision_s)
    assert a.placements and all(p.market == ON_DEMAND for p in a.placements)
    relaxed = make_spec(objective={"deadline": "48h"}, simulate={"work_gpu_hours": 3})
    b = _decide(JobView("d", relaxed, submitted_s=0, progress=0.0), offers)
    assert b.placements == () and b.next_decision_s is not None  # waits for spot, knows when to re-check


def _synthetic(n_offers: int) -> list[Offering]:
    accs = ["T4", "V100", "A10G", "L4"]
    out = []
    for i in range(n_offers):
        acc = accs[i % 4]
        out.append(Offering("aws", f"r{i % 5}", f"r{i % 5}-z{i}", f"type-{i}", acc, 1 + (i % 2) * 3, 1.0 + i % 7,
                            0.3 + (i % 11) / 20, spot_available=i % 6))
    return out


def test_joint_allocation_respects_room_quotas_and_spend() -> None:
    offers = _synthetic(20)
    spec = make_spec(resources={"accelerators": ["T4:1", "T4:4"], "clouds": ["aws"]}, workers={"min": 1, "max": 4},
                     training={"logical_workers": 4, "global_batch_size": 64}, objective={})
    jobs = [JobView(f"j{i}", spec, submitted_s=0, progress=0.0) for i in range(30)]
    inp = PolicyInput(now_s=0, jobs=jobs, offerings=offers, region_quota_instances={"r0": 3}, max_spend_usd_per_hour=20.0)
    allocs = SpotrainPolicy().decide(inp)
    by_key = {o.key: o for o in offers}
    used: dict[str, int] = {}
    region: dict[str, int] = {}
    spend = 0.0
    for a in allocs:
        for p in a.placements:
            o = by_key[p.offering_key]
            if p.market == SPOT:
                used[p.offering_key] = used.get(p.offering_key, 0) + p.instances
            region[o.region] = region.get(o.region, 0) + p.instances
            spend += o.price_usd_per_hour(p.market) * p.instances
    assert all(n <= (by_key[k].spot_available or 0) for k, n in used.items())
    assert region.get("r0", 0) <= 3
    assert spend <= 20.0 + 1e-9
    assert any(a.placements for a in allocs) and any(not a.placements for a in allocs)


def test_pure_and_deterministic() -> None:
    offers = _synthetic(30)
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, workers={"min": 1, "max": 4},
                     training={"logical_workers": 4, "global_batch_size": 64})
    jobs = [JobView(f"j{i}", spec, submitted_s=0, progress=i / 40) for i in range(20)]
    inp = PolicyInput(now_s=3600, jobs=jobs, offerings=offers)
    assert SpotrainPolicy().decide(inp) == SpotrainPolicy().decide(inp)


def test_thousand_jobs_decided_quickly() -> None:
    offers = _synthetic(100)
    specs = [make_spec(resources={"accelerators": [a], "clouds": ["aws"]}, workers={"min": 1, "max": 4},
                       training={"logical_workers": 4, "global_batch_size": 64}, objective={"deadline": "30h"})
             for a in ("T4:1", "V100:1", "A10G:1", "L4:4")]
    jobs = [JobView(f"j{i}", specs[i % 4], submitted_s=0, progress=(i % 10) / 10) for i in range(1000)]
    inp = PolicyInput(now_s=600, jobs=jobs, offerings=offers)
    t0 = time.perf_counter()
    allocs = SpotrainPolicy().decide(inp)
    elapsed = time.perf_counter() - t0
    assert len(allocs) == 1000
    assert elapsed < 2.0, elapsed  # < 1 s on an idle core (benchmarks/policy_latency.py); slack for CI


def test_reserve_follows_the_measured_restart_overhead() -> None:
    """The slack kept before leaving spot-waiting scales with the job's own restart time: with cheap
    restarts the job keeps waiting for spot where one with slow restarts already runs on demand."""
    offers = [dataclasses.replace(o, spot_available=0) for o in MarketTrace.bundled().offerings_at(0)]
    spec = make_spec(objective={"deadline": "24h"}, simulate={"work_gpu_hours": 22})
    slow = _decide(JobView("d", spec, submitted_s=0, progress=0.0, restart_overhead_s=1800), offers)
    fast = _decide(JobView("d", spec, submitted_s=0, progress=0.0, restart_overhead_s=60), offers)
    assert slow.placements and all(p.market == ON_DEMAND for p in slow.placements)
    assert fast.placements == () and fast.next_decision_s is not None


def test_running_spot_gang_is_not_moved_for_a_guess() -> None:
    """Exploitation: an intact spot gang stays when another spot offering is only a little cheaper."""
    offers = MarketTrace.bundled().offerings_at(0)
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]}, objective={"deadline": "24h"},
                     simulate={"work_gpu_hours": 12})
    v100 = [o for o in offers if o.accelerator == "V100" and o.gpus == 1 and (o.spot_available or 0) > 0]
    dearest = max(v100, key=lambda o: o.spot_price_usd_per_hour)
    job = JobView("s", spec, submitted_s=0, progress=0.2, held=(Held(dearest.key, SPOT, 1),))
    cheaper = [dataclasses.replace(o, spot_price_usd_per_hour=dearest.spot_price_usd_per_hour * 0.97)
               if o in v100 and o != dearest else o for o in offers]
    a = _decide(job, cheaper, 3600)
    assert [(p.offering_key, p.market) for p in a.placements] == [(dearest.key, SPOT)]


def test_leaves_on_demand_for_an_established_run_only_when_slack_is_short() -> None:
    """With slack for one more restart beyond the Safety Net but not a full cycle, a job on demand
    goes back to spot only for a run that has lasted a while (Lindy), not for one that just began."""
    from autoscaler.policy import MarketHistory

    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": "24h"},
                     simulate={"work_gpu_hours": 22.5})
    old = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 3.06, 0.95, spot_available=2)
    new = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "V100", 1, 3.06, 0.90, spot_available=2)
    now = 3600.0  # 23 h left, 22.5 h of work: 30 min of slack, d = 12 min
    job = JobView("o", spec, submitted_s=0, progress=0.0, held=(Held(old.key, ON_DEMAND, 1),), restart_overhead_s=720)
    hist = {old.key: MarketHistory(old.key, available_since_s=now - 3 * 3600),
            new.key: MarketHistory(new.key, available_since_s=now - 600)}
    pol = get_policy("default")
    a = pol.decide(PolicyInput(now_s=now, jobs=[job], offerings=[old, new], history=hist))[0]
    assert [(p.offering_key, p.market) for p in a.placements] == [(old.key, SPOT)]
    only_fresh = [dataclasses.replace(old, spot_available=0), new]
    b = pol.decide(PolicyInput(now_s=now, jobs=[job], offerings=only_fresh, history=hist))[0]
    assert [(p.offering_key, p.market) for p in b.placements] == [(old.key, ON_DEMAND)]


def test_moves_to_a_much_cheaper_long_run_even_with_moderate_slack() -> None:
    """A gang on a dear zone moves to a zone 23 % cheaper whose run has lasted 2 h when the saving
    pays many restarts, although the slack (2.3 h at fraction 0.9) is short of the usual cushion;
    a small saving does not move it."""
    from autoscaler.policy import MarketHistory

    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]}, objective={"deadline": "24h"},
                     simulate={"work_gpu_hours": 21.6})
    dear = Offering("aws", "us-west-2", "us-west-2b", "p3.2xlarge", "V100", 1, 3.06, 1.09, spot_available=3)
    cheap = Offering("gcp", "us-central1", "us-central1-a", "n1-standard-8", "V100", 1, 2.86, 0.84, spot_available=3)
    now, watched = 10 * 3600.0, 500 * 3600.0
    hist = {dear.key: MarketHistory(dear.key, watched_s=watched, available_s_at_least=(0.4 * watched,), drops=83,
                                    available_since_s=now - 20 * 3600),
            cheap.key: MarketHistory(cheap.key, watched_s=watched, available_s_at_least=(0.76 * watched,), drops=119,
                                     available_since_s=now - 2.2 * 3600)}
    job = JobView("m", spec, submitted_s=0, progress=0.46, held=(Held(dear.key, SPOT, 1),), restart_overhead_s=720)
    pol = get_policy("default")

    def where(offers: list[Offering]) -> list[tuple[str, str]]:
        a = pol.decide(PolicyInput(now_s=now, jobs=[job], offerings=offers, history=hist, decision_interval_s=300))[0]
        return [(p.offering_key, p.market) for p in a.placements]

    assert where([dear, cheap]) == [(cheap.key, SPOT)]
    assert where([dear, dataclasses.replace(cheap, spot_price_usd_per_hour=1.04)]) == [(dear.key, SPOT)]


def test_a_market_that_refused_capacity_is_not_asked_for_more_during_the_back_off() -> None:
    """The job holds one instance where a launch for a second just failed: it keeps that one and
    does not retry the same market on every decision until the back-off has passed."""
    from autoscaler.policy.jobmath import CAPACITY_BACKOFF_S

    t4 = Offering("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "T4", 1, 0.526, 0.158, spot_available=4)
    spec = make_spec(resources={"accelerators": ["T4:1"], "clouds": ["aws"], "spot": "always"}, workers={"min": 1, "max": 2},
                     training={"logical_workers": 2, "global_batch_size": 64}, objective={}, simulate={"work_gpu_hours": 4})
    now = 10_000.0
    # Provisioning: one instance up, the launch of the second refused (the gang has not started yet).
    job = JobView("c", spec, submitted_s=0, progress=0.1, held=(Held(t4.key, SPOT, 1),), restarting=True,
                  recent_capacity_failures={t4.key + "|" + SPOT: now - 5})
    a = _decide(job, [t4], now)
    assert [(p.offering_key, p.market, p.instances) for p in a.placements] == [(t4.key, SPOT, 1)]
    # The same market, after the back-off, for a gang starting afresh: both workers there again.
    fresh = dataclasses.replace(job, held=(), restarting=True)
    later = _decide(fresh, [t4], now - 5 + CAPACITY_BACKOFF_S + 1)
    assert [(p.offering_key, p.market, p.instances) for p in later.placements] == [(t4.key, SPOT, 2)]


def test_every_market_refusing_capacity_is_no_reason_to_fail_the_budget() -> None:
    """Right after a round of capacity refusals nothing is usable for a while; a spot-only job with
    a budget waits for the back-off instead of being failed as if finishing cost infinitely much."""
    t4 = Offering("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "T4", 1, 0.526, 0.158, spot_available=4)
    spec = make_spec(resources={"accelerators": ["T4:1"], "clouds": ["aws"], "spot": "always"}, objective={"budget_usd": 5},
                     simulate={"work_gpu_hours": 1})
    now = 10_000.0
    job = JobView("r", spec, submitted_s=0, progress=0.5, restarting=True, cost_so_far_usd=0.06,
                  recent_capacity_failures={t4.key + "|" + SPOT: now - 5})
    a = _decide(job, [t4], now)
    assert a.outcome is None and a.placements == ()
