"""Tuning the spotrain policy's parameters on a market trace (issue 15: "tuned per market with Optuna").

The trace is split in time: the first ``train_fraction`` of it is the *training* window, the rest the
*held-back* window. Start times are drawn (seeded, uniform) so that each job's whole span (its deadline,
else its work on one GPU) lies inside its window: no training run sees a minute of the held-back market.

A trial's value is the mean over the training starts of cost / on-demand cost (each run normalized to
what running on-demand throughout would cost), run on the simulator's policy-only fast path
(``Simulation.run``, proven equal to the controller on a virtual clock by
``tests/policy/test_fast_path.py``). A trial whose parameters miss any deadline is infeasible: its value
is ``INFEASIBLE + misses``, above any feasible one, so the sampler learns to avoid it and it is never
the best while one feasible trial exists. The shipped defaults are enqueued as the first trial of a new
study, so the tuned result is never worse than the defaults *on the training window*; whether it is
better on the held-back window is what ``spotrain tune`` reports first.

Optuna is imported only inside ``tune`` (the ``tune`` extra); the rest needs only the simulator.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cloud_providers.local.market import MarketTrace

from ..simulator.engine import SimJob, Simulation
from .params import DEFAULT_PARAMS, TUNING_RANGES, PolicyParams
from .spotrain import SpotrainPolicy

# Above any feasible mean cost / on-demand (a policy that pays more than on-demand pays at most a few
# times it); an infeasible trial's value is this plus its deadline misses.
INFEASIBLE = 100.0


@dataclasses.dataclass(frozen=True)
class Windows:
    """Start-time ranges, seconds into the trace: training starts in ``[0, train_hi_s]``, held-back
    starts in ``[split_s, test_hi_s]``; each leaves the job's span inside its own window."""

    split_s: float
    span_s: float
    train_hi_s: float
    test_hi_s: float
    duration_s: float

    def to_json(self) -> dict[str, float]:
        return {"split_hours": self.split_s / 3600, "span_hours": self.span_s / 3600, "trace_hours": self.duration_s / 3600}


@dataclasses.dataclass(frozen=True)
class Score:
    """Mean (and p90) cost / on-demand over some starts, with the deadline misses among them."""

    mean_cost_ratio: float
    p90_cost_ratio: float
    misses: int
    runs: int

    def to_json(self) -> dict[str, float | int]:
        return {"mean_cost_over_on_demand": self.mean_cost_ratio, "p90_cost_over_on_demand": self.p90_cost_ratio,
                "deadline_misses": self.misses, "runs": self.runs}


