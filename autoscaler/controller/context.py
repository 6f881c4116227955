"""What every part of the controller shares: its collaborators, its clock and its in-memory state.

The parts of the reconcile loop (gangs, launches, budget, views, recovery) are functions over a
``Context``: no part holds a reference to the ``Controller`` service, so the package has no import
cycle and each part can be tested on its own with a virtual clock.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from sqlalchemy.orm import Session

from autoscaler.fleet.market_watch import MarketWatcher, RoomWatcher, Watch
from autoscaler.jobs.domain import JobState
from autoscaler.jobs.scaling import measured_scaling
from autoscaler.jobs.spec import JobSpec, spec_from_dict
from cloud_providers.base import Provider
from cloud_providers.clock import Clock
from cloud_providers.executor import Executor
from cloud_providers.protocol import ProgressRecord
from cost_models.scaling import Scaling

from ..home import logs_dir
from ..policy import Policy
from ..state import Job, Store
from .fits import Fits
from .start_failures import StartFailures


@dataclasses.dataclass(frozen=True)
class Timings:
    """The controller's own time constants (seconds), in the controller's clock unless noted."""

    # A gang told to stop (rescale, a peer that checkpointed) gets this long to checkpoint and exit
    # (the runtime's notice deadline) ...
    stop_notice_s: float = 30.0
    # ... and is stopped this long after that (a checkpoint of a large model takes time).
    stop_grace_s: float = 120.0
    # How long a launch decision with no instance stays pending before it is failed.
    decision_grace_s: float = 120.0
    # How often (ticks) the controller lists its instances by tag to catch unknown ones.
    sweep_every_ticks: int = 10
    # Gangs lost in a row on healthy instances before any progress, after which the job fails.
    max_stalled_restarts: int = 5
    # The notice deadline given to workers when the cloud announced a preemption.
    preemption_notice_s: float = 2.0


class SpotHistory:
    """The market history's spot totals (``Store.spot_history``), the finished part summed once.

    A settled job (ended, no alive instance, no pending launch) has instance rows that do not change
    again, so its totals are added to ``settled`` once: the first call sums every settled job, each
    later call only the jobs that settled since (watched before, settled now), plus the unsettled
    jobs' rows. A tick's cost follows the live jobs, not every job ever submitted (issue 14, finding
    5). ``saw`` registers the jobs a tick found live, so one that ends before the next call is not
    missed. A settled job found unsettled again (an instance the cloud kept alive after its release
    got a notice) makes the next call sum every settled job again: never counted twice."""

    def __init__(self) -> None:
        self.settled: dict[str, tuple[float, int]] | None = None
        self.settled_ids: set[str] = set()
        self.watched: set[str] = set()

    def saw(self, job_ids: Iterable[str]) -> None:
        self.watched.update(job_ids)

    def totals(self, store: Store, s: Session, controller_id: str) -> list[tuple[str, float, int]]:
        unsettled = store.unsettled_jobs(s, controller_id)
        if self.settled is None or unsettled & self.settled_ids:
            self.settled = {}
            self._add(self.settled, store.spot_history(s, controller_id, exclude=unsettled))
            self.settled_ids = store.job_ids(s, controller_id) - unsettled
        elif self.watched - unsettled:
            done = self.watched - unsettled
            self._add(self.settled, store.spot_history(s, controller_id, jobs=done))
            self.settled_ids |= done
        self.watched = set(unsettled)
        out = dict(self.settled)
        if unsettled:
            self._add(out, store.spot_history(s, controller_id, jobs=unsettled))
        return [(k, held, pre) for k, (held, pre) in sorted(out.items())]

    @staticmethod
    def _add(into: dict[str, tuple[float, int]], totals: Iterable[tuple[str, float, int]]) -> None:
        for k, held, pre in totals:
            h0, p0 = into.get(k, (0.0, 0))
            into[k] = (h0 + held, p0 + pre)


# Parsed specs held by ``Context.spec`` (jobs ended by ``forget`` leave at once; this bounds the rest).
SPEC_CACHE_MAX = 4096


def gpus_of(offering_key: str) -> int:
    """GPUs per instance from an offering key (``cloud/zone/type/ACCEL:N``)."""
    try:
        return max(1, int(offering_key.rsplit(":", 1)[1]))
    except (IndexError, ValueError):
        return 1


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What the simulator changes about a controller, given to ``Controller(hooks=...)`` at its
    construction (nothing outside the controller sets its state afterwards). None/empty: the service's
    own behaviour."""

    # Where a job's worker logs go (the simulator's workers write none).
    logs_dir: Callable[[str], Path] | None = None
    # The job's throughput model (job_id, spec): the simulator's is the one its workers run at.
    scaling_of: Callable[[str, JobSpec], Scaling | None] | None = None
    # Offerings whose every price change wakes the controller (``Context.prices_seen_on_change``).
    prices_seen_on_change: frozenset[str] = frozenset()
    # What watching the market showed before the controller started (``MarketWatcher.seed``).
    market_seed: Mapping[str, Watch] | None = None


