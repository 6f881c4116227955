"""Human-readable rendering of jobs for the CLI (tables, progress lines, the run summary)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

# ``spotrain status`` without --all: the live jobs and this many of the newest ended ones (issue 24).
RECENT_ENDED = 10


def money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.4f}" if x < 10 else f"${x:,.2f}"


def progress_str(j: Mapping[str, Any], *, percent: bool = True) -> str:
    total = j.get("total_steps")
    step = j.get("step") or 0
    if total:
        return f"{step}/{total} ({100.0 * step / total:.0f}%)" if percent else f"{step}/{total}"
    return str(step) if step else "-"


def workers_str(j: Mapping[str, Any], *, short: bool = False) -> str:
    """The live workers in a few words: ``2x g4dn.xlarge spot us-east-1a`` when all are alike, else
    ``3 workers (2 spot, 1 on-demand)``; ``short``: ``3 workers``. (Listing each offering made the
    column 135 characters wide; issue 24.)"""
    ws = [w for w in j.get("workers", []) if w.get("state") != "terminated"]
    if not ws:
        return "-"
    if short:
        return f"{len(ws)} worker{'s' if len(ws) > 1 else ''}"
    kinds = {(str(w.get("offering", "")), str(w.get("market", ""))) for w in ws}
    if len(kinds) == 1:
        offering, market = kinds.pop()
        parts = offering.split("/")  # cloud/zone/instance_type/accelerator:gpus
        where = f"{parts[2]} {market} {parts[1]}" if len(parts) >= 3 else f"{offering} {market}"
        return f"{len(ws)}x {where}"
    markets: dict[str, int] = {}
    for w in ws:
        market = str(w.get("market", ""))
        markets[market] = markets.get(market, 0) + 1
    counts = sorted(markets.items(), key=lambda kv: (-kv[1], kv[0]))  # most first
    return f"{len(ws)} workers ({', '.join(f'{n} {m}' for m, n in counts)})"


def terminal_width() -> int | None:
    """Columns to fit a table or a line in: ``COLUMNS`` when set, else the terminal's when stdout is
    one; None (no limit) for a pipe or a file, whose reader wants every field."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a line: ``drop`` orders the optional fields (lowest dropped first; None: never
    dropped); ``short`` is the form an essential field takes when even the essentials do not fit."""

    text: str
    drop: int | None = None
    short: str | None = None


def fit_line(fields: Sequence[Field], width: int | None, sep: str = "  ") -> str:
    """``fields`` joined by ``sep`` within ``width`` columns: optional fields are dropped first (in
    ``drop`` order), then essential ones take their short form, one at a time from the left. An
    essential field is never cut: the line may stay wider than ``width`` when even those do not fit."""
    kept = [f.text for f in fields]

    def line() -> str:
        return sep.join(t for t in kept if t)

    if width is None:
        return line()
    for i in sorted((i for i, f in enumerate(fields) if f.drop is not None), key=lambda i: fields[i].drop or 0):
        if len(line()) <= width:
            return line()
        kept[i] = ""
    for i, f in enumerate(fields):
        if len(line()) <= width:
            break
        if f.drop is None and f.short is not None:
            kept[i] = f.short
    return line()


_HEAD = ("JOB", "STATE", "WORKERS", "PROGRESS", "COST", "PREEMPT")


def table(jobs: Sequence[Mapping[str, Any]], width: int | None = None) -> str:
    """The jobs as a table; within ``width`` columns when given: the workers said shorter, then the
    PREEMPT and WORKERS columns left out, then the percentage. JOB, STATE, PROGRESS and COST are never
    left out nor cut."""
    tries = [(False, True, True, True), (True, True, True, True), (True, False, True, True),
             (True, False, False, True), (True, False, False, False)]
    text = ""
    for short_workers, preempt, workers, percent in tries if width is not None else tries[:1]:
        cols = [c for c in _HEAD if (c != "PREEMPT" or preempt) and (c != "WORKERS" or workers)]
        rows = [
            {"JOB": j["job_id"], "STATE": j["state"], "WORKERS": workers_str(j, short=short_workers),
             "PROGRESS": progress_str(j, percent=percent), "COST": money(j.get("cost_usd")),
             "PREEMPT": str(j.get("preemptions", 0))}
            for j in jobs
        ]
        widths = [max(len(c), *(len(r[c]) for r in rows)) if rows else len(c) for c in cols]
        lines = ["  ".join(f"{v:{w}}" for v, w in zip(vals, widths)).rstrip()
                 for vals in [cols] + [[r[c] for c in cols] for r in rows]]
        text = "\n".join(lines)
        if width is None or max(len(ln) for ln in lines) <= width:
            break
    return text


def summary(j: Mapping[str, Any]) -> str:
    metric = j.get("metric")
    name = j.get("metric_name") or "metric"
    cost = j.get("cost_usd") or 0.0
    od = j.get("on_demand_cost_usd") or 0.0
    succeeded = j.get("state") == "SUCCEEDED"
    lines = [f"job         {j['job_id']}  ({j['state']})"]
    if succeeded:  # a failed job's last metric is not a result
        lines.append(f"result      {name} = {metric:.4f}" if isinstance(metric, (int, float)) else "result      -")
    lines += [
        f"wall time   {j.get('wall_s', 0.0):.1f} s" + _deadline_note(j),
        f"preemptions {j.get('preemptions', 0)}" + (" survived" if succeeded else "")
        + (f", {j.get('restarts_on_errors')} restart(s) after errors" if j.get("restarts_on_errors") else ""),
    ]
    by_market = j.get("cost_by_market_usd") or {}
    parts = ", ".join(f"{m} {money(v)}" for m, v in by_market.items())
    if j.get("egress_usd"):
        moves = j.get("region_moves") or 0
        parts += f"{', ' if parts else ''}egress {money(j['egress_usd'])} for {moves} move(s) to another region or cloud"
    lines.append(f"cost        {money(cost)}  ({parts or 'nothing billed'}; billed market time: "
                 f"{(j.get('spot_seconds') or 0) / 3600:.2f} h spot, {(j.get('on_demand_seconds') or 0) / 3600:.2f} h on-demand)")
    if od > 0 and succeeded:  # savings on work that did not finish are no savings
        lines.append(f"on-demand   {money(od)} for the same instance-hours on-demand: spot saved {100 * (1 - cost / od):.0f}%")
    if j.get("final_model"):
        lines.append(f"model       {j['final_model']}")
    if not succeeded and j.get("reason"):
        lines.append(f"reason      {j['reason']}")
    lines.extend(error_tail_lines(j))
    return "\n".join(lines)


def _deadline_note(j: Mapping[str, Any]) -> str:
    """``deadline_met`` in words (nothing without a deadline or while the job runs)."""
    met = j.get("deadline_met")
    return "" if met is None else "; deadline met" if met else "; deadline MISSED"


def error_tail_lines(j: Mapping[str, Any]) -> list[str]:
    """The failing rank's traceback tail (``error_tail``), indented under the summary."""
    tail = j.get("error_tail")
    if not tail or j.get("state") == "SUCCEEDED":
        return []
    return ["error tail  (see spotrain logs " + str(j["job_id"]) + ")"] + [f"  | {ln}" for ln in str(tail).splitlines()]


def as_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
