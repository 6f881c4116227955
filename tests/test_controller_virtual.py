"""The controller on the virtual clock: state machine, budget guard, recovery and capacity back-off.

Each test drives the real ``Controller`` (real reconcile loop, real in-memory SQLite ``Store``, the
real ``LocalProvider`` replaying a small hand-written market trace) through
``autoscaler.simulator.world.World``, whose only simulated part is the executor's workers. Hours of
market time take milliseconds, so every timing below is exact and asserted exactly.

Numbers used throughout: one V100 worker, 7200 reference GPU-seconds of work (2 h), a restart
overhead of 300 s (so a first gang started at t=0 trains from t=300 and finishes at t=7500), spot at
$0.90/h and on-demand at $3.06/h, a 300 s decision grid (the budget guard looks 3 ticks = 900 s ahead).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from autoscaler.controller import Controller
from autoscaler.jobs.domain import LIVE, TERMINAL, TRANSITIONS, IllegalTransition, JobState, check_transition
from autoscaler.jobs.spec import JobSpec, spec_from_dict
from autoscaler.policy import CheapestPolicy, get_policy
from autoscaler.simulator import world as world_module
from autoscaler.simulator.executor import STEPS_PER_S, SimWorkload
from autoscaler.simulator.world import World
from autoscaler.state import Decision, Event, Job, Store
from cloud_providers.base import (
    ON_DEMAND,
    SPOT,
    TAG_CONTROLLER,
    TAG_DECISION,
    TAG_JOB,
    TAG_MARKET,
    InstanceState,
    LaunchRequest,
)
from cloud_providers.local.market import HEADER, MarketTrace
from cost_models.scaling import LinearScaling

AWS_A = "aws/us-east-1a/p3.2xlarge/V100:1"
AWS_B = "aws/us-east-1b/p3.2xlarge/V100:1"
GCP_A = "gcp/us-central1-a/n1-standard-8/V100:1"
SPOT_PRICE, OD_PRICE = 0.9, 3.06
WORK_S, RESTART_S = 7200.0, 300.0


# ----- building worlds -----

def trace(*rows: str) -> MarketTrace:
    return MarketTrace.parse(",".join(HEADER) + "\n" + "\n".join(rows) + "\n", source="test trace")


def aws_a(t: float, avail: int, spot: float = SPOT_PRICE, od: float = OD_PRICE) -> str:
    return f"{t},aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,{spot},{od},{avail}"


def aws_b(t: float, avail: int, spot: float = 1.0, od: float = OD_PRICE) -> str:
    return f"{t},aws,us-east-1,us-east-1b,p3.2xlarge,V100,1,{spot},{od},{avail}"


def gcp_a(t: float, avail: int) -> str:
    return f"{t},gcp,us-central1,us-central1-a,n1-standard-8,V100,1,{SPOT_PRICE},{OD_PRICE},{avail}"


CALM = trace(aws_a(0, 4))
# Spot room vanishes at t=3600 (the instance gets AWS's 120 s notice) and comes back at t=4800.
PREEMPT_AWS = trace(aws_a(0, 4), aws_a(3600, 0), aws_a(4800, 4))
# The same on GCP, whose 30 s notice is shorter than the workers' 60 s checkpoint save.
PREEMPT_GCP = trace(gcp_a(0, 4), gcp_a(3600, 0), gcp_a(4800, 4))
# Room for one spot worker, then for two from t=3600.
GROWING = trace(aws_a(0, 1), aws_a(3600, 2))
# Two spot offerings with room for one each; 1a is cheaper.
TWO_ZONES = trace(aws_a(0, 1), aws_b(0, 1))


def spec(*, clouds: tuple[str, ...] = ("aws",), spot: str = "auto", workers: tuple[int, int] = (1, 1),
         budget_usd: float | None = None) -> JobSpec:
    d: dict[str, Any] = {
        "name": "vjob", "run": "python train.py",
        "resources": {"accelerators": ["V100:1"], "clouds": list(clouds), "spot": spot},
        "workers": {"min": workers[0], "max": workers[1]},
        "training": {"logical_workers": workers[1]},
    }
    if budget_usd is not None:
        d["objective"] = {"budget_usd": budget_usd}
    return spec_from_dict(d)


def workload(work_s: float = WORK_S, *, checkpoint_save_s: float = 30.0) -> SimWorkload:
    return SimWorkload(work_s=work_s, scaling=LinearScaling(), restart_overhead_s=RESTART_S,
                       checkpoint_save_s=checkpoint_save_s, checkpoint_interval_s=600.0)


def make_world(tr: MarketTrace, policy: Any = None, **kw: Any) -> World:
    return World(tr, policy if policy is not None else CheapestPolicy(), **kw)


@pytest.fixture()
def service_pace(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wake the controller at least every grid tick (300 s), as the service's interval job does,
    instead of the simulator's default of every 1800 s when nothing else happens."""
    monkeypatch.setattr(world_module, "MAX_DECISION_GAP_S", world_module.GRID_S)
    yield


