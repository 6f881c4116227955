"""Clocks: where the controller, the local cloud's market and the executors read time.

The controller reads time only from its clock, so the same code runs as a service on the wall clock
and as the simulator on a virtual one (DESIGN.md "One world"): ``spotrain simulate`` advances a
``VirtualClock`` from event to event and calls ``Controller.tick()`` at each, with no sleeping and no
wall time anywhere in what it decides.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds: Unix time on the wall clock, virtual seconds on a virtual one."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a virtual clock jumps instead)."""
        ...


class WallClock:
    """Real time."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Time that moves only when told to: ``advance_to`` jumps to the next event."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def advance_to(self, t_s: float) -> None:
        """Jump to ``t_s``; time never runs backwards (a ``t_s`` in the past is a caller's bug)."""
        if t_s < self._now - 1e-9:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {t_s}")
        self._now = max(self._now, float(t_s))


WALL_CLOCK = WallClock()
