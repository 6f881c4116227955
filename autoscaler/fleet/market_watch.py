"""Online market watching: what the controller learns of each spot offering by observing it every tick.

Where a provider reports ``spot_available`` (the local cloud; a trace in the simulator), the hazard
estimate can use far more evidence than the controller's own preemptions: how long each offering has
had room, how often room vanished, and how long the current run of availability has lasted (runs are
heavy-tailed, so a long run predicts a long remainder).

This is the one implementation: ``Watch.advance`` is the accounting rule, ``MarketWatcher`` applies it
tick by tick in the controller, and the simulator's ``simulator/market_watch.py`` applies it at each
change point of a trace ahead of time (so a query is a lookup plus one ``advance``) - the policy sees
the same ``MarketHistory`` either way.

Held in memory: a restarted controller starts watching afresh (its own instance history, which is
what preemption counts come from, is in the database).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from autoscaler.policy import MarketHistory
from cloud_providers.base import Offering

MAX_COUNT = 8


@dataclasses.dataclass(frozen=True)
class Watch:
    """What watching one spot offering showed from ``first_s`` to ``last_s`` (immutable: a snapshot
    can be kept and advanced without copying)."""

    first_s: float
    last_s: float
    # Room (instances) at the last observation; it is taken to hold until the next one.
    last_avail: int
    # Seconds with room for at least k + 1 instances, k = 0..MAX_COUNT - 1.
    ge_s: tuple[float, ...]
    # Times the room went from some to none.
    drops: int = 0
    # Since when the current run of availability has lasted (None: no room now).
    available_since_s: float | None = None

    @classmethod
    def start(cls, now_s: float, avail: int) -> Watch:
        return cls(now_s, now_s, avail, (0.0,) * MAX_COUNT, available_since_s=now_s if avail > 0 else None)

    def advance(self, now_s: float, avail: int) -> Watch:
        """The watch after observing ``avail`` at ``now_s``: the room seen last held until now."""
        dt = max(0.0, now_s - self.last_s)
        last = self.last_avail
        ge = tuple(g + dt if last >= k + 1 else g for k, g in enumerate(self.ge_s))
        drops, since = self.drops, self.available_since_s
        if last > 0 and avail == 0:
            drops, since = drops + 1, None
        elif last == 0 and avail > 0:
            since = now_s
        return Watch(self.first_s, now_s, avail, ge, drops, since)

    def history(self, key: str, base: MarketHistory | None = None) -> MarketHistory:
        """``base`` (the controller's own instance history of the offering) with what watching added."""
        if base is None:
            return MarketHistory(key, watched_s=self.last_s - self.first_s, available_s_at_least=self.ge_s,
                                 drops=self.drops, available_since_s=self.available_since_s)
        return dataclasses.replace(base, watched_s=self.last_s - self.first_s, available_s_at_least=self.ge_s,
                                   drops=self.drops, available_since_s=self.available_since_s)


def watched(o: Offering) -> bool:
    """Only a spot market that reports its room can be watched."""
    return o.spot_price_usd_per_hour is not None and o.spot_available is not None


class MarketWatcher:
    def __init__(self) -> None:
        self._w: dict[str, Watch] = {}

    def observe(self, now_s: float, offerings: Iterable[Offering]) -> None:
        for o in offerings:
            if not watched(o):
                continue
            avail: int = o.spot_available  # type: ignore[assignment]
            w = self._w.get(o.key)
            self._w[o.key] = Watch.start(now_s, avail) if w is None else w.advance(now_s, avail)

    def merge(self, history: Mapping[str, MarketHistory]) -> dict[str, MarketHistory]:
        """The controller's instance history with what watching the market added."""
        out = dict(history)
        for key, w in self._w.items():
            out[key] = w.history(key, out.get(key, MarketHistory(key)))
        return out

    def seed(self, watches: Mapping[str, Watch]) -> None:
        """Start from what watching showed before (the simulator: a controller that has been watching
        the market since the trace began, as a running service has)."""
        self._w.update(watches)

    def snapshot(self) -> dict[str, Watch]:
        """The watch of every offering seen so far (immutable values)."""
        return dict(self._w)