@dataclasses.dataclass
class Context:
    store: Store
    provider: Provider
    executor: Executor
    policy: Policy
    controller_id: str
    clock: Clock
    tick_s: float
    # Provider-clock seconds per controller-clock second (the local cloud's time scale).
    clock_rate: float
    timings: Timings = dataclasses.field(default_factory=Timings)
    # Where a job's worker logs go (the simulator's workers write none).
    logs_dir: Callable[[str], Path] = logs_dir
    # The job's throughput model for the policy (job_id, spec): the spec's profile when it names one.
    # The simulator gives it the model its simulated workers run at.
    scaling_of: Callable[[str, JobSpec], Scaling | None] = lambda _job_id, spec: measured_scaling(spec)
    # job_id -> {"<offering_key>|<market>": provider-clock time of the last capacity refusal}
    capacity_failures: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # job_id -> provider-clock marks of the last restart, for measuring its overhead: "disrupted" (the
    # gang got a notice or a stop), "ended" (it exited), "launched" (the new gang's newest instance).
    restart_marks: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # job_id -> (last checkpoint step seen, controller-clock time it was first seen)
    last_checkpoint: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    market: MarketWatcher = dataclasses.field(default_factory=MarketWatcher)
    # Spot room as launches, capacity errors and preemptions showed it (where the provider reports none).
    rooms: RoomWatcher = dataclasses.field(default_factory=RoomWatcher)
    # Prices of the last successful offerings() call, for the budget guard of a tick whose cloud calls fail.
    last_prices: dict[str, tuple[float, float | None]] = dataclasses.field(default_factory=dict)
    # Offerings whose every price change wakes the controller at that moment (the simulator's loop for
    # the markets it watches): the guard reserves their spot instances at the last price seen; any
    # other's price may rise unseen between two ticks, so it reserves them at their cap (budget.py).
    prices_seen_on_change: frozenset[str] = frozenset()
    ticks: int = 0
    last_tick_s: float = 0.0
    # job_id -> (gang attempt, controller-clock time its training first moved)
    moving_since: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    # job_id -> (gang attempt, controller-clock seconds per step the gang last reported): with the
    # steps left, the job's measured remaining time (the re-batch test's payback, goodput.py).
    step_seconds: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    # job_id -> instances the last allocation left out, billing on only until the running gang has
    # checkpointed and exited: no longer the job's in the policy's view.
    releasing: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    # Provider-clock time by which the policy asked to be asked again (None: no request).
    next_wake_s: float | None = None
    # The goodput model fitted for each job from its reports (``goodput.scaling_for``).
    goodput: Fits = dataclasses.field(default_factory=Fits)
    # The market history's spot totals, finished jobs summed once (issue 14, finding 5).
    spot_history: SpotHistory = dataclasses.field(default_factory=SpotHistory)
    _specs: dict[str, tuple[str, JobSpec]] = dataclasses.field(default_factory=dict)
    # Rank 0's reports read before the tick took the controller's lock (``Controller.tick``: reading
    # files a job can write never happens under it, issue 21 finding 1); None: read them as needed.
    progress_snapshot: dict[str, ProgressRecord | None] | None = None
    # Jobs whose ranks all exited 0 while their report read before the exit showed no completion:
    # the next tick's report (read after the exit) decides.
    exits_unconfirmed: set[str] = dataclasses.field(default_factory=set)
    # Each job's gang starts that failed in a row, and when to try again (issue 21, finding 6).
    start_failures: StartFailures = dataclasses.field(default_factory=StartFailures)
    # Whether this controller may act now: it holds its fleet's lease (always, without a lease). A
    # launch asks right before it calls the cloud; an error while it does not is the lease's loss.
    leading: Callable[[], bool] = lambda: True

    def fresh(self) -> Context:
        """The same collaborators, none of the in-memory state: what a controller taking over its
        fleet's lease starts from (another controller acted meanwhile)."""
        keep = ("store", "provider", "executor", "policy", "controller_id", "clock", "tick_s", "clock_rate",
                "timings", "logs_dir", "scaling_of", "prices_seen_on_change", "leading")
        return Context(**{name: getattr(self, name) for name in keep})

    def now(self) -> float:
        return self.clock.now()

    def transition(self, s: Session, job: Job, to: JobState, reason: str) -> None:
        Store.transition(s, job, to, reason, ts=self.clock.now())

    def note(self, s: Session, job: Job, kind: str, reason: str) -> None:
        Store.note(s, job, kind, reason, ts=self.clock.now())

    def spec(self, job: Job) -> JobSpec:
        """The job's validated spec, parsed once per stored text (not on every tick: issue 14, finding 5)."""
        hit = self._specs.get(job.job_id)
        if hit is not None and hit[0] == job.spec_json:
            return hit[1]
        spec = spec_from_dict(json.loads(job.spec_json))
        self._specs.pop(job.job_id, None)
        while len(self._specs) >= SPEC_CACHE_MAX:  # bounded: the oldest parsed go first
            self._specs.pop(next(iter(self._specs)))
        self._specs[job.job_id] = (job.spec_json, spec)
        return spec

    def progress(self, job_id: str) -> ProgressRecord | None:
        """Rank 0's report: as read before this tick took the lock, else from the executor."""
        snap = self.progress_snapshot
        if snap is not None and job_id in snap:
            return snap[job_id]
        return self.executor.progress(job_id)

    def progress_predates_exit(self, job_id: str) -> bool:
        """Whether this tick's report of ``job_id`` was read before its gang's exit was seen (then a
        completion written just before the exit may be missing from it)."""
        snap = self.progress_snapshot
        return snap is not None and job_id in snap

    def forget(self, job_id: str) -> None:
        """Drop what is held in memory for an ended job."""
        for d in (self.capacity_failures, self.restart_marks, self.last_checkpoint, self._specs, self.releasing,
                  self.moving_since, self.step_seconds, self.goodput, self.start_failures.failures):
            d.pop(job_id, None)
        self.exits_unconfirmed.discard(job_id)

