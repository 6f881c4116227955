"""A job's summary (``schemas.JobSummary``) from its stored row and instance rows: light on purpose.

The controller's API and ``spotrain status`` build it here; ``status`` without a controller reads the
database with the standard library's ``sqlite3`` (``cli/offline.py``) and must not import the
controller, the policy (scipy) or SQLAlchemy to show a table: rows are read duck-typed (any object
with the ``Job`` / ``InstanceRow`` attribute names).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoscaler.jobs.domain import JobState
from cloud_providers.base import ON_DEMAND, SPOT, InstanceState
from cloud_providers.durations import parse_duration_s

if TYPE_CHECKING:  # pydantic's models are built when imported: 0.1-0.2 s that status need not pay
    from autoscaler.server.schemas import JobSummary


def split_reason(reason: str) -> tuple[str, str | None]:
    """A stored reason as (its one-line reason, the failing rank's log tail or None): a user-code
    failure's reason is one line, then the tail indented by four spaces (``controller/outcomes.py``)."""
    first, _, rest = reason.partition("\n")
    if not rest:
        return first, None
    return first, "\n".join(ln[4:] if ln.startswith("    ") else ln for ln in rest.splitlines())


def stored_deadline_s(spec_json: str) -> float | None:
    """``objective.deadline`` of a stored spec in seconds (``<seconds>s``, or bare seconds in rows
    written before durations needed a unit); None without one or when unreadable."""
    try:
        value = json.loads(spec_json).get("objective", {}).get("deadline")
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) if math.isfinite(value) and value > 0 else None
        return parse_duration_s(value)
    except (ValueError, AttributeError, TypeError):
        return None


def _deadline_met(job: Any) -> bool | None:
    """DESIGN.md's ``deadline_met``: for an ended job with ``objective.deadline``, whether it succeeded
    within the deadline, measured on the provider clock from submission (the clock the policy plans
    deadlines on; the controller clock runs slower on a time-compressed local cloud). Null while the
    job runs, without a deadline, or for a job that ended before its finish was recorded."""
    if not JobState(job.state).terminal:
        return None
    deadline_s = stored_deadline_s(job.spec_json)
    if deadline_s is None:
        return None
    if job.state != JobState.SUCCEEDED.value:
        return False
    if job.finished_clock_s is None:
        return None
    return bool(job.finished_clock_s - job.submitted_clock_s <= deadline_s)


def _batch_size(batch_json: str) -> int | None:
    """The batch size the controller told the job's last gang (None: the spec's)."""
    try:
        size = json.loads(batch_json)["batch_size"] if batch_json else None
    except (ValueError, KeyError, TypeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def summary_dict(job: Any, rows: Sequence[Any], *, now: float | None = None) -> dict[str, Any]:
    """The fields of ``schemas.JobSummary`` as plain values (no pydantic: ``status`` without a
    controller prints them straight away, ``finite_json`` making them the API's JSON)."""
    now = time.time() if now is None else now
    live = [r for r in rows if r.state != InstanceState.TERMINATED.value]
    by_market: dict[str, float] = {}
    for r in rows:
        by_market[r.market] = by_market.get(r.market, 0.0) + r.cost_usd
    reason, error_tail = split_reason(job.reason or "")
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": JobState(job.state).value,
        "reason": reason,
        "error_tail": error_tail,
        "cloud": job.cloud,
        "preemptions": job.preemptions,
        "restarts_on_errors": job.restarts_on_errors,
        "attempts": job.attempt,
        "cost_usd": round(job.cost_usd, 6),
        "on_demand_cost_usd": round(job.on_demand_cost_usd, 6),
        "cost_by_market_usd": {k: round(v, 6) for k, v in sorted(by_market.items())},
        # Moving the job's state to another region or cloud (issue 23): egress (in cost_usd), moves.
        "egress_usd": round(getattr(job, "egress_usd", 0.0) or 0.0, 6),
        "region_moves": getattr(job, "region_moves", 0) or 0,
        "checkpoint_size_gb": getattr(job, "checkpoint_size_gb", None),
        "metric": job.metric,
        "metric_name": job.metric_name or None,
        "loss": job.loss,
        "step": job.step,
        "total_steps": job.total_steps,
        "last_checkpoint_step": job.last_checkpoint_step,
        "final_model": job.final_model if job.state == JobState.SUCCEEDED.value else None,
        "checkpoint_uri": job.checkpoint_uri,
        "submitted_at": job.submitted_at,
        "finished_at": job.finished_at,
        "wall_s": (job.finished_at or now) - job.submitted_at,
        "restart_overhead_s": job.restart_overhead_s,
        "batch_size": _batch_size(getattr(job, "batch_json", "") or ""),
        "workers": [
            {"instance_id": r.instance_id, "offering": r.offering_key, "market": r.market,
             "state": InstanceState(r.state).value, "gpus": r.gpus}
            for r in live
        ],
        "spot_seconds": round(sum(r.billed_seconds for r in rows if r.market == SPOT), 3),
        "on_demand_seconds": round(sum(r.billed_seconds for r in rows if r.market == ON_DEMAND), 3),
        "deadline_met": _deadline_met(job),
    }


def finite_json(value: Any) -> Any:
    """``value`` with non-finite floats as None, as the API sends them (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_json(v) for v in value]
    return value


def job_summary(job: Any, rows: Sequence[Any], *, now: float | None = None) -> JobSummary:
    """The job as the API and the CLI show it (``schemas.JobSummary``). ``now``: the controller
    clock, for a live job's wall time (default: the wall clock)."""
    from autoscaler.server.schemas import JobSummary

    return JobSummary.model_validate(summary_dict(job, rows, now=now))
