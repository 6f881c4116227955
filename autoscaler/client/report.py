"""A job's report picture (``spotrain report JOB``, the dashboard's ``/ui``): one PNG of three panels.

1. Progress (fraction of the planned steps) against time, with the deadline as a vertical line and the
   pace that would just meet it as a dashed diagonal.
2. GPUs held by market (spot / on-demand) over time, stacked.
3. Cumulative cost against the on-demand counterfactual (the same instance-hours at on-demand prices),
   with the budget as a horizontal line; egress for moving the job's state between regions or clouds
   is a step in the billed cost.

Preemptions (red) and gang restarts (grey) are marked on every panel. The x axis is the provider's
clock since submission: the clock deadlines, billing and instance times are kept on (the local cloud
runs it faster than the wall clock). Events are dated on the controller's clock; they are mapped onto
the provider's through anchors both clocks dated (submission, launches, the end).

``gather`` reads the state database (no plotting library); ``render_png`` imports matplotlib lazily
with its Agg backend and no pyplot (no global figure state: the controller renders from threads).
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from autoscaler.errors import JobNotFound, SpecError
from autoscaler.jobs.spec import spec_from_stored
from autoscaler.state import Store
from autoscaler.state.models import ProgressSample

SPOT, ON_DEMAND = "spot", "on-demand"
_LAUNCHED = re.compile(r"^(\S+) on ")
# The controller's "moved" event (``controller/gangs._carry_state``): "... egress $12.34".
_EGRESS = re.compile(r"egress \$([0-9.]+)$")


@dataclasses.dataclass(frozen=True)
class Span:
    """One instance's life on the provider clock (seconds since submission) and what it cost."""

    start_s: float
    end_s: float
    market: str
    gpus: int
    cost_usd: float
    on_demand_cost_usd: float


@dataclasses.dataclass(frozen=True)
class ReportData:
    job_id: str
    state: str
    step: int
    total_steps: int | None
    deadline_s: float | None
    budget_usd: float | None
    end_s: float
    # (seconds since submission, steps done)
    progress: tuple[tuple[float, int], ...]
    spans: tuple[Span, ...]
    preemptions_s: tuple[float, ...]
    restarts_s: tuple[float, ...]
    # Egress billed for moving the job's state to another region or cloud: (seconds since submission,
    # USD), counted into the cumulative cost as a step (issue 23).
    egress: tuple[tuple[float, float], ...] = ()


def _clock_map(anchors: Sequence[tuple[float, float]], rate_default: float = 1.0) -> tuple[float, float, float]:
    """(wall0, clock0, rate): the line through the widest-apart anchors (wall, provider clock)."""
    wall0, clock0 = anchors[0]
    far = max(anchors, key=lambda a: a[0] - wall0)
    rate = (far[1] - clock0) / (far[0] - wall0) if far[0] - wall0 > 1e-6 else rate_default
    return wall0, clock0, rate if rate > 0 else rate_default


