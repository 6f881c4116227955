"""Each baseline against a trajectory worked out by hand on a small hand-written trace (issue 15).

The policies are driven through ``decide`` by a deliberately simple stepper: one decision at the top
of every hour, the trace gives each offering's spot room for that hour, and

- a spot gang bigger than its offering's room this hour is preempted before the decision (the
  policy sees the gang broken or gone, and the offering's preemption count grows by one);
- an allocation kept from the previous hour runs the whole hour: +1 h of work;
- a new allocation (a switch, or a relaunch after a preemption) loses the restart overhead ``d``
  first: +(1 - d) h;
- idle: +0.

Every job is a 1-GPU-hour-per-hour V100 job submitted at 0 (linear scaling), so work and time are in
the same unit. ``decision_interval_s`` is one hour, so every Safety Net margin is ``2d + 1 h``.
"""

from __future__ import annotations

from collections.abc import Sequence

from conftest import make_spec

from autoscaler.jobs.spec import JobSpec
from autoscaler.policy import Held, JobView, MarketHistory, PolicyInput, get_policy
from autoscaler.policy.base import Policy
from cloud_providers.base import ON_DEMAND, SPOT, Offering

H = 3600.0
D_H = 0.25  # restart overhead d, hours
IDLE = "idle"


def _offering(zone: str, region: str, spot_usd: float, room: int) -> Offering:
    return Offering("aws", region, zone, "p3.2xlarge", "V100", 1, 3.06, spot_usd, spot_available=room)


def _run(policy: Policy, spec: JobSpec, zones: Sequence[tuple[str, str, float]], room: Sequence[Sequence[int]],
         gang: int = 1) -> tuple[list[str], list[float]]:
    """Decisions ('idle', 'on-demand' or the spot zone) at hours 0, 1, ... until the work is done, and
    the progress (hours of work) after each hour."""
    work_h = spec.simulate.work_gpu_hours / gang
    done, held, last = 0.0, (), None
    preempted: dict[str, int] = {}
    out, progress = [], []
    for t, row in enumerate(room):
        offers = [_offering(z, r, p, n) for (z, r, p), n in zip(zones, row)]
        by_key = {o.key: o for o in offers}
        if held and held[0].market == SPOT and held[0].instances > (by_key[held[0].offering_key].spot_available or 0):
            k = held[0].offering_key
            preempted[k] = preempted.get(k, 0) + 1
            left = by_key[k].spot_available or 0
            held = (Held(k, SPOT, left),) if left else ()
        job = JobView("j", spec, submitted_s=0.0, progress=done / work_h, held=held, restart_overhead_s=D_H * H)
        history = {k: MarketHistory(k, preemptions=n) for k, n in preempted.items()}
        a = policy.decide(PolicyInput(now_s=t * H, jobs=[job], offerings=offers, history=history,
                                      decision_interval_s=H))[0]
        placement = a.placements[0] if a.placements else None
        if placement is None:
            out.append(IDLE)
            held = ()
        else:
            assert placement.instances == gang  # Polarization: the whole gang or nothing
            kept = bool(held) and held[0].offering_key == placement.offering_key and held[0].market == placement.market \
                and held[0].instances == placement.instances
            done += 1.0 if kept else 1.0 - D_H
            held = (Held(placement.offering_key, placement.market, placement.instances),)
            out.append(ON_DEMAND if placement.market == ON_DEMAND else by_key[placement.offering_key].zone)
        last = out[-1]
        progress.append(round(min(done, work_h), 6))
        if done >= work_h - 1e-9:
            break
    assert last is not None
    return out, progress


def test_uniform_progress_hand_trajectory_single_zone() -> None:
    # C(0) = 5 h of work, R(0) = 10 h: ep(t) = 0.5 t; d = 0.25 h, so the hysteresis target is
    # ep(t + 2d) = 0.5 t + 0.25 and the Safety Net trips when R(t) <= C(t) + 2d + 1 h = C(t) + 1.5.
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": "10h"},
                     simulate={"work_gpu_hours": 5.0, "scaling": "linear"})
    zones = [("us-east-1a", "us-east-1", 0.90)]
    room = [[1], [1], [0], [0], [0], [0], [0], [1], [1], [1]]
    got, progress = _run(get_policy("uniform-progress"), spec, zones, room)
    expected = [
        "us-east-1a",  # t=0 idle, spot has room: Taking Risks -> spot; new: +0.75 -> cp 0.75
        "us-east-1a",  # t=1 on spot, not preempted: Exploitation, stay; +1 -> 1.75
        IDLE,          # t=2 preempted; ep(2) = 1.0 < cp 1.75 (ahead), R 8 > C 3.25 + 1.5, no spot: wait
        IDLE,          # t=3 ep(3) = 1.5 < 1.75: still ahead, wait
        ON_DEMAND,     # t=4 ep(4) = 2.0 > 1.75: behind, no spot -> on-demand (rule 1); +0.75 -> 2.5
        ON_DEMAND,     # t=5 on on-demand, ep(5.5) = 2.75 > 2.5: hysteresis, stay; +1 -> 3.5
        ON_DEMAND,     # t=6 ep(6.5) = 3.25 <= 3.5: caught up, but no spot: STAY on on-demand (the
                       #     paper's state machine has no on-demand -> idle edge; the old baseline went
                       #     idle here and paid d again later); +1 -> 4.5
        "us-east-1a",  # t=7 caught up (ep(7.5) = 3.75 <= 4.5) and spot has room -> spot; +0.75 -> 5.25 >= 5
    ]
    assert got == expected
    assert progress == [0.75, 1.75, 1.75, 1.75, 2.5, 3.5, 4.5, 5.0]
    # Safety Net never tripped: at t = 5 / 6 / 7, R = 5 / 4 / 3 > C + 1.5 = 4.0 / 3.0 / 2.0.


