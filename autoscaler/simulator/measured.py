"""What earlier runs of a job measured, for ``spotrain estimate`` (issue 24, item 6).

``simulate.work_gpu_hours`` is the user's guess, and the restart overhead a default: the Quickstart's
estimate said $0.45 ($0.41-0.48) while six runs cost $0.52-1.12. Every run on the local cloud leaves
what it really took: the runtime's timeline (``runtime/timeline.py``, rank 0's ``process_start``,
``first_step``, ``notice_seen``, ``boundary``, ``exiting`` with wall-clock times), the job row (its
cost, its steps, and the wall and market times it was submitted and ended at, which give the local
cloud's clock rate) and its instance rows (when each was launched, in market time). From them, per
finished run, in market seconds:

- ``s_per_step``: training time per step over the whole run (from each attempt's first step to its
  last: its boundary on a notice, its exit at the end, which includes writing the final model), and the
  fastest and slowest attempt's, because the machine's speed varies from attempt to attempt;
- ``startup_s``: from the first instance's launch to the first step (process start, imports,
  rendezvous, data);
- ``restart_s``: the longest time from a notice to the next attempt's first step (checkpoint, exit,
  a new process, restore);
- ``release_s``: how long the instances stayed billed after the last attempt's exit (the processes
  ending, the controller seeing it and releasing them): the simulator releases at once.

Runs on clouds whose workers leave no timeline here (remote agents) are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_RUNS = 5  # the newest finished runs an estimate is calibrated with


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    job_id: str
    cost_usd: float
    total_steps: int
    world_size: int
    offering_key: str
    clock_rate: float  # market seconds per wall second of the local cloud it ran on
    s_per_step: float  # market seconds per step over the run
    fastest_s_per_step: float
    slowest_s_per_step: float
    startup_s: float
    restart_s: float | None  # None: the run was never restarted
    release_s: float = 0.0  # billed after the last attempt's exit: the workers ending, the instances released

    @property
    def overhead_s(self) -> float:
        """The simulator's one restart overhead ``d`` (paid at the first start and every restart)."""
        return max(self.startup_s, self.restart_s or 0.0)


def read_timeline(path: Path) -> list[dict[str, Any]]:
    """The timeline's lines that parse as JSON objects (a torn last line is skipped)."""
    out = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("t_unix_s"), (int, float)) and isinstance(row.get("event"), str):
            out.append(row)
    return out


def measure(job: Any, instances: Sequence[Any], timeline: list[dict[str, Any]]) -> MeasuredRun | None:
    """One finished run's figures (module doc), or None when they cannot be read from what it left."""
    if not (job.finished_at and job.finished_clock_s is not None and job.total_steps and instances):
        return None
    wall_s = job.finished_at - job.submitted_at
    if wall_s <= 0 or job.finished_clock_s <= job.submitted_clock_s:
        return None
    rate = (job.finished_clock_s - job.submitted_clock_s) / wall_s

    def market(t_unix: float) -> float:
        return float(job.submitted_clock_s + (t_unix - job.submitted_at) * rate)

    by_attempt: dict[int, dict[str, dict[str, Any]]] = {}
    for row in timeline:
        attempt = row.get("attempt")
        if isinstance(attempt, int):
            by_attempt.setdefault(attempt, {}).setdefault(row["event"], row)  # the first of each kind
    attempts = sorted(a for a, ev in by_attempt.items() if "first_step" in ev)
    if not attempts:
        return None
    spans: list[tuple[float, int]] = []  # (market seconds, steps) of each attempt's training
    restarts: list[float] = []
    for i, a in enumerate(attempts):
        ev = by_attempt[a]
        first = ev["first_step"]
        step0 = int(first.get("step", 1)) - 1
        t0 = market(first["t_unix_s"]) - rate * float(first.get("step_time_s") or 0.0)
        end = ev.get("boundary") or ev.get("exiting")
        if end is None:
            continue
        step1 = int(end.get("step", job.total_steps)) if "step" in end else int(job.total_steps)
        if step1 > step0:
            spans.append((market(end["t_unix_s"]) - t0, step1 - step0))
        notice = ev.get("notice_seen") or ev.get("boundary")
        if notice is not None and i + 1 < len(attempts):
            restarts.append(market(by_attempt[attempts[i + 1]]["first_step"]["t_unix_s"]) - market(notice["t_unix_s"]))
    if not spans:
        return None
    per_attempt = [s / n for s, n in spans]
    first_launch = min(float(r.launched_at_s) for r in instances)
    startup = market(by_attempt[attempts[0]]["first_step"]["t_unix_s"]) - first_launch
    world = by_attempt[attempts[0]].get("trainer_init", {}).get("world_size") or len(instances)
    release = 0.0
    last_exit = by_attempt[attempts[-1]].get("exiting")
    ends = [float(r.terminated_at_s) for r in instances if r.terminated_at_s is not None]
    if last_exit is not None and ends:
        release = max(0.0, max(ends) - market(last_exit["t_unix_s"]))
    return MeasuredRun(
        job_id=job.job_id, cost_usd=float(job.cost_usd), total_steps=int(job.total_steps), world_size=int(world),
        offering_key=str(min(instances, key=lambda r: r.launched_at_s).offering_key), clock_rate=rate,
        s_per_step=sum(s for s, _ in spans) / sum(n for _, n in spans),
        fastest_s_per_step=min(per_attempt), slowest_s_per_step=max(per_attempt),
        startup_s=max(0.0, startup), restart_s=max(restarts) if restarts else None, release_s=release)


def measured_runs(store: Any, name: str, *, limit: int = MAX_RUNS) -> list[MeasuredRun]:
    """The newest ``limit`` finished (SUCCEEDED) runs of jobs named ``name`` in this home that left
    a timeline, newest first."""
    from sqlalchemy import select

    from autoscaler.home import fleet_dir
    from autoscaler.state.models import Job

    out: list[MeasuredRun] = []
    with store.session() as s:
        newest = select(Job).where(Job.name == name, Job.state == "SUCCEEDED").order_by(Job.submitted_at.desc())
        for job in s.scalars(newest.limit(4 * limit)):
            path = fleet_dir() / "localcloud" / job.controller_id / "executor" / "jobs" / job.job_id / "timeline.jsonl"
            run = measure(job, store.instances(s, job.job_id), read_timeline(path))
            if run is not None and all(math.isfinite(x) for x in (run.s_per_step, run.startup_s)):
                out.append(run)
            if len(out) >= limit:
                break
    return out
