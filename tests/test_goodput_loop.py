"""The goodput loop on the virtual clock (issue 11, item 5): the workers report their profile and
gradient statistics, the controller fits its goodput model to them, the policy values allocations by
goodput per dollar at the batch configuration the optimizer picks, and that configuration reaches the
next gang's workers (``SPOTRAIN_BATCH_JSON``) and the job's events.

Two jobs on one market with room for both at full size, with the same spec (1-8 V100s, ``batch_policy:
adaptive``, ``simulate.scaling: linear``, so the controller starts from the same prior for both): one
whose true profile is compute-bound with a large gradient noise scale (it scales well and can use a
larger batch), one whose all-reduce dwarfs its compute (it scales poorly). Only the reports tell them
apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from autoscaler.controller.fits import MAX_FITS_PER_TICK
from autoscaler.controller.goodput import gang_directive, merge_profile, note_gang_batch, record_report, scaling_for
from autoscaler.jobs.scaling import BatchConfig, GoodputScaling, batch_limits, measured_scaling
from autoscaler.jobs.spec import JobSpec, spec_from_dict
from autoscaler.jobs.summary import summary_dict
from autoscaler.policy import Allocation, PolicyInput, get_policy
from autoscaler.simulator.executor import SimWorkload
from autoscaler.simulator.world import World
from autoscaler.state import Job
from cloud_providers.local.market import HEADER, MarketTrace
from cost_models.goodput import ThroughputModel, ThroughputParams
from cost_models.scaling import LinearScaling

# Compute-bound, small sync (speedup ~7 on 8 GPUs), large noise scale: a larger batch pays on 8 GPUs.
GOOD = ThroughputModel(ThroughputParams(0.02, 0.004, 0.02, 0.001, 0.01, 0.0005, 4.0))
GOOD_GRAD = (1.0, 20.0)
# Sync-bound: two GPUs are slower than one, and the noise scale is small.
POOR = ThroughputModel(ThroughputParams(0.1, 0.002, 1.5, 0.1, 0.5, 0.05, 1.2))
POOR_GRAD = (1.0, 0.5)
WORK_S = 40 * 3600.0
TRACE = MarketTrace.parse(",".join(HEADER) + "\n0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,16\n",
                          source="test trace")


def spec(name: str, *, batch_policy: str = "adaptive") -> JobSpec:
    return spec_from_dict({
        "name": name, "run": "python train.py",
        "resources": {"accelerators": ["V100:1"], "clouds": ["aws"], "spot": "auto"},
        "workers": {"min": 1, "max": 8},
        "training": {"logical_workers": 8, "global_batch_size": 256, "batch_policy": batch_policy, "max_batch_size": 4096},
        "simulate": {"work_gpu_hours": WORK_S / 3600, "scaling": "linear"},
    })


class Recording:
    """The spotrain policy, keeping every decision's views and allocations."""

    name = "spotrain"

    def __init__(self) -> None:
        self.inner = get_policy("spotrain")
        self.log: list[tuple[PolicyInput, list[Allocation]]] = []

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        out = self.inner.decide(inp)
        self.log.append((inp, out))
        return out


def workload(profile: ThroughputModel | None, grad: tuple[float, float] | None) -> SimWorkload:
    return SimWorkload(work_s=WORK_S, scaling=LinearScaling(), restart_overhead_s=300.0, checkpoint_save_s=30.0,
                       profile=profile, grad_stats=grad)


def world_with(policy: Recording) -> World:
    world = World(TRACE, policy)
    # The controller knows only the spec (linear), not the simulated workers' truth.
    world.controller.ctx.scaling_of = lambda _job_id, s: measured_scaling(s)
    return world


def gangs(world: World, job_id: str) -> list[int]:
    """GPUs of each gang the job ran, in order (from its "attempt N: K worker(s) on ..." events)."""
    return [int(re.match(r"attempt \d+: (\d+) worker", r).group(1))  # type: ignore[union-attr]
            for _, kind, to, r in world.events(job_id) if kind == "state" and to == "RUNNING" and r.startswith("attempt ")]