@pytest.fixture(params=["simulator-pace", "service-pace"])
def pace(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both ways the loop can run: the simulator's (tick only when something happens, the guard's
    own due time included) and the service's (every grid tick as well)."""
    if request.param == "service-pace":
        monkeypatch.setattr(world_module, "MAX_DECISION_GAP_S", world_module.GRID_S)
    yield request.param


def run_one(tr: MarketTrace, s: JobSpec, wl: SimWorkload | None = None, *, policy: Any = None,
            horizon_s: float = 86400.0, **kw: Any) -> tuple[World, str]:
    w = make_world(tr, policy, **kw)
    job_id = w.submit(s, wl or workload())
    w.run(horizon_s=horizon_s)
    return w, job_id


# ----- reading the history -----

def state_events(w: World, job_id: str) -> list[Event]:
    with w.store.session() as s:
        return [e for e in w.store.events(s, job_id) if e.kind == "state"]


def state_path(w: World, job_id: str) -> list[str]:
    """PENDING (the submitted state) and then the to_state of every transition, in order."""
    return [JobState.PENDING.value] + [e.to_state for e in state_events(w, job_id)]


def job_row(w: World, job_id: str) -> Job:
    with w.store.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def provider_cost(w: World, job_id: str) -> float:
    """What the cloud bills for every instance the job ever had (the provider's own accounting)."""
    return sum(w.provider.billing(i).cost_usd for i in w.provider.list_instances({TAG_JOB: job_id}))


def assert_history_legal(w: World, job_id: str) -> None:
    """Every recorded transition is in the lifecycle table, chained (each starts where the last
    ended), in time order, and the last one is the job's state."""
    events = state_events(w, job_id)
    prev, prev_ts = JobState.PENDING.value, -1.0
    for e in events:
        assert e.from_state == prev, f"transition {e.from_state}->{e.to_state} does not start at {prev}"
        assert e.from_state != e.to_state
        assert JobState(e.to_state) in TRANSITIONS[JobState(e.from_state)], f"{e.from_state}->{e.to_state}"
        assert e.ts >= prev_ts
        prev, prev_ts = e.to_state, e.ts
    assert job_row(w, job_id).state == prev


# ----- state machine -----

def test_calm_market_pending_running_succeeded() -> None:
    w, j = run_one(CALM, spec())
    o = w.outcome(j)
    # The local cloud's instances are up at once, so the job skips PROVISIONING.
    assert state_path(w, j) == ["PENDING", "RUNNING", "SUCCEEDED"]
    kinds = [(kind, to) for _, kind, to, _ in w.events(j)]
    assert kinds == [("submitted", "PENDING"), ("launched", "PENDING"), ("state", "RUNNING"),
                     ("released", "RUNNING"), ("state", "SUCCEEDED")]
    times = [e.ts for e in state_events(w, j)]
    assert times == [0.0, WORK_S + RESTART_S]
    assert o.state == "SUCCEEDED" and o.finished_s == WORK_S + RESTART_S
    assert (o.preemptions, o.attempts) == (0, 1)
    assert o.cost_usd == pytest.approx(SPOT_PRICE * (WORK_S + RESTART_S) / 3600.0)
    assert o.cost_usd == pytest.approx(provider_cost(w, j))
    job = job_row(w, j)
    assert job.final_model and job.step == job.total_steps == int(WORK_S * STEPS_PER_S)
    assert job.finished_clock_s == WORK_S + RESTART_S
    # Nothing is left running on the cloud.
    assert all(not i.alive for i in w.provider.list_instances({}))


