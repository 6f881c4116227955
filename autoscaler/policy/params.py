"""The spotrain policy's tuned constants, as one frozen parameters object (issue 10).

Every number that sets how the policy trades money against risk lives here, with its unit, so that a
tuner (the policy issue's Optuna study) can choose them and write them out as JSON, and the policy
reads them from one place: ``SpotrainPolicy(params)`` passes them down to every step of ``plan_job``.
``DEFAULT_PARAMS`` are the hand-tuned values the rounds in ``docs/policy.md`` settled on (kept as
``HAND_DEFAULTS`` in ``benchmarks/tune_defaults.py``), which a seeded Optuna study on the benchmark's
generated markets confirmed (issue 15: ``tune_defaults.py --guard --guard-all-cells 0.005``, TPE seed 0,
150 trials; its best trial was 1.1 % cheaper on the held-back starts but dearer on the 4-zone
fraction-0.9 row of the benchmark, where uniform-progress would then have been cheaper: docs/policy.md,
"How the shipped defaults were chosen").

``PolicyParams.from_mapping`` / ``to_dict`` are the JSON edge: unknown names, wrong types and values out
of range raise ``ValueError`` with one line naming the field. Construction validates too, so an
invalid object cannot exist. ``load_params_file`` / ``save_params_file`` are the file edge (what
``spotrain tune --out`` writes and ``--policy-params FILE`` reads): a JSON or YAML mapping of names to
numbers, names left out keeping their defaults.

``TUNING_RANGES`` (below the dataclass) is the search space ``spotrain tune`` samples: for each field
the range a tuner may try, narrower than the field's validity range (a knob worth trying, not every
value the policy accepts), or ``None`` for a field that states a fact rather than a trade-off.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cloud_providers.safe_files import FileRefused, load_document
from cost_models.batching import DEFAULT_REBATCH, RebatchRule

from .jobmath import CAPACITY_BACKOFF_S, DEFAULT_RESTART_OVERHEAD_S


def _f(default: float, lo: float, hi: float) -> Any:
    """A float field with its inclusive range."""
    return dataclasses.field(default=default, metadata={"type": float, "min": lo, "max": hi})


def _i(default: int, lo: int, hi: int) -> Any:
    """An integer field with its inclusive range."""
    return dataclasses.field(default=default, metadata={"type": int, "min": lo, "max": hi})


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyParams:
    """The spotrain policy's knobs. Names end in their unit where they have one."""

    # ---- candidates ----
    # How many single-offering spot gangs to consider per gang size, least risky first (bounds the
    # work per job). Count.
    spot_candidates: int = _i(4, 1, 64)
    # How many on-demand gangs to consider per gang size, cheapest per unit of work first. Count.
    od_candidates: int = _i(2, 1, 64)

    # ---- scoring ----
    # Planning horizon of goodput per dollar when the job has no nearer end. Seconds.
    horizon_s: float = _f(6 * 3600.0, 60.0, 30 * 86400.0)
    # Candidates within this share of the best goodput per dollar count as ties, broken by speed
    # (Pollux's lesson: take the speedup while it costs little efficiency). Share, 0..1.
    faster_tolerance: float = _f(0.2, 0.0, 1.0)
    # A provider's preemption notice shorter than this may not leave time to save a checkpoint
    # (GCP gives 30 s): the work since the last checkpoint then counts as lost. Seconds.
    short_notice_s: float = _f(30.0, 0.0, 3600.0)
    # Restart overhead assumed until the job's own checkpoint + restart times are measured. Seconds.
    default_restart_overhead_s: float = _f(DEFAULT_RESTART_OVERHEAD_S, 0.0, 86400.0)
    # A spot market that refused capacity offers no more room than the job holds there for this
    # long (SkyPilot's failover: retrying at once would fail again). Seconds. The constant the
    # baselines share (``tests/policy/test_params.py`` holds them equal).
    capacity_backoff_s: float = _f(CAPACITY_BACKOFF_S, 0.0, 86400.0)

    # ---- deadline ----
    # The Safety Net's margin in restarts d (Can't Be Late: 2d), on top of one decision interval and
    # the work a short notice may lose. Below 1 a preemption at the net could not be recovered.
    # Restarts.
    safety_net_restarts: float = _f(2.0, 1.0, 10.0)
    # Float tolerance on the slack: a gang that entered spot with exactly the Safety Net's slack must
    # not be moved off it by rounding. Seconds.
    slack_tolerance_s: float = _f(1.0, 0.0, 60.0)
    # Slack kept, beyond the reserve's restart cycles, for the time no eligible spot market has room
    # (several markets; the fallback time x the chance all are out at once), as a multiple of that
    # expectation, tapered to zero as the restart overhead d reaches two decision intervals (with
    # cheap restarts riding such outages out on demand costs little). Multiple.
    outage_reserve: float = _f(0.7, 0.0, 100.0)
    # With slack to spare, wait for a spot offering this much cheaper per unit of work than the best
    # one with room now. Share (0.05 = 5 % cheaper).
    wait_premium: float = _f(0.05, 0.0, 10.0)
    # ... and only when its mean outage, this many times over (outages are heavy-tailed), still leaves
    # the slack above the reserve. Multiple of the mean outage.
    outage_margin: float = _f(1.5, 0.0, 100.0)
    # ... and only when what waiting saves (the price gap, plus a restart over the expected outage:
    # the alternative is to start now and move when the cheaper one is back) beats the value of
    # the slack it spends: this many times the time the rest of the work needs on the fallback
    # over the slack to spare above the reserve (slack is dear when there is little per hour of
    # work left). Share of the spot price per hour of slack, at one hour of fallback per hour of
    # spare slack.
    wait_slack_value: float = _f(0.05, 0.0, 10.0)
    # At the reserve, on-demand is left for spot with less slack than a full cycle only for an
    # availability run at least this old (Lindy: old runs outlast the restarts). Hours.
    established_run_h: float = _f(2.0, 0.0, 1000.0)
    # A job on demand with no spot room gives its gang up to wait only with this many restart cycles
    # (2d + lag) of slack above the reserve (hysteresis). Cycles.
    od_release_cycles: float = _f(1.0, 0.0, 1000.0)

    # ---- switching (exploitation) ----
    # A running spot gang moves to a cheaper spot offering only when the expected saving pays this
    # many restarts. Restarts (of the new gang's price times d).
    switch_margin: float = _f(3.0, 0.0, 1000.0)
    # ... and only while the slack after that restart stays this many restart cycles (d + lag) above
    # the reserve: under a tight deadline the slack a move spends is what later keeps the job off
    # on-demand. Cycles.
    switch_cushion_cycles: float = _f(4.0, 0.0, 1000.0)
    # ... except for a saving that pays this many restarts (a dear zone next to a long run of one
    # 20 % cheaper, hours from the end). Restarts.
    big_switch_margin: float = _f(8.0, 0.0, 1000.0)
    # ... for which this many cycles (d + lag) above the reserve are cushion enough. Cycles.
    big_cushion_cycles: float = _f(1.0, 0.0, 1000.0)
    # Re-pricing (issue 23: no freeze): at every decision a running gang is valued against the best
    # alternative with its move priced in (restart, transfer time and egress, the downtime at the
    # job's cost of time), in any mode but the Safety Net: it moves when the expected saving over
    # the expected stay pays this many times the move's cost and the slack after the move still
    # covers one more restart above the Safety Net. Multiple of the move's cost.
    reprice_margin: float = _f(3.0, 0.5, 1000.0)
    # Among candidates as fast as the best, one that keeps the job's state in its region (and cloud)
    # is preferred to a move while its goodput per dollar is within this share of the best (issue
    # 23: forced restarts after preemptions should not wander between regions). Share, 0..1.
    home_tolerance: float = _f(0.1, 0.0, 1.0)
    # Hysteresis that counts the moves already made (issue 23: no thrash): each move of the job's
    # state to another region or cloud raises what the next voluntary move must save by this share
    # of its cost (and the egress a forced restart elsewhere weighs in the score). Share per move.
    move_hysteresis: float = _f(0.5, 0.0, 100.0)

    # ---- re-batching (adaptive batch; cost_models.batching's re-batch test) ----
    # A running gang restarts only to change its batch when the goodput it gains is more than this
    # share (Pollux re-optimises at 5 %). Share.
    rebatch_min_gain: float = _f(DEFAULT_REBATCH.min_gain, 0.0, 10.0)
    # ... and the time it saves over the job's measured remaining work pays this many restarts.
    # Restarts.
    rebatch_payback_restarts: float = _f(DEFAULT_REBATCH.payback_restarts, 0.0, 1000.0)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, base: PolicyParams | None = None) -> PolicyParams:
        """Parameters from a mapping (a tuner's JSON); names it leaves out keep ``base``'s values
        (``DEFAULT_PARAMS``). Raises ``ValueError`` naming the field for an unknown name, a wrong
        type or a value out of range."""
        if not isinstance(values, Mapping):
            raise TypeError(f"policy parameters: expected a mapping of names to numbers, got {type(values).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in values.items():
            if name not in fields:
                raise ValueError(f"policy parameter {name!r} is unknown (known: {', '.join(sorted(fields))})")
            _check(fields[name], value)
        merged: dict[str, Any] = {**(base or DEFAULT_PARAMS).to_dict(), **values}
        kwargs: dict[str, Any] = {k: (float(v) if fields[k].metadata["type"] is float else v) for k, v in merged.items()}
        return cls(**kwargs)

    @property
    def rebatch(self) -> RebatchRule:
        """The re-batch test's thresholds, as ``cost_models.batching`` takes them."""
        return RebatchRule(min_gain=self.rebatch_min_gain, payback_restarts=self.rebatch_payback_restarts)

    def to_dict(self) -> dict[str, float | int]:
        """Every parameter by name (what ``from_mapping`` reads back)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _check(f: dataclasses.Field[Any], value: object) -> None:
    kind, lo, hi = f.metadata["type"], f.metadata["min"], f.metadata["max"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"policy parameter {f.name!r} must be {what}, got {value!r}")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"policy parameter {f.name!r} must be in [{lo:g}, {hi:g}], got {value!r}")


DEFAULT_PARAMS = PolicyParams()


@dataclasses.dataclass(frozen=True)
class Range:
    """A tuner's range for one field: ``[lo, hi]``, sampled on a log scale when ``log``."""

    lo: float
    hi: float
    log: bool = False


# What ``spotrain tune`` searches, one entry per field of ``PolicyParams`` (tests check the keys match
# and each range holds the default and lies within the field's validity range). ``None``: held at the
# default, because the field is a fact or a tolerance, not a trade-off a market could move:
# ``short_notice_s`` is the provider's notice below which a checkpoint may not be saved (GCP: 30 s),
# ``default_restart_overhead_s`` is replaced by the job's measured (or simulated) overhead, and
# ``slack_tolerance_s`` absorbs float rounding. ``rebatch_*`` are held too: the tuner's market
# benchmark trains fixed batches, so nothing there could move them.
TUNING_RANGES: dict[str, Range | None] = {
    "spot_candidates": Range(1, 8),
    "od_candidates": Range(1, 4),
    "horizon_s": Range(3600.0, 2 * 86400.0, log=True),
    "faster_tolerance": Range(0.0, 0.5),
    "short_notice_s": None,
    "default_restart_overhead_s": None,
    "capacity_backoff_s": Range(60.0, 3600.0, log=True),
    "safety_net_restarts": Range(1.0, 4.0),
    "slack_tolerance_s": None,
    "outage_reserve": Range(0.0, 3.0),
    "wait_premium": Range(0.0, 0.5),
    "outage_margin": Range(0.5, 8.0),
    "wait_slack_value": Range(0.0, 0.3),
    "established_run_h": Range(0.0, 12.0),
    "od_release_cycles": Range(0.0, 6.0),
    "switch_margin": Range(0.5, 12.0),
    "switch_cushion_cycles": Range(0.0, 12.0),
    "big_switch_margin": Range(2.0, 30.0),
    "big_cushion_cycles": Range(0.0, 6.0),
    "reprice_margin": Range(1.0, 8.0),
    "move_hysteresis": Range(0.0, 2.0),
    "home_tolerance": Range(0.0, 0.3),
    "rebatch_min_gain": None,
    "rebatch_payback_restarts": None,
}


def load_params_file(path: str | Path) -> PolicyParams:
    """Parameters from a JSON or YAML file (``.yaml``/``.yml`` read as YAML, anything else as JSON).
    Raises ``ValueError`` with one line naming the file and, for a bad value, the field."""
    p = Path(path)
    # The product's one bounded reader (issue 21, finding 11): a regular file of at most 1 MiB, no
    # aliases, duplicate keys, huge integers or deep nesting; a FIFO or /dev/zero is refused at once.
    try:
        values = load_document(p, what="policy parameters file")
    except FileRefused as exc:
        raise ValueError(str(exc)) from None
    try:
        return PolicyParams.from_mapping(values if values is not None else {})
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"policy parameters file {p}: {exc}") from None


def save_params_file(params: PolicyParams, path: str | Path) -> Path:
    """Write every parameter to ``path`` (YAML for ``.yaml``/``.yml``, else JSON); what
    ``load_params_file`` reads back to an equal object."""
    p = Path(path)
    values = params.to_dict()
    if p.suffix.lower() in (".yaml", ".yml"):
        import yaml

        text = yaml.safe_dump(values, sort_keys=False)
    else:
        import json

        text = json.dumps(values, indent=2) + "\n"
    p.write_text(text)
    return p