@pytest.fixture(scope="module")
def loop() -> Iterator[tuple[World, Recording, str, str]]:
    policy = Recording()
    world = world_with(policy)
    good = world.submit(spec("scales-well"), workload(GOOD, GOOD_GRAD))
    poor = world.submit(spec("scales-poorly"), workload(POOR, POOR_GRAD))
    world.run(horizon_s=10 * 86400.0)
    yield world, policy, good, poor


def test_a_job_that_scales_poorly_gets_fewer_gpus_than_one_that_scales_well(loop: tuple[World, Recording, str, str]) -> None:
    world, _, good, poor = loop
    assert world.outcome(good).state == "SUCCEEDED" and world.outcome(poor).state == "SUCCEEDED"
    g, p = gangs(world, good), gangs(world, poor)
    # Same prior, same first allocation (linear: the most GPUs); then the reports tell them apart.
    assert g[0] == p[0] == 8
    assert p[-1] == 1 and g[-1] >= 4, (g, p)
    # Once the reports came in, every gang of the poor job is smaller than every gang of the good one.
    assert max(p[1:]) < min(g[1:] or g), (g, p)


def runtime_best(fn, k: int, *, m0: int = 256, cap: int = 4096, logical: int = 8) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Brute force: the best goodput on ``k`` GPUs over every batch the runtime can train (each
    multiple of the logical workers, split as ``runtime.adaptive.plan_batch`` splits it)."""
    from runtime.adaptive import plan_batch

    best = (0.0, 0)
    for b in range(m0, cap + 1, logical):
        plan = plan_batch(b, world_size=k, logical_workers=logical)
        g = b / float(fn.model.step_time(k, k, plan.local_bsz, plan.accum_steps)) * float(fn.efficiency(b))
        best = max(best, (g, b))
    return best


def test_both_train_at_the_batch_the_optimizer_picks(loop: tuple[World, Recording, str, str]) -> None:
    """Every allocation's batch is the goodput optimizer's pick among the batches the runtime can
    train (the split of K logical workers over the GPUs: ``runtime.adaptive.plan_batch``), within
    1 % of a brute force over every such batch."""
    from runtime.adaptive import plan_batch

    world, policy, good, poor = loop
    checked = {good: 0, poor: 0}
    for inp, allocs in policy.log:
        views = {v.job_id: v for v in inp.jobs}
        for a in allocs:
            v = views[a.job_id]
            if not isinstance(v.scaling, GoodputScaling) or not a.placements:
                continue
            k = sum(p.instances for p in a.placements)  # 1-GPU instances: nodes == replicas == k
            fn = v.scaling.fn
            assert fn is not None and a.batch is not None  # adaptive, with the reported gradient statistics
            plan = plan_batch(a.batch.batch_size, world_size=k, logical_workers=8)
            assert (a.batch.local_bsz, a.batch.accum_steps) == (plan.local_bsz, plan.accum_steps)
            got = a.batch.batch_size / float(fn.model.step_time(k, k, plan.local_bsz, plan.accum_steps))
            got *= float(fn.efficiency(a.batch.batch_size))
            assert got >= 0.99 * runtime_best(fn, k)[0], (k, a.batch)
            checked[a.job_id] += 1
    assert checked[good] > 0 and checked[poor] > 0
    with world.store.session() as s:
        for job_id in (good, poor):
            job = s.get(Job, job_id)
            assert job is not None
            batch = json.loads(job.batch_json)
            assert summary_dict(job, world.store.instances(s, job_id))["batch_size"] == batch["batch_size"]  # status
            events = [r for _, kind, _, r in world.events(job_id) if kind == "batch"]
            assert events, f"no batch event for {job_id}"
            assert events[-1].startswith(f"batch {batch['batch_size']} ") and events[-1].endswith("; source=controller")
            # What the workers reported is what the last gang was told, row by row in the profile.
            assert any((row["local_bsz"], row["accum_steps"]) == (batch["local_bsz"], batch["accum_steps"])
                       for row in json.loads(job.profile_json))
    # The well-scaling job, on many GPUs, trains at a larger batch than the spec's: it is worth it.
    assert json.loads(_batch(world, good))["batch_size"] > 256


def _batch(world: World, job_id: str) -> str:
    with world.store.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.batch_json


def test_a_job_without_reports_keeps_the_spec_and_no_batch_directive() -> None:
    policy = Recording()
    world = world_with(policy)
    job_id = world.submit(spec("no-profile"), workload(None, None))
    world.run(horizon_s=5 * 86400.0)
    assert world.outcome(job_id).state == "SUCCEEDED"
    assert gangs(world, job_id) == [8]
    assert all(a.batch is None for _, allocs in policy.log for a in allocs)
    assert not [e for e in world.events(job_id) if e[1] == "batch"]


def test_profile_merge_validates_and_bounds_rows() -> None:
    row = {"nodes": 2, "replicas": 4, "local_bsz": 32, "accum_steps": 0, "step_time_s": 0.5, "sync_time_s": 0.1}
    stored = merge_profile("", [row, {"nodes": 3, "replicas": 2, "local_bsz": 8, "step_time_s": 1.0},
                                {"nodes": 1, "replicas": 1, "local_bsz": 8, "step_time_s": float("nan")}, "junk"])
    assert [r["replicas"] for r in json.loads(stored)] == [4]  # nodes > replicas and NaN are refused
    assert merge_profile(stored, [{**row, "step_time_s": 0.505}]) == stored  # within the tolerance
    assert json.loads(merge_profile(stored, [{**row, "step_time_s": 0.6}]))[0]["step_time_s"] == 0.6
    many = [{**row, "local_bsz": b} for b in range(1, 200)]
    assert len(json.loads(merge_profile("", many))) == 64


def test_refits_are_bounded_per_tick() -> None:
    world = world_with(Recording())
    ctx = world.controller.ctx
    rows = json.dumps([{"nodes": k, "replicas": k, "local_bsz": 256 / k, "accum_steps": 0,
                        "step_time_s": float(POOR.step_time(k, k, 256 / k)), "sync_time_s": 0.0} for k in (1, 2, 4)])
    with world.store.session() as s:
        ids = [world.submit(spec(f"job-{i}"), workload(None, None)) for i in range(MAX_FITS_PER_TICK + 2)]
        jobs = [s.get(Job, i) for i in ids]
        for job in jobs:
            assert job is not None
            job.profile_json, job.grad_sqr, job.grad_var = rows, *POOR_GRAD
        got = [scaling_for(ctx, job, ctx.spec(job)) for job in jobs if job is not None]
        assert sum(isinstance(g, GoodputScaling) for g in got) == MAX_FITS_PER_TICK
        ctx.ticks += 1
        again = [scaling_for(ctx, job, ctx.spec(job)) for job in jobs if job is not None]
        assert all(isinstance(g, GoodputScaling) for g in again)
        # Unchanged data: the very same object (no refit, and the policy's caches keep hitting).
        assert [scaling_for(ctx, job, ctx.spec(job)) for job in jobs if job is not None] == again


def test_malformed_reports_are_ignored_field_by_field() -> None:
    world = world_with(Recording())
    ctx = world.controller.ctx
    job_id = world.submit(spec("bad-reports"), workload(None, None))
    with world.store.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        for prog in ({"profile": "junk", "grad_sqr": float("nan"), "grad_var": 1.0},
                     {"profile": [{"nodes": True, "replicas": 1, "local_bsz": 1, "step_time_s": 1.0}], "grad_sqr": -1.0,
                      "grad_var": 1.0, "batch_size": "x"},
                     {"profile": [None, [], {"nodes": 1}], "batch_size": 10**50}):
            record_report(ctx, s, job, prog)
        assert (job.profile_json, job.grad_sqr, job.grad_var, job.batch_json) == ("", None, None, "")
        assert scaling_for(ctx, job, ctx.spec(job)) is None  # the spec's (linear): the policy's own
        # One usable row is enough for a model.
        record_report(ctx, s, job, {"profile": [{"nodes": 1, "replicas": 1, "local_bsz": 256, "step_time_s": 1.0}]})
        assert isinstance(scaling_for(ctx, job, ctx.spec(job)), GoodputScaling)


def test_the_controller_and_the_runtime_share_one_layout_module() -> None:
    """The controller values a gang at the split the runtime trains: both take it from
    ``cost_models.batching`` (issue 20: before, each kept its own copy, with different default caps)."""
    from cost_models import batching
    from runtime import adaptive

    assert adaptive.plan_batch is batching.plan and adaptive.round_batch is batching.round_batch
    raw = spec("layout").model_dump(mode="json", by_alias=True)
    raw["training"]["max_batch_size"] = None
    # One default cap, M0 x logical workers (the runtime cannot see workers.max): before, the
    # controller's was M0 x workers.max.
    raw["workers"] = {"min": 1, "max": 2}
    assert batch_limits(spec_from_dict(raw))[1] == batching.default_cap(256, 8) == 2048


@pytest.mark.parametrize("batch_policy", ["adaptive", "fixed"])
def test_a_gang_at_the_picked_batch_is_not_rebatched_to_it(batch_policy: str) -> None:
    """The gang reports the split the runtime trains (K logical workers over its GPUs); valued at
    that split, it has exactly the goodput the policy expected of the pick, so no restart is asked
    for a gain that restarting cannot bring (before: a 1-GPU gang at batch 64 of 8 logical workers,
    reporting 8 per GPU x 8 micro-batches, was valued below the "64 per GPU" it was told, and the
    controller asked again for "680 % more goodput")."""
    from runtime.adaptive import plan_batch

    s = GoodputScaling(GOOD, init_batch_size=256, max_batch_size=4096, grad=GOOD_GRAD,
                       adaptive=batch_policy == "adaptive", logical_workers=8)
    for k in range(1, 9):
        pick = s.batch(k)
        assert pick is not None
        plan = plan_batch(pick.batch_size, world_size=k, logical_workers=8)
        reported = BatchConfig(plan.batch_size, plan.local_bsz, plan.accum_steps)
        assert reported == pick
        assert s.speedup_at(k, 1, reported) == pytest.approx(s.speedup(k), rel=1e-9)


def _batch_events(name: str, reports: list[dict[str, float | int | str]],
                  directive: BatchConfig | None = None) -> list[tuple[str, str]]:
    """The ``batch`` and ``lr`` events of a job whose gang (told ``directive``, if any) reports ``reports``."""
    world = world_with(Recording())
    ctx = world.controller.ctx
    job_id = world.submit(spec(name), workload(None, None))
    with world.store.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.gang.attempt = 1
        if directive is not None:
            note_gang_batch(ctx, s, job, directive, 8)
        job.gang.start_step = 10
        for prog in reports:
            record_report(ctx, s, job, {"step": 11, **prog})
    return [(kind, reason) for _, kind, _, reason in world.events(job_id) if kind in ("batch", "lr")]


def test_batch_and_learning_rate_changes_the_workers_report_are_events() -> None:
    """A batch the gang moved to on its own is a ``batch`` event with its LR factor; a later move of
    the factor alone (AdaScale's gain follows the noise estimates) is an ``lr`` event past 10 %."""
    at_1024 = {"batch_size": 1024, "local_bsz": 128, "accum_steps": 0}
    events = _batch_events("lr-events", [{**at_1024, "lr_factor": 3.1},
                                         {**at_1024, "lr_factor": 3.3},   # +6 %: quiet
                                         {**at_1024, "lr_factor": 3.9},   # +26 %: an event
                                         {**at_1024, "lr_factor": float("inf")},
                                         {"batch_size": 2048, "local_bsz": 256, "accum_steps": 0}])
    assert events == [
        ("batch", "the workers changed to batch 1024 (128 per GPU), LR x3.10; source=runtime"),
        ("lr", "learning-rate factor x3.10 -> x3.90 at batch 1024 (none); source=runtime"),
        ("batch", "the workers changed to batch 2048 (256 per GPU); source=runtime"),
    ], events


def test_batch_and_lr_events_name_their_source() -> None:
    """DESIGN.md wave 3: ``batch`` and ``lr`` events say who chose the batch. A gang the controller
    started has its directive (source controller); a report naming its source is believed; the
    LR factor that follows a directive's batch is the controller's too."""
    at_512 = {"batch_size": 512, "local_bsz": 64, "accum_steps": 0}
    events = _batch_events("sources", [{**at_512, "lr_factor": 1.5}, {**at_512, "lr_factor": 1.6},
                                       {"batch_size": 1024, "local_bsz": 128, "accum_steps": 0,
                                        "batch_source": "runtime"}], directive=BatchConfig(512, 64, 0))
    got = [(kind, reason.rsplit("; ", 1)[-1]) for kind, reason in events]
    assert got == [("batch", "source=controller"), ("lr", "source=controller"), ("batch", "source=runtime")], events
    # The previous gang's last report (at the step this gang started from) is not this gang's change.
    stale = _batch_events("stale", [{"step": 10, "batch_size": 64, "local_bsz": 8, "accum_steps": 7, "lr_factor": 1.0}],
                          directive=BatchConfig(512, 64, 0))
    assert [kind for kind, _ in stale] == ["batch"], stale  # the directive's own event only
    # Every gang the controller starts for an adaptive job carries a directive: the spec's batch
    # laid out on its GPUs until the policy picks another (the runtime then leaves the batch alone).
    assert gang_directive(spec("sources"), None, 3) == BatchConfig(256, 32, 2)
    assert gang_directive(spec("fixed", batch_policy="fixed"), None, 3) is None


def test_the_rebatch_payback_uses_the_measured_remaining_work() -> None:
    """Issue 20: the time a re-batch saves is counted over the job's measured remaining work (steps
    left at the reported seconds per step), not the spec's ``simulate.work_gpu_hours``. The spec says
    40 GPU-hours (a restart for 10 % more goodput would pay many times over) while the workers report
    1,000 steps left at 0.01 s each (10 s: not one restart's worth); at 20 s a step it pays."""
    from autoscaler.controller.goodput import JobFit, rebatch_reason

    world = world_with(Recording())
    ctx = world.controller.ctx
    job_id = world.submit(spec("payback"), workload(None, None))
    scaling = GoodputScaling(GOOD, init_batch_size=256, max_batch_size=4096, grad=(1.0, 200.0), adaptive=True,
                             logical_workers=8)
    ctx.goodput.jobs[job_id] = JobFit(("", None, None), "", 0, 0.0, GOOD, scaling)
    pick = scaling.batch(4)
    assert pick is not None and scaling.speedup(4) > 1.05 * scaling.speedup_at(4, 1, BatchConfig(256, 32, 1))
    with world.store.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.gang.attempt, job.restart_overhead_s = 1, 60.0
        job.batch_json = json.dumps(BatchConfig(256, 32, 1).to_json())  # the gang trains the spec's batch
        job.step, job.total_steps = 0, 1000
        ctx.step_seconds[job_id] = (1, 0.01)
        assert rebatch_reason(ctx, job, pick, 4, 1) is None  # 10 s left: a 60 s restart cannot pay
        ctx.step_seconds[job_id] = (1, 20.0)  # 20,000 s left: it pays
        why = rebatch_reason(ctx, job, pick, 4, 1)
        assert why is not None and "20000 s of measured remaining work" in why
        ctx.step_seconds[job_id] = (0, 20.0)  # another gang's speed is not this one's
        assert rebatch_reason(ctx, job, pick, 4, 1) is None