def gather(store: Store, ref: str, *, now_clock_s: float | None = None) -> ReportData:
    """What the picture shows for job ``ref`` (id or name). ``now_clock_s``: the provider clock now,
    for a live job (default: its newest known time)."""
    with store.session() as s:
        job = store.job(s, ref)
        if job is None:
            raise JobNotFound(f"no job {ref!r}")
        rows = store.instances(s, job.job_id)
        events = store.events(s, job.job_id)
        samples = list(s.scalars(select(ProgressSample).where(ProgressSample.job_id == job.job_id)
                                 .order_by(ProgressSample.id)))
        t0 = job.submitted_clock_s
        anchors = [(job.submitted_at, t0)]
        launched_at = {r.instance_id: r.launched_at_s for r in rows}
        for e in events:
            m = _LAUNCHED.match(e.reason) if e.kind == "launched" else None
            if m and m.group(1) in launched_at:
                anchors.append((e.ts, launched_at[m.group(1)]))
        anchors += [(p.ts, p.clock_s) for p in samples]
        if job.finished_at is not None and job.finished_clock_s is not None:
            anchors.append((job.finished_at, job.finished_clock_s))
        wall0, clock0, rate = _clock_map(anchors)

        def since(wall_ts: float) -> float:
            return max(0.0, clock0 + (wall_ts - wall0) * rate - t0)

        known = [a[1] for a in anchors] + [r.terminated_at_s or r.launched_at_s for r in rows]
        end_abs = job.finished_clock_s if job.finished_clock_s is not None else (now_clock_s or max(known))
        end_s = max(1e-3, end_abs - t0)
        spans = tuple(Span(start_s=max(0.0, r.launched_at_s - t0), end_s=max(0.0, (r.terminated_at_s or end_abs) - t0),
                           market=r.market, gpus=r.gpus, cost_usd=r.cost_usd, on_demand_cost_usd=r.on_demand_cost_usd)
                      for r in rows)
        progress = [(0.0, 0)] + [(max(0.0, p.clock_s - t0), p.step) for p in samples] + [(end_s, job.step)]
        preempted = tuple(since(e.ts) for e in events if e.kind == "preemption-notice")
        restarts = tuple(since(e.ts) for e in events if e.kind == "gang-stopped")
        egress = tuple((since(e.ts), float(m.group(1))) for e in events if e.kind == "moved"
                       and (m := _EGRESS.search(e.reason)) is not None)
        try:
            objective = spec_from_stored(json.loads(job.spec_json)).objective
            deadline_s, budget_usd = objective.deadline_s, objective.budget_usd
        except (ValueError, SpecError):
            deadline_s = budget_usd = None
        return ReportData(job_id=job.job_id, state=job.state, step=job.step, total_steps=job.total_steps,
                          deadline_s=deadline_s, budget_usd=budget_usd, end_s=end_s, progress=tuple(progress),
                          spans=spans, preemptions_s=preempted, restarts_s=restarts, egress=egress)


def horizon_s(data: ReportData) -> float:
    """How far the time axis goes: to the deadline while it is in view, else to the job's end (an
    ended job far inside its deadline would be squeezed into a corner; the deadline is then noted)."""
    if data.deadline_s is not None and data.deadline_s <= 2 * data.end_s:
        return max(data.end_s, data.deadline_s) * 1.02
    return data.end_s * 1.02


def _grid(data: ReportData, n: int = 240) -> list[float]:
    horizon = horizon_s(data)
    edges = {0.0, data.end_s, horizon}
    for sp in data.spans:
        edges |= {sp.start_s, sp.end_s}
    return sorted(edges | {horizon * i / n for i in range(n + 1)})


def gpus_by_market(data: ReportData, ts: Sequence[float]) -> dict[str, list[int]]:
    """GPUs held in each market at each time of ``ts`` (an instance counts over [start, end))."""
    out = {SPOT: [0] * len(ts), ON_DEMAND: [0] * len(ts)}
    for sp in data.spans:
        series = out.setdefault(sp.market, [0] * len(ts))
        for i, t in enumerate(ts):
            if sp.start_s <= t < sp.end_s:
                series[i] += sp.gpus
    return out


def cumulative_cost(data: ReportData, ts: Sequence[float]) -> tuple[list[float], list[float]]:
    """(billed, on-demand counterfactual) up to each time of ``ts``: each instance's cost spread evenly
    over its life (it ends at the instance's billed total)."""
    billed, od = [0.0] * len(ts), [0.0] * len(ts)
    for sp in data.spans:
        life = max(sp.end_s - sp.start_s, 1e-9)
        for i, t in enumerate(ts):
            f = min(1.0, max(0.0, (t - sp.start_s) / life))
            billed[i] += sp.cost_usd * f
            od[i] += sp.on_demand_cost_usd * f
    for at_s, usd in data.egress:  # billed once, when the state moved (on demand would move it too)
        for i, t in enumerate(ts):
            if t >= at_s:
                billed[i] += usd
    return billed, od


