"""A followed job's rate and ETA, from the summaries the follower polls (issue 24, item 3).

A (re)started attempt spends its first seconds on what is not training at its steady rate: starting
the processes, importing torch, the rendezvous, restoring the checkpoint, the first slow steps. The
old estimate (steps over the last 20 s of polls) measured across that pause: right after a restart a
4-minute job read ``ETA 4:06:41``. Here the rate belongs to the current attempt only and is measured
from its steady state: the attempt's first step (its start-up and restore) and the ``warmup_steps``
steps or ``warmup_s`` seconds after it are left out, then the rate is taken over a sliding window of
at least ``min_span_s``. Until then the job is warming up and has no ETA.

What is measured is the moment a polled step value is first seen: the runtime writes its step every
0.5 s and the follower polls every 0.5 s, so a value's first sighting is the best estimate of when it
was reached, and seeing it again adds nothing. Pure (a clock is passed in), so a recorded sequence of
summaries can be replayed in a test.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class RateEstimator:
    """Steps per second of the current attempt's steady state; ``add`` one observation per poll."""

    warmup_steps: int = 5
    warmup_s: float = 5.0
    window_s: float = 30.0
    min_span_s: float = 2.0
    attempt: int | None = None  # the attempt observed (None: nothing yet)
    attempt_seen_t: float = 0.0  # when it was first observed
    last_step: int = 0
    moved: tuple[float, int] | None = None  # the attempt's first new step: (when seen, step)
    steady: bool = False  # warm-up is over: ``points`` are collected
    points: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    def add(self, t: float, step: int, attempt: int) -> None:
        """Observe ``step`` of gang ``attempt`` at wall time ``t``."""
        if self.attempt is None:
            self._reset(t, step, attempt)
            # Attached to a job that is already training: no start-up of its to leave out.
            self.steady = step > 0
            return
        if attempt != self.attempt or step < self.last_step:
            self._reset(t, step, attempt)  # a new gang, or a restore to an older checkpoint
            return
        if step == self.last_step:
            return
        self.last_step = step
        if not self.steady:
            if self.moved is None:
                self.moved = (t, step)  # its time holds the start-up and the restore
                return
            t0, s0 = self.moved
            if step - s0 < self.warmup_steps and t - t0 < self.warmup_s:
                return
            self.steady = True
        self.points.append((t, step))
        # Slide: drop the oldest point while the rest still span the window.
        while len(self.points) > 2 and t - self.points[1][0] >= self.window_s:
            self.points.pop(0)

    def _reset(self, t: float, step: int, attempt: int) -> None:
        self.attempt, self.attempt_seen_t, self.last_step = attempt, t, step
        self.moved, self.steady, self.points = None, False, []

    @property
    def started(self) -> bool:
        """Whether the attempt has made a step since it was first seen (or was training then)."""
        return self.steady or self.moved is not None

    def steps_per_s(self, now: float) -> float | None:
        """The steady rate; None while warming up (or before ``min_span_s`` of it). A job that has
        stood still for longer than the window it was measured over slows down as it stands."""
        if not self.steady or len(self.points) < 2:
            return None
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        span = t1 - t0
        if span < self.min_span_s or s1 <= s0:
            return None
        if now - t1 > span:
            span = now - t0
        return (s1 - s0) / span

    def eta_s(self, now: float, step: int, total_steps: int | None) -> float | None:
        """Seconds to ``total_steps`` at the steady rate; None without one (or without a total)."""
        rate = self.steps_per_s(now)
        if rate is None or not total_steps or total_steps <= step:
            return None
        return (total_steps - step) / rate


def clock(seconds: float) -> str:
    """``M:SS``, or ``H:MM:SS`` from an hour."""
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
