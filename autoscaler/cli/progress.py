"""Live progress of followed jobs: one line per job, redrawn in place on a terminal (rich), or plain
lines when the output is not a terminal (a log file, a pipe, CI).

A job's line says its phase, step/total, samples/s, ETA, cost so far, the markets of its workers and
its preemptions. The phase is read from the summaries the follower sees: provisioning; starting
workers (the attempt has not made a step yet: processes, imports, rendezvous and the restore, with
the checkpoint step it restores and for how long it has been at it); warming up (stepping, but not
yet long enough to measure a steady rate); training; recovering, resizing, or the end state. The
rate and ETA are the current attempt's steady state (``eta.py``). On a terminal the line fits its
width: the markets, preemptions, rate and ETA go first, the phase, step/total and cost never
(``render.fit_line``). rich is imported by this module only, and this module only by the commands
that follow a job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import IO, Any

from . import render
from .eta import RateEstimator, clock

LIVE_STATES = {"PENDING", "PROVISIONING", "RUNNING", "RESCALING", "RECOVERING"}


@dataclasses.dataclass
class JobLine:
    """What the line of one job needs to remember between summaries."""

    batch_size: int | None = None
    rate: RateEstimator = dataclasses.field(default_factory=RateEstimator)

    def phase(self, j: Mapping[str, Any], now: float) -> tuple[str, str]:
        """The phase (its first word picks the colour) and its short form (without the hint)."""
        state = j["state"]
        if state not in LIVE_STATES:
            return str(state).lower(), str(state).lower()
        if state == "RECOVERING":
            return "recovering", "recovering"
        if state == "RESCALING":
            return "resizing", "resizing"
        if state in ("PENDING", "PROVISIONING") or not j.get("workers"):
            return "provisioning", "provisioning"
        if not self.rate.started:
            # What a restart's 14-24 s are spent on: processes, imports, rendezvous, the restore.
            waited = f"{now - self.rate.attempt_seen_t:.0f} s"
            ckpt = j.get("last_checkpoint_step")
            hint = f"restore from step {ckpt}, {waited}" if ckpt else waited
            return f"starting workers ({hint})", "starting workers"
        if self.rate.moved is not None and self.rate.steps_per_s(now) is None:
            return "warming up", "warming up"  # stepping, not yet long enough for a steady rate
        return "training", "training"  # (or attached to a training job: its rate is measured from now)

    def text(self, j: Mapping[str, Any], now: float, width: int | None = None) -> str:
        """The job's line within ``width`` columns (None: every field)."""
        return self.render(j, now, width).text

    def render(self, j: Mapping[str, Any], now: float, width: int | None = None) -> Rendered:
        """The job's line, after observing ``j`` at ``now``."""
        step = int(j.get("step") or 0)
        self.rate.add(now, step, int(j.get("attempts") or 0))
        phase, short = self.phase(j, now)
        fields = [render.Field(j["job_id"]), render.Field(phase, short=short),
                  render.Field(render.progress_str(j), short=render.progress_str(j, percent=False))]
        sps = self.rate.steps_per_s(now) if short == "training" else None
        if sps:
            batch = self.batch_size or j.get("batch_size")
            fields.append(render.Field(f"{sps * batch:,.0f} samples/s" if batch else f"{sps:.2f} steps/s", drop=3))
            eta = self.rate.eta_s(now, step, j.get("total_steps"))
            if eta is not None:
                fields.append(render.Field(f"ETA {clock(eta)}", drop=4))
        elif j["state"] in LIVE_STATES:
            fields.append(render.Field("ETA -", drop=4))
        fields += [render.Field(render.money(j.get("cost_usd"))), render.Field(_markets(j), drop=1),
                   render.Field(f"{j.get('preemptions', 0)} preempted", drop=2)]
        line = render.fit_line(fields, width)
        fields[1] = render.Field(short)
        return Rendered(short, line, render.fit_line(fields, width))


@dataclasses.dataclass(frozen=True)
class Rendered:
    phase: str  # the phase's short form ("training", "starting workers", "failed", ...)
    text: str  # the line
    key: str  # the line without the phase's hint (whose seconds change at each poll)


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
        line = self.line_of(j["job_id"]).render(j, now)
        last = self._last.get(j["job_id"])
        if last is None or (last[0] != line.key and now - last[1] >= 2.0):
            self._last[j["job_id"]] = (line.key, now)
            self.say(f"[{now - self.t0:6.1f}s] {line.text}")

    def close(self) -> None:
        pass


class LiveView(PlainView):
    """On a terminal: the job lines redrawn in place below the events (rich.live), in colour."""

    def __init__(self, out: IO[str], *, t0: float, quiet: bool = False) -> None:
        super().__init__(out, t0=t0, quiet=quiet)
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=out, highlight=False)
        self._lines: dict[str, Rendered] = {}
        self.live = Live(self._renderable(), console=self.console, refresh_per_second=4, transient=False,
                         redirect_stdout=False, redirect_stderr=False)
        self.live.start()

    def _renderable(self) -> Any:
        from rich.text import Text

        colours = {"training": "green", "succeeded": "bold green", "failed": "bold red", "cancelled": "yellow"}
        out = Text(no_wrap=True, overflow="ellipsis")  # one line per job, whatever the terminal's width
        for i, line in enumerate(self._lines.values()):
            style = colours.get(line.phase, "red" if line.phase.startswith("failed") else "cyan")
            out.append(("\n" if i else "") + line.text, style=style)
        return out

    def event(self, job_id: str, ts: float, what: str, reason: str) -> None:
        from rich.markup import escape

        if not self.quiet:
            self.console.print(f"[dim]\\[{ts - self.t0:6.1f}s][/dim] [bold]{escape(what)}[/bold]: {escape(reason)}",
                               markup=True, soft_wrap=True)

    def job(self, j: Mapping[str, Any]) -> None:
        # Within the terminal's width: what does not fit is left out, not cut at the edge.
        self._lines[j["job_id"]] = self.line_of(j["job_id"]).render(j, time.time(), self.console.width)
        if not self.quiet:
            self.live.update(self._renderable(), refresh=True)

    def close(self) -> None:
        self.live.stop()


def make_view(out: IO[str], *, t0: float, quiet: bool = False) -> PlainView:
    """The live view on a terminal, plain lines otherwise (``--quiet``: nothing, either way)."""
    if not quiet and out.isatty():
        return LiveView(out, t0=t0, quiet=quiet)
    return PlainView(out, t0=t0, quiet=quiet)
