"""Live progress of followed jobs: one line per job, redrawn in place on a terminal (rich), or plain
lines when the output is not a terminal (a log file, a pipe, CI).

A job's line says its phase (provisioning, starting workers, restoring from step N, training,
recovering, resizing, or its end state), step/total, samples/s, ETA, cost so far, the markets of its
workers and its preemptions. The phase is read from the summaries the follower sees: a new gang
attempt reports the step it restored (or 0) and is "restoring"/"starting" until its step moves.
rich is imported by this module only, and this module only by the commands that follow a job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import IO, Any

from . import render

LIVE_STATES = {"PENDING", "PROVISIONING", "RUNNING", "RESCALING", "RECOVERING"}


@dataclasses.dataclass
class Rate:
    """Steps per wall second, smoothed over the last ``window_s`` of observations."""

    window_s: float = 20.0
    points: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    def add(self, t: float, step: int) -> None:
        if self.points and step < self.points[-1][1]:
            self.points.clear()  # a restart from an older checkpoint
        self.points.append((t, step))
        while len(self.points) > 2 and t - self.points[0][0] > self.window_s:
            self.points.pop(0)

    def steps_per_s(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


@dataclasses.dataclass
class JobLine:
    """What the line of one job needs to remember between summaries."""

    batch_size: int | None = None
    # The gang attempt last seen (None: nothing seen yet), and the step it was first seen at: the
    # step it restored. A gang already running when first seen (attach) counts as training.
    attempt: int | None = None
    attempt_base_step: int = 0
    rate: Rate = dataclasses.field(default_factory=Rate)

    def phase(self, j: Mapping[str, Any]) -> str:
        state, step = j["state"], int(j.get("step") or 0)
        attempt = int(j.get("attempts") or 0)
        if self.attempt is None:
            self.attempt, self.attempt_base_step = attempt, step if attempt == 0 else -1
        elif attempt != self.attempt:
            self.attempt, self.attempt_base_step = attempt, step
        if state not in LIVE_STATES:
            return str(state).lower()
        if state == "RECOVERING":
            return "recovering"
        if state == "RESCALING":
            return "resizing"
        if state in ("PENDING", "PROVISIONING") or not j.get("workers"):
            return "provisioning"
        if step > max(self.attempt_base_step, 0):
            return "training"
        if self.attempt_base_step < 0:
            return "training" if step > 0 else "starting workers"
        return f"restoring from step {step}" if step > 0 else "starting workers"

    def text(self, j: Mapping[str, Any], now: float) -> str:
        step = int(j.get("step") or 0)
        self.rate.add(now, step)
        phase = self.phase(j)
        parts = [j["job_id"], phase, render.progress_str(j)]
        sps = self.rate.steps_per_s() if phase == "training" else None
        if sps:
            parts.append(f"{sps * self.batch_size:,.0f} samples/s" if self.batch_size else f"{sps:.2f} steps/s")
            total = j.get("total_steps")
            if total and total > step:
                parts.append(f"ETA {_clock((total - step) / sps)}")
        elif phase not in ("training",) and j["state"] in LIVE_STATES:
            parts.append("ETA -")
        parts.append(render.money(j.get("cost_usd")))
        parts.append(_markets(j))
        parts.append(f"{j.get('preemptions', 0)} preempted")
        return "  ".join(parts)


def _clock(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _markets(j: Mapping[str, Any]) -> str:
    counts: dict[str, int] = {}
    for w in j.get("workers", []):
        if w.get("state") != "terminated":
            counts[w["market"]] = counts.get(w["market"], 0) + int(w.get("gpus", 1))
    return ", ".join(f"{n}x {m}" for m, n in sorted(counts.items())) or "no workers"


class PlainView:
    """Line-based: each event as a line, and the job's line when it changed (at most every 2 s)."""

    def __init__(self, out: IO[str], *, t0: float, quiet: bool = False) -> None:
        self.out, self.t0, self.quiet = out, t0, quiet
        self.lines: dict[str, JobLine] = {}
        self._last: dict[str, tuple[str, float]] = {}

    def line_of(self, job_id: str, batch_size: int | None = None) -> JobLine:
        line = self.lines.setdefault(job_id, JobLine())
        if batch_size:
            line.batch_size = batch_size
        return line

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self.out, flush=True)

    def event(self, job_id: str, ts: float, what: str, reason: str) -> None:
        self.say(f"[{ts - self.t0:6.1f}s] {what}: {reason}")

    def job(self, j: Mapping[str, Any]) -> None:
        now = time.time()
        text = self.line_of(j["job_id"]).text(j, now)
        last = self._last.get(j["job_id"])
        if last is None or (last[0] != text and now - last[1] >= 2.0):
            self._last[j["job_id"]] = (text, now)
            self.say(f"[{now - self.t0:6.1f}s] {text}")

    def close(self) -> None:
        pass


class LiveView(PlainView):
    """On a terminal: the job lines redrawn in place below the events (rich.live), in colour."""

    def __init__(self, out: IO[str], *, t0: float, quiet: bool = False) -> None:
        super().__init__(out, t0=t0, quiet=quiet)
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=out, highlight=False)
        self._texts: dict[str, str] = {}
        self._states: dict[str, str] = {}
        self.live = Live(self._renderable(), console=self.console, refresh_per_second=4, transient=False,
                         redirect_stdout=False, redirect_stderr=False)
        self.live.start()

    def _renderable(self) -> Any:
        from rich.text import Text

        colours = {"training": "green", "succeeded": "bold green", "failed": "bold red", "cancelled": "yellow"}
        out = Text(no_wrap=True, overflow="ellipsis")  # one line per job, whatever the terminal's width
        for i, text in enumerate(self._texts.values()):
            phase = text.split("  ")[1] if "  " in text else ""
            style = colours.get(phase, "red" if phase.startswith("failed") else "cyan")
            out.append(("\n" if i else "") + text, style=style)
        return out

    def event(self, job_id: str, ts: float, what: str, reason: str) -> None:
        from rich.markup import escape

        if not self.quiet:
            self.console.print(f"[dim]\\[{ts - self.t0:6.1f}s][/dim] [bold]{escape(what)}[/bold]: {escape(reason)}",
                               markup=True, soft_wrap=True)

    def job(self, j: Mapping[str, Any]) -> None:
        self._texts[j["job_id"]] = self.line_of(j["job_id"]).text(j, time.time())
        if not self.quiet:
            self.live.update(self._renderable(), refresh=True)

    def close(self) -> None:
        self.live.stop()


def make_view(out: IO[str], *, t0: float, quiet: bool = False) -> PlainView:
    """The live view on a terminal, plain lines otherwise (``--quiet``: nothing, either way)."""
    if not quiet and out.isatty():
        return LiveView(out, t0=t0, quiet=quiet)
    return PlainView(out, t0=t0, quiet=quiet)