def test_uniform_progress_polarization_gang() -> None:
    # The same job as 4 x 1 GPU (20 GPU-hours at 4 GPU-hours per hour: C(0) = 5 h again). Polarization:
    # room for 3 of the 4 is "no spot"; a gang that loses one instance is broken, i.e. idle.
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": "10h"},
                     workers={"min": 4, "max": 4}, training={"logical_workers": 4, "global_batch_size": 256},
                     simulate={"work_gpu_hours": 20.0, "scaling": "linear"})
    zones = [("us-east-1a", "us-east-1", 0.90)]
    room = [[4], [5], [3], [2], [3], [0], [3], [4], [4], [4]]
    got, progress = _run(get_policy("uniform-progress"), spec, zones, room, gang=4)
    # Hour by hour the same arithmetic as the single-instance test: the gang maps to one instance.
    assert got == ["us-east-1a", "us-east-1a", IDLE, IDLE, ON_DEMAND, ON_DEMAND, ON_DEMAND, "us-east-1a"]
    assert progress == [0.75, 1.75, 1.75, 1.75, 2.5, 3.5, 4.5, 5.0]


def test_greedy_spot_hand_trajectory_eager_next_region() -> None:
    # SkyPilot's default recovery, EAGER_NEXT_REGION: after a preemption relaunch in another region
    # first (cheapest first), else anywhere; never leave a running spot for a cheaper one; plus the
    # Safety Net: C(0) = 6 h, R(0) = 10 h, d = 0.25 h, trips when idle and R(t) <= C(t) + 1.5.
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": "10h"},
                     simulate={"work_gpu_hours": 6.0, "scaling": "linear"})
    # Spot prices: R1Z1 < R1Z2 < R2 (us-east-1a, us-east-1b, us-west-2b).
    zones = [("us-east-1a", "us-east-1", 0.90), ("us-east-1b", "us-east-1", 0.95), ("us-west-2b", "us-west-2", 1.00)]
    room = [
        [1, 1, 1],  # t=0
        [0, 1, 1],  # t=1
        [1, 1, 1],  # t=2
        [1, 1, 0],  # t=3
        [0, 1, 0],  # t=4
        [0, 0, 0],  # t=5
        [0, 0, 0],  # t=6
        [0, 0, 0],  # t=7
        [1, 1, 1],  # t=8
        [1, 1, 1],  # t=9
    ]
    got, progress = _run(get_policy("greedy-spot"), spec, zones, room)
    expected = [
        "us-east-1a",  # t=0 cheapest spot with room; +0.75 -> 0.75
        "us-west-2b",  # t=1 preempted in us-east-1: the next region, although us-east-1b is cheaper
                       #     (FAILOVER would take it); +0.75 -> 1.5
        "us-west-2b",  # t=2 running: stay, although us-east-1a has room again and is cheaper; +1 -> 2.5
        "us-east-1a",  # t=3 preempted in us-west-2: the cheapest elsewhere; +0.75 -> 3.25
        "us-east-1b",  # t=4 preempted in us-east-1, no other region has room: anywhere (R1Z2); +0.75 -> 4.0
        IDLE,          # t=5 preempted, nothing has room; C = 2, R = 5 > 3.5: wait (SkyPilot retries)
        IDLE,          # t=6 R = 4 > 3.5: wait
        ON_DEMAND,     # t=7 R = 3 <= 3.5: Safety Net -> on-demand until the end; +0.75 -> 4.75
        ON_DEMAND,     # t=8 spot is back, but the net holds: stay; +1 -> 5.75
        ON_DEMAND,     # t=9 +1 -> 6.0: done at 9.25 h, before the 10 h deadline
    ]
    assert got == expected
    assert progress == [0.75, 1.5, 2.5, 3.25, 4.0, 4.0, 4.0, 4.75, 5.75, 6.0]


def test_greedy_spot_without_a_preemption_is_plain_cheapest() -> None:
    # A first launch (no preemption seen) goes to the cheapest spot, region regardless.
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": "10h"},
                     simulate={"work_gpu_hours": 1.5, "scaling": "linear"})
    zones = [("us-east-1a", "us-east-1", 0.90), ("us-west-2b", "us-west-2", 1.00)]
    got, _ = _run(get_policy("greedy-spot"), spec, zones, [[1, 1], [1, 1]])
    assert got == ["us-east-1a", "us-east-1a"]  # +0.75, +1 -> 1.5
