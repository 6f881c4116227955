"""Human-readable rendering of jobs for the CLI (tables, progress lines, the run summary)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# ``spotrain status`` without --all: the live jobs and this many of the newest ended ones.
RECENT_ENDED = 20


def money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.4f}" if x < 10 else f"${x:,.2f}"


def progress_str(j: Mapping[str, Any]) -> str:
    total = j.get("total_steps")
    step = j.get("step") or 0
    if total:
        return f"{step}/{total} ({100.0 * step / total:.0f}%)"
    return str(step) if step else "-"


def workers_str(j: Mapping[str, Any]) -> str:
    ws = [w for w in j.get("workers", []) if w.get("state") != "terminated"]
    if not ws:
        return "-"
    groups: dict[str, int] = {}
    for w in ws:
        off = w["offering"].split("/")
        label = f"{w['market']} {off[0]}/{off[1]}/{off[2]}" if len(off) >= 3 else f"{w['market']} {w['offering']}"
        groups[label] = groups.get(label, 0) + int(w.get("gpus", 1))
    return ", ".join(f"{n}x {label}" for label, n in groups.items())


def table(jobs: Sequence[Mapping[str, Any]]) -> str:
    head = ("JOB", "STATE", "WORKERS", "PROGRESS", "COST", "PREEMPT")
    rows = [
        (j["job_id"], j["state"], workers_str(j), progress_str(j), money(j.get("cost_usd")), str(j.get("preemptions", 0)))
        for j in jobs
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*r) for r in rows])


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