@pytest.mark.parametrize("policy", ["cheapest", "greedy-spot", "spotrain"])
def test_spot_preemption_recovers_and_succeeds(policy: str) -> None:
    w, j = run_one(PREEMPT_AWS, spec(), policy=get_policy(policy))
    o = w.outcome(j)
    path = state_path(w, j)
    assert path[0:2] == ["PENDING", "RUNNING"] and path[-1] == "SUCCEEDED"
    i_recover = next(i for i, st in enumerate(path) if st in ("RECOVERING", "RESCALING"))
    assert "RUNNING" in path[i_recover:-1], f"never ran again after the preemption: {path}"
    assert o.state == "SUCCEEDED"
    assert o.preemptions == 1 and o.attempts >= 2
    notices = [e for e in w.events(j) if e[1] == "preemption-notice"]
    assert len(notices) == 1 and notices[0][0] == 3600.0
    assert o.cost_usd == pytest.approx(provider_cost(w, j))
    assert_history_legal(w, j)


def test_preemption_with_time_to_checkpoint_loses_no_work() -> None:
    """AWS's 120 s notice covers the 30 s checkpoint: the gang saves at t=3600 and exits at 3630 with
    85; the on-demand replacement launched at the notice trains from 3600 + 300 s overhead on the
    3900 s left, so the job ends at 7800 exactly (no work repeated)."""
    w, j = run_one(PREEMPT_AWS, spec())
    assert state_path(w, j) == ["PENDING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
    evs = {(kind, to): ts for ts, kind, to, _ in w.events(j)}
    assert evs[("gang-stopped", "RUNNING")] == 3630.0
    o = w.outcome(j)
    assert o.finished_s == 7800.0
    assert o.preemptions == 1 and o.attempts == 2
    # The spot instance billed until the cloud took it back (notice 120 s), the replacement on demand.
    assert o.spot_hours == pytest.approx(3720.0 / 3600.0)
    assert o.on_demand_hours == pytest.approx((7800.0 - 3600.0) / 3600.0)


def test_preemption_too_short_to_checkpoint_resumes_from_periodic_checkpoint() -> None:
    """GCP's 30 s notice is shorter than the 60 s save: the gang is lost with its instance at 3630 and
    the next one resumes from the last periodic checkpoint (every 600 s of training from t=300: the
    one at t=3300, 3000 s of work), so 4200 s are left and the job ends at 3600 + 300 + 4200."""
    w, j = run_one(PREEMPT_GCP, spec(clouds=("gcp",)), workload(checkpoint_save_s=60.0))
    assert state_path(w, j) == ["PENDING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
    recovering = next(e for e in state_events(w, j) if e.to_state == "RECOVERING")
    assert recovering.ts == 3630.0 and "lost" in recovering.reason
    o = w.outcome(j)
    assert o.finished_s == 8100.0
    assert o.preemptions == 1


def test_more_spot_room_rescales_the_running_gang() -> None:
    """An elastic job (1..2 workers, spot only) grows when the room does: RUNNING -> RESCALING ->
    RUNNING on two workers, and it still succeeds."""
    # The oracle's view (the cloud reports the room): the controller sees room grow at once. A real
    # cloud does not say; tests/test_room_watch.py has the probing view.
    w, j = run_one(GROWING, spec(spot="always", workers=(1, 2)), oracle=True)
    path = state_path(w, j)
    assert path == ["PENDING", "RUNNING", "RESCALING", "RUNNING", "SUCCEEDED"]
    rescale = next(e for e in state_events(w, j) if e.to_state == "RESCALING")
    assert rescale.ts == 3600.0
    last_start = [e for e in state_events(w, j) if e.to_state == "RUNNING"][-1]
    assert "2 worker(s)" in last_start.reason
    o = w.outcome(j)
    assert o.state == "SUCCEEDED" and o.attempts == 2 and o.preemptions == 0
    # Faster than one worker alone would have been (7500 s).
    assert o.finished_s is not None and o.finished_s < WORK_S + RESTART_S


def _scenario_worlds() -> dict[str, Any]:
    def calm() -> tuple[World, str]:
        return run_one(CALM, spec())

    def preempt_aws() -> tuple[World, str]:
        return run_one(PREEMPT_AWS, spec())

    def preempt_gcp() -> tuple[World, str]:
        return run_one(PREEMPT_GCP, spec(clouds=("gcp",)), workload(checkpoint_save_s=60.0))

    def rescale() -> tuple[World, str]:
        return run_one(GROWING, spec(spot="always", workers=(1, 2)))

    def spotrain_preempt() -> tuple[World, str]:
        return run_one(PREEMPT_AWS, spec(), policy=get_policy("spotrain"))

    def min_bill() -> tuple[World, str]:
        return run_one(CALM, spec(budget_usd=0.8), workload(1800.0), min_billed_s=3600.0)

    def cancelled() -> tuple[World, str]:
        w = make_world(CALM)
        j = w.submit(spec(), workload())
        w.run(horizon_s=1000.0)
        w.controller.cancel(j)
        return w, j

    return {f.__name__: f for f in (calm, preempt_aws, preempt_gcp, rescale, spotrain_preempt, min_bill, cancelled)}


@pytest.mark.parametrize("scenario", sorted(_scenario_worlds()))
def test_every_recorded_transition_is_allowed(scenario: str) -> None:
    w, j = _scenario_worlds()[scenario]()
    assert len(state_events(w, j)) >= 1
    assert JobState(job_row(w, j).state).terminal
    assert_history_legal(w, j)


def test_budget_guard_history_is_allowed(pace: str) -> None:
    w, j = run_one(CALM, spec(budget_usd=0.9))
    assert job_row(w, j).state == "FAILED_BUDGET"
    assert_history_legal(w, j)


def test_illegal_transition_raises_and_changes_nothing() -> None:
    w, j = run_one(CALM, spec())
    before = job_row(w, j)
    n_events = len(w.events(j))
    with w.store.session() as s:
        job = s.get(Job, j)
        assert job is not None and job.state == "SUCCEEDED"
        with pytest.raises(IllegalTransition) as err:
            Store.transition(s, job, JobState.RUNNING, "resurrect", ts=99999.0)
        assert (err.value.from_state, err.value.to_state) == ("SUCCEEDED", "RUNNING")
        assert job.state == "SUCCEEDED" and job.reason == before.reason
        # The session commits on leaving: nothing half-written may reach the database.
    after = job_row(w, j)
    assert (after.state, after.reason, after.finished_at) == (before.state, before.reason, before.finished_at)
    assert len(w.events(j)) == n_events
    # Staying in a terminal state is a no-op, not an error, and records nothing.
    with w.store.session() as s:
        job = s.get(Job, j)
        assert job is not None
        Store.transition(s, job, JobState.SUCCEEDED, "again", ts=99999.0)
    assert len(w.events(j)) == n_events


@pytest.mark.parametrize("to", [JobState.RECOVERING, JobState.RESCALING])
def test_illegal_transition_from_pending(to: JobState) -> None:
    w = make_world(CALM)
    j = w.submit(spec(), workload())
    with w.store.session() as s:
        job = s.get(Job, j)
        assert job is not None
        with pytest.raises(IllegalTransition):
            Store.transition(s, job, to, "no gang ever ran")
    assert job_row(w, j).state == "PENDING"
    assert state_events(w, j) == []
    # The controller carries on from there as if nothing happened.
    w.run(horizon_s=86400.0)
    assert w.outcome(j).state == "SUCCEEDED"


def _reachable(src: JobState) -> set[JobState]:
    seen, todo = {src}, deque([src])
    while todo:
        for nxt in TRANSITIONS[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_lifecycle_table() -> None:
    assert set(TRANSITIONS) == set(JobState)
    assert TERMINAL | LIVE == set(JobState) and not TERMINAL & LIVE
    for t in TERMINAL:
        assert TRANSITIONS[t] == frozenset(), f"{t} has exits"
        assert t.terminal
        for other in set(JobState) - {t}:
            with pytest.raises(IllegalTransition):
                check_transition("j", t.value, other)
        check_transition("j", t.value, t)  # staying is a no-op
    for s in LIVE:
        assert not s.terminal
        assert s not in TRANSITIONS[s]
        # A cancel, the budget guard or a user-code failure can end a job at any moment.
        assert TERMINAL <= TRANSITIONS[s], f"{s} cannot end directly in {TERMINAL - TRANSITIONS[s]}"
        assert TERMINAL <= _reachable(s)
        # Every live state is reachable from submission, and can get back to running.
        assert s in _reachable(JobState.PENDING)
        assert JobState.RUNNING in _reachable(s)
    # No way back to PENDING-before-anything from a terminal, and the documented path exists.
    for a, b in [("PENDING", "PROVISIONING"), ("PROVISIONING", "RUNNING"), ("RUNNING", "RESCALING"),
                 ("RESCALING", "RUNNING"), ("RUNNING", "RECOVERING"), ("RECOVERING", "RUNNING")]:
        check_transition("j", a, JobState(b))
    with pytest.raises(IllegalTransition):
        check_transition("j", "NOT_A_STATE", JobState.RUNNING)


def test_a_gang_is_never_smaller_than_workers_min() -> None:
    """A two-worker job (workers 2..2) loses one spot instance to a preemption and the zone has
    room for one spot only: it must fill the gang again (on-demand here), never train on the one
    instance it still holds (the policy once offered "keep what is held" below workers.min)."""
    tr = trace(aws_a(0, 2), aws_a(3600, 1))
    s = spec(workers=(2, 2))
    w, j = run_one(tr, s, policy=get_policy())
    assert w.outcome(j).state == "SUCCEEDED"
    sizes = [int(r.split(": ", 1)[1].split(" ", 1)[0]) for _, kind, to, r in w.events(j)
             if kind == "state" and to == "RUNNING" and r.startswith("attempt ")]
    assert len(sizes) >= 2 and set(sizes) == {2}, sizes
    assert w.outcome(j).preemptions >= 1


# ----- budget guard -----

def _tick_watcher(w: World, job_id: str, budget: float) -> list[tuple[float, float, float]]:
    """Record (time, job.cost_usd, provider bill) after every tick, and check the cap on each."""
    seen: list[tuple[float, float, float]] = []
    tick = w.controller.tick

    def watched() -> None:
        tick()
        cost, billed = job_row(w, job_id).cost_usd, provider_cost(w, job_id)
        seen.append((w.provider.now_s(), cost, billed))
        assert cost <= budget + 1e-9 and billed <= budget + 1e-9, f"over budget at t={seen[-1][0]}: {seen[-1]}"

    w.controller.tick = watched  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("budget", [0.8, 0.9, 1.5])
def test_budget_guard_stops_before_the_budget_is_crossed(pace: str, budget: float) -> None:
    """The job needs $1.875 on spot; with less budget the guard ends it FAILED_BUDGET before its
    spend plus 900 s of burn would reach the budget: never above it, by the job's or the cloud's
    account, at any tick."""
    w = make_world(CALM)
    j = w.submit(spec(budget_usd=budget), workload())
    seen = _tick_watcher(w, j, budget)
    w.run(horizon_s=86400.0)
    job = job_row(w, j)
    assert job.state == "FAILED_BUDGET"
    assert f"of a ${budget:.2f} budget" in job.reason
    assert job.cost_usd <= budget
    assert job.cost_usd == pytest.approx(provider_cost(w, j))
    # It stopped within one tick of the point where 900 s more would cross: not needlessly early.
    assert job.cost_usd >= budget - SPOT_PRICE * (900.0 + 300.0) / 3600.0
    assert all(not i.alive for i in w.provider.list_instances({TAG_JOB: j}))
    assert len(seen) >= 3


def test_budget_guard_holds_while_the_cloud_cannot_be_polled(pace: str) -> None:
    """A throttled DescribeInstances fails every tick once the job runs: the hard budget holds
    anyway (the guard runs first, from the database and the last prices seen), the tick's error is
    the cloud's, and the loop goes on."""
    from cloud_providers.errors import Throttled

    budget = 0.9
    w = make_world(CALM)
    w.controller.strict = False  # as the service runs: a cloud error ends the tick, not the loop
    j = w.submit(spec(budget_usd=budget), workload())
    seen = _tick_watcher(w, j, budget)
    poll, errors = w.provider.poll, []

    def throttled():  # type: ignore[no-untyped-def]
        if seen and job_row(w, j).state == "RUNNING":
            raise Throttled("RequestLimitExceeded", cloud="local")
        return poll()

    def watched_error() -> None:
        if w.controller.last_tick_error:
            errors.append(w.controller.last_tick_error)

    w.provider.poll = throttled  # type: ignore[method-assign]
    w.controller.tick = (lambda tick: lambda: (tick(), watched_error())[0])(w.controller.tick)  # type: ignore[method-assign]
    w.run(horizon_s=86400.0)
    job = job_row(w, j)
    assert job.state == "FAILED_BUDGET", job.reason
    assert job.cost_usd <= budget and provider_cost(w, j) <= budget
    assert errors and all("Throttled" in e for e in errors), errors
    assert all(not i.alive for i in w.provider.list_instances({TAG_JOB: j}))


def test_budget_that_suffices_lets_the_job_succeed(pace: str) -> None:
    budget = 1.875 + SPOT_PRICE * 900.0 / 3600.0 + 0.01
    w = make_world(CALM)
    j = w.submit(spec(budget_usd=budget), workload())
    _tick_watcher(w, j, budget)
    w.run(horizon_s=86400.0)
    assert w.outcome(j).state == "SUCCEEDED"


def test_launch_whose_minimum_bill_crosses_the_budget_is_not_made() -> None:
    """With a 3600 s minimum bill a spot launch costs at least $0.90 > the $0.80 budget: nothing is
    launched (not even a decision written) and the job ends FAILED_BUDGET naming the minimum."""
    w, j = run_one(CALM, spec(budget_usd=0.8), workload(1800.0), min_billed_s=3600.0)
    job = job_row(w, j)
    assert job.state == "FAILED_BUDGET"
    assert "3600 s" in job.reason and "at least" in job.reason
    assert w.provider.list_instances({}) == []
    with w.store.session() as s:
        assert list(s.scalars(select(Decision).where(Decision.job_id == j))) == []
    assert job.cost_usd == 0.0
    assert state_path(w, j) == ["PENDING", "FAILED_BUDGET"]


def test_same_job_without_a_minimum_bill_succeeds() -> None:
    """The control for the test above: the same $0.80 job (1800 s of work: $0.525 on spot) runs."""
    w, j = run_one(CALM, spec(budget_usd=0.8), workload(1800.0), min_billed_s=0.0)
    o = w.outcome(j)
    assert o.state == "SUCCEEDED"
    assert o.cost_usd == pytest.approx(SPOT_PRICE * 2100.0 / 3600.0)
    assert o.cost_usd <= 0.8
    assert len(w.provider.list_instances({TAG_JOB: j})) == 1


def test_replacement_whose_minimum_bill_crosses_the_budget_is_not_launched(pace: str) -> None:
    """Preempted at t=3600 with $0.90 spent of $2.00: the on-demand replacement's 3600 s minimum
    ($3.06) would cross the budget, so the job ends FAILED_BUDGET instead of launching it, and the
    bill (the spot hour, at its minimum) stays under the budget."""
    budget = 2.0
    w = make_world(PREEMPT_AWS, min_billed_s=3600.0)
    j = w.submit(spec(budget_usd=budget), workload())
    _tick_watcher(w, j, budget)
    w.run(horizon_s=86400.0)
    job = job_row(w, j)
    assert job.state == "FAILED_BUDGET" and "3600 s" in job.reason
    insts = w.provider.list_instances({TAG_JOB: j})
    assert [i.market for i in insts] == [SPOT]
    assert job.cost_usd == pytest.approx(SPOT_PRICE) and job.cost_usd <= budget
    assert job.cost_usd == pytest.approx(provider_cost(w, j))


def test_simulator_pace_ticks_when_the_guard_is_due() -> None:
    """Regression: the simulator's loop, which otherwise wakes the controller only every
    MAX_DECISION_GAP_S (1800 s, longer than the guard's 900 s horizon), once let a $0.90 job spend
    $0.98. It must tick by the time the guard is due."""
    assert world_module.MAX_DECISION_GAP_S > 3 * world_module.GRID_S  # else this test proves nothing
    w, j = run_one(CALM, spec(budget_usd=0.9))
    job = job_row(w, j)
    assert job.state == "FAILED_BUDGET"
    assert job.cost_usd <= 0.9
    stop = next(e for e in state_events(w, j) if e.to_state == "FAILED_BUDGET")
    # Due when $0.90 - 900 s of burn ($0.225) is spent: t = 0.675 / 0.9 h = 2700 s (+1 s at most).
    assert 2700.0 <= stop.ts <= 2701.0


# ----- recovery -----

def _restart_controller(w: World, policy: Any = None) -> Controller:
    """A new controller process over the same database, cloud and workers, as after a crash. The
    simulator's wiring of the old one's context (its workers' scaling model, logs) is carried over,
    as ``World`` does for its own."""
    old = w.controller
    new = Controller(store=w.store, provider=w.provider, executor=w.executor,
                     policy=policy if policy is not None else CheapestPolicy(), controller_id="sim",
                     tick_s=old.tick_s, clock_rate=1.0, clock=w.clock, strict=True)
    new.ctx.logs_dir = old.ctx.logs_dir
    new.ctx.scaling_of = old.ctx.scaling_of
    return new


def test_recovery_after_a_crash_mid_run() -> None:
    """The controller dies at t=3000 with the gang running. Meanwhile the cloud holds an instance
    tagged with this controller for a job the database never heard of, one of another controller,
    and the database a pending write-ahead decision whose launch never happened. The restarted
    controller terminates the orphan, leaves the other controller's instance alone, fails the
    decision, lets the running gang run on, and the job finishes as if nothing happened."""
    w = make_world(CALM)
    j = w.submit(spec(), workload())
    w.run(horizon_s=3000.0)
    assert job_row(w, j).state == "RUNNING"
    gang = [i for i in w.provider.list_instances({TAG_JOB: j}) if i.alive]
    assert len(gang) == 1
    now = w.provider.now_s()
    offering = CALM.offering_at(AWS_A, now)
    orphan = w.provider.launch(LaunchRequest(offering=offering, market=ON_DEMAND, decision_id="d-orphan", tags={
        TAG_CONTROLLER: "sim", TAG_JOB: "ghost-000000", TAG_MARKET: ON_DEMAND, TAG_DECISION: "d-orphan"}))
    foreign = w.provider.launch(LaunchRequest(offering=offering, market=ON_DEMAND, decision_id="d-foreign", tags={
        TAG_CONTROLLER: "someone-else", TAG_JOB: "theirs-000000"}))
    with w.store.session() as s:
        s.add(Decision(decision_id="d-lost", job_id=j, offering_key=AWS_A, market=SPOT, created_at=w.clock.now(),
                       status="pending"))

    new = _restart_controller(w)
    counts = new.recover()
    assert counts == {"adopted": 0, "orphans_terminated": 1, "decisions_failed": 1, "released": 0}
    get = w.provider.get
    assert get(orphan.instance_id).state is InstanceState.TERMINATED  # type: ignore[union-attr]
    assert get(foreign.instance_id).state is InstanceState.RUNNING  # type: ignore[union-attr]
    assert get(gang[0].instance_id).state is InstanceState.RUNNING  # type: ignore[union-attr]
    with w.store.session() as s:
        d = s.get(Decision, "d-lost")
        assert d is not None and d.status == "failed" and d.instance_id is None
        assert "no instance found" in d.reason
    assert job_row(w, j).state == "RUNNING"
    assert any(kind == "controller-restart" for _, kind, _, _ in w.events(j))

    w.controller = new
    w.run(horizon_s=86400.0)
    o = w.outcome(j)
    assert o.state == "SUCCEEDED"
    # The gang ran on through the crash: same attempt, same instance, same finish as with no crash.
    assert o.attempts == 1 and o.finished_s == WORK_S + RESTART_S
    assert [i.instance_id for i in w.provider.list_instances({TAG_JOB: j})] == [gang[0].instance_id]
    assert get(foreign.instance_id).state is InstanceState.RUNNING  # type: ignore[union-attr]
    assert_history_legal(w, j)


@pytest.mark.parametrize("how", ["pending-decision", "tag-only"])
def test_recovery_adopts_an_instance_launched_but_not_recorded(how: str) -> None:
    """The controller died right after the cloud accepted a launch (the decision written ahead, or
    only the instance's tags left to tell). The restarted controller adopts the instance, runs the
    job on it and never launches a second one."""
    w = make_world(CALM)
    j = w.submit(spec(), workload())
    offering = CALM.offering_at(AWS_A, w.provider.now_s())
    if how == "pending-decision":
        with w.store.session() as s:
            s.add(Decision(decision_id="d-early", job_id=j, offering_key=AWS_A, market=SPOT,
                           created_at=w.clock.now(), status="pending"))
    inst = w.provider.launch(LaunchRequest(offering=offering, market=SPOT, decision_id="d-early", tags={
        TAG_JOB: j, TAG_CONTROLLER: "sim", TAG_MARKET: SPOT, TAG_DECISION: "d-early"}))

    new = _restart_controller(w)
    counts = new.recover()
    assert counts["adopted"] == 1 and counts["orphans_terminated"] == 0 and counts["decisions_failed"] == 0
    with w.store.session() as s:
        rows = w.store.instances(s, j)
        assert [(r.instance_id, r.decision_id, r.market) for r in rows] == [(inst.instance_id, "d-early", SPOT)]
        if how == "pending-decision":
            d = s.get(Decision, "d-early")
            assert d is not None and (d.status, d.instance_id) == ("launched", inst.instance_id)
    assert any(kind == "adopted" for _, kind, _, _ in w.events(j))

    w.controller = new
    w.run(horizon_s=86400.0)
    o = w.outcome(j)
    assert o.state == "SUCCEEDED" and o.attempts == 1
    assert [i.instance_id for i in w.provider.list_instances({TAG_JOB: j})] == [inst.instance_id]
    assert o.cost_usd == pytest.approx(provider_cost(w, j))
    assert_history_legal(w, j)


def test_recovery_releases_instances_of_a_job_that_ended() -> None:
    """A job ended (cancelled) but its instance is still alive on the cloud, recorded as alive: the
    restarted controller terminates it."""
    w = make_world(CALM)
    j = w.submit(spec(), workload())
    w.run(horizon_s=1000.0)
    inst = next(i for i in w.provider.list_instances({TAG_JOB: j}) if i.alive)
    # The cancel reached the database, the release never reached the cloud (the crash).
    with w.store.session() as s:
        job = s.get(Job, j)
        assert job is not None
        Store.transition(s, job, JobState.CANCELLED, "cancelled by user", ts=w.clock.now())
    counts = _restart_controller(w).recover()
    assert counts["released"] + counts["orphans_terminated"] >= 1
    assert w.provider.get(inst.instance_id).state is InstanceState.TERMINATED  # type: ignore[union-attr]
    with w.store.session() as s:
        assert all(r.state == "terminated" for r in w.store.instances(s, j))


# ----- capacity back-off -----

def _occupy(w: World, key: str) -> None:
    """Another tenant (another controller) takes the offering's only spot slot; the trace still
    reports room for one, so the policy tries it."""
    o = w.trace.offering_at(key, w.provider.now_s())
    w.provider.launch(LaunchRequest(offering=o, market=SPOT, decision_id=f"other-{key}",
                                    tags={TAG_CONTROLLER: "other-controller"}))


@pytest.mark.parametrize("policy", ["cheapest", "greedy-spot", "spotrain"])
def test_refused_capacity_is_avoided(service_pace: None, policy: str) -> None:
    """1a refuses spot capacity at t=0; at the next tick the policy backs off to 1b (spot) instead of
    asking 1a again, and the job runs there."""
    w = make_world(TWO_ZONES, get_policy(policy))
    _occupy(w, AWS_A)
    j = w.submit(spec(), workload())
    w.run(horizon_s=86400.0)
    o = w.outcome(j)
    assert o.state == "SUCCEEDED"
    refusals = [e for e in w.events(j) if e[1] == "capacity"]
    assert len(refusals) == 1 and AWS_A in refusals[0][3] and refusals[0][0] == 0.0
    with w.store.session() as s:
        decisions = list(s.scalars(select(Decision).where(Decision.job_id == j).order_by(Decision.created_at)))
    assert [(d.offering_key, d.market, d.status) for d in decisions] == [
        (AWS_A, SPOT, "failed"), (AWS_B, SPOT, "launched")]
    assert "CapacityUnavailable" in decisions[0].reason
    # No later than the very next tick: the refusal wakes the loop then, and the room belief finds 1a
    # worth a probe again even sooner (4.6 min after a refusal), where it is the cheaper option.
    assert 0.0 < decisions[1].created_at <= world_module.GRID_S
    assert [i.offering_key for i in w.provider.list_instances({TAG_JOB: j})] == [AWS_B]
    assert_history_legal(w, j)


def test_world_default_pace_backs_off_refused_capacity() -> None:
    """After a refused launch the simulator's loop decides again at the next tick, as the service
    does, so the job fails over to the zone with room instead of retrying the refusing one."""
    w = make_world(TWO_ZONES)
    _occupy(w, AWS_A)
    j = w.submit(spec(), workload())
    w.run(horizon_s=86400.0)
    assert w.outcome(j).state == "SUCCEEDED"