def _time_unit(horizon_s: float) -> tuple[float, str]:
    if horizon_s >= 3 * 3600:
        return 3600.0, "hours"
    if horizon_s >= 180:
        return 60.0, "minutes"
    return 1.0, "seconds"


def render_png(data: ReportData, *, dpi: int = 100) -> bytes:
    """The three panels as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ts = _grid(data)
    div, unit = _time_unit(horizon_s(data))
    x = [t / div for t in ts]
    fig = Figure(figsize=(9, 8), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax_p, ax_w, ax_c = fig.subplots(3, 1, sharex=True)
    fig.suptitle(f"{data.job_id} ({data.state})")
    _progress_panel(ax_p, data, div)
    gpus = gpus_by_market(data, ts)
    ax_w.stackplot(x, *gpus.values(), labels=list(gpus), step="post", colors=["#2a9d8f", "#e76f51", "#8d99ae"][:len(gpus)])
    ax_w.set_ylabel("GPUs held")
    ax_w.legend(loc="upper right", fontsize="small")
    billed, od = cumulative_cost(data, ts)
    ax_c.plot(x, billed, color="#264653", label="billed")
    ax_c.plot(x, od, color="#e9c46a", linestyle="--", label="on-demand counterfactual")
    if data.budget_usd is not None and data.budget_usd <= 3 * max(od + billed + [1e-9]):
        ax_c.axhline(data.budget_usd, color="#9b2226", linewidth=1, label=f"budget ${data.budget_usd:g}")
    elif data.budget_usd is not None:
        ax_c.set_title(f"budget ${data.budget_usd:g} (off the scale)", fontsize="small", loc="right")
    ax_c.set_ylabel("cumulative cost (USD)")
    ax_c.set_xlabel(f"time since submission ({unit}, market clock)")
    ax_c.legend(loc="upper left", fontsize="small")
    for ax in (ax_p, ax_w, ax_c):
        ax.set_xlim(0, horizon_s(data) / div)
        for i, t in enumerate(data.preemptions_s):
            ax.axvline(t / div, color="#d62828", linewidth=1, alpha=0.8, label="preemption" if ax is ax_p and i == 0 else None)
        for i, t in enumerate(data.restarts_s):
            ax.axvline(t / div, color="#6c757d", linewidth=1, linestyle=":", label="restart" if ax is ax_p and i == 0 else None)
        ax.grid(alpha=0.3)
    ax_p.legend(loc="upper left", fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _progress_panel(ax: Any, data: ReportData, div: float) -> None:
    total = data.total_steps or max((p[1] for p in data.progress), default=0) or 1
    xs = [t / div for t, _ in data.progress]
    ys = [100.0 * st / total for _, st in data.progress]
    # Through the durable checkpoints (marked): work after the last one would be redone after a loss.
    ax.plot(xs, ys, color="#1d3557", marker="o", markersize=3,
            label=f"progress ({data.step}/{data.total_steps or '?'} steps; dots: checkpoints)")
    if data.deadline_s is not None and data.deadline_s > horizon_s(data):
        ax.set_title(f"deadline at {data.deadline_s / div:g} {_time_unit(horizon_s(data))[1]}: beyond the end",
                     fontsize="small", loc="right")
    elif data.deadline_s is not None:
        d = data.deadline_s / div
        ax.axvline(d, color="#9b2226", linewidth=1.5, label="deadline")
        ax.plot([0, d], [0, 100], color="#9b2226", linestyle="--", linewidth=1, label="pace to meet it")
    ax.set_ylim(0, 105)
    ax.set_ylabel("progress (% of steps)")


def report_png(store: Store, ref: str, *, now_clock_s: float | None = None) -> bytes:
    return render_png(gather(store, ref, now_clock_s=now_clock_s))