def split_windows(trace: MarketTrace, job: SimJob, train_fraction: float) -> Windows:
    """The training and held-back start ranges; ``ValueError`` when either window is shorter than the
    job's span (a longer trace, a shorter deadline or another ``train_fraction`` is needed)."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train fraction must be in (0, 1), got {train_fraction!r}")
    span = float(job.spec.objective.deadline_s or job.work)
    split = trace.duration_s * train_fraction
    w = Windows(split_s=split, span_s=span, train_hi_s=split - span, test_hi_s=trace.duration_s - span,
                duration_s=trace.duration_s)
    for name, lo, hi in (("training", 0.0, w.split_s), ("held-back", w.split_s, w.duration_s)):
        if hi - lo < span:
            raise ValueError(f"the {name} window ({(hi - lo) / 3600:.1f} h of the {trace.duration_s / 3600:.1f} h trace) "
                             f"is shorter than the job's span ({span / 3600:.1f} h: its deadline, else its work)")
    return w


def window_starts(lo_s: float, hi_s: float, n: int, seed: int) -> list[float]:
    """``n`` seeded start times, uniform in ``[lo_s, hi_s]``, sorted."""
    rng = np.random.default_rng(seed)
    return sorted(float(x) for x in rng.uniform(lo_s, hi_s, n))


def train_and_test_starts(w: Windows, n_train: int, n_test: int, seed: int) -> tuple[list[float], list[float]]:
    """The training starts (seed ``seed``) and the held-back starts (seed ``seed + 1``)."""
    return window_starts(0.0, w.train_hi_s, n_train, seed), window_starts(w.split_s, w.test_hi_s, n_test, seed + 1)


def score(sim: Simulation, job: SimJob, params: PolicyParams, starts: Sequence[float]) -> Score:
    """The spotrain policy with ``params`` from each start, on the fast path."""
    policy = SpotrainPolicy(params)
    ratios, misses = [], 0
    for s in starts:
        r = sim.run(job, policy, s)
        ratios.append(r.cost_usd / r.on_demand_cost_usd if r.on_demand_cost_usd > 0 else math.inf)
        misses += 0 if r.deadline_met else 1
    a = np.array(ratios)
    return Score(float(a.mean()), float(np.percentile(a, 90)), misses, len(starts))


def objective_value(s: Score) -> float:
    """What the study minimizes: the mean cost / on-demand, or ``INFEASIBLE + misses`` with a miss."""
    return s.mean_cost_ratio if s.misses == 0 else INFEASIBLE + s.misses


def suggest(trial: Any) -> PolicyParams:
    """One point of ``TUNING_RANGES`` from an Optuna trial; fields without a range keep the default."""
    values: dict[str, float | int] = {}
    for name, r in TUNING_RANGES.items():
        if r is None:
            continue
        if isinstance(getattr(DEFAULT_PARAMS, name), int):
            values[name] = trial.suggest_int(name, int(r.lo), int(r.hi), log=r.log)
        else:
            values[name] = trial.suggest_float(name, r.lo, r.hi, log=r.log)
    return PolicyParams.from_mapping(values)


def default_point(params: PolicyParams = DEFAULT_PARAMS) -> dict[str, float | int]:
    """The defaults (or ``params``) as a trial (the searched fields only), enqueued first in a new study."""
    return {k: getattr(params, k) for k, r in TUNING_RANGES.items() if r is not None}


@dataclasses.dataclass(frozen=True)
class TuneResult:
    best: PolicyParams
    best_value: float
    trials: int
    infeasible_trials: int
    study_name: str


def combine(scores: Sequence[Score]) -> Score:
    """Several markets' scores as one (the shipped defaults' study, ``benchmarks/tune_defaults.py``):
    the mean over them of each one's mean (and p90) cost / on-demand, every miss among them."""
    return Score(float(np.mean([s.mean_cost_ratio for s in scores])), float(np.mean([s.p90_cost_ratio for s in scores])),
                 sum(s.misses for s in scores), sum(s.runs for s in scores))


def tune(sim: Simulation, job: SimJob, starts: Sequence[float], *, trials: int, seed: int, storage: str, study_name: str,
         on_trial: Callable[[int, float], None] | None = None) -> TuneResult:
    """Run ``trials`` more trials of a seeded-TPE study (created, or resumed from ``storage``) and return
    the best parameters found over all its trials."""
    return tune_with(lambda p: score(sim, job, p, starts), trials=trials, seed=seed, storage=storage, study_name=study_name,
                     on_trial=on_trial)


def tune_with(evaluate: Callable[[PolicyParams], Score], *, trials: int, seed: int, storage: str | None, study_name: str,
              on_trial: Callable[[int, float], None] | None = None, first: PolicyParams = DEFAULT_PARAMS) -> TuneResult:
    """``tune`` for any evaluation of a parameters object (one market's ``score``, or several
    ``combine``d); ``storage`` None keeps the study in memory; ``first`` is a new study's trial 0."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=seed + len(_done(optuna, study_name, storage))))
    if not study.trials:
        study.enqueue_trial(default_point(first))

    def objective(trial: Any) -> float:
        s = evaluate(suggest(trial))
        trial.set_user_attr("mean_cost_over_on_demand", s.mean_cost_ratio)
        trial.set_user_attr("deadline_misses", s.misses)
        v = objective_value(s)
        if on_trial is not None:
            on_trial(trial.number, v)
        return v

    study.optimize(objective, n_trials=trials)
    done = [(float(t.value), t.number, t.params) for t in study.trials if t.value is not None]
    value, _, best = min(done, key=lambda d: (d[0], d[1]))
    params = PolicyParams.from_mapping({k: v for k, v in best.items() if k in TUNING_RANGES})
    return TuneResult(best=params, best_value=value, trials=len(done),
                      infeasible_trials=len([d for d in done if d[0] >= INFEASIBLE]), study_name=study_name)


def _done(optuna: Any, study_name: str, storage: str | None) -> list[Any]:
    """The finished trials of an existing study (none for a new one): a resumed study's sampler is
    seeded past them, so resuming does not replay the first run's proposals."""
    if storage is None:
        return []
    try:
        return [t for t in optuna.load_study(study_name=study_name, storage=storage).trials if t.value is not None]
    except KeyError:
        return []
