"""Online market watching: what the controller learns of each spot offering by observing it every tick.

Where a provider reports ``spot_available`` (the local cloud; a trace in the simulator), the hazard
estimate can use far more evidence than the controller's own preemptions: how long each offering has
had room, how often room vanished, and how long the current run of availability has lasted (runs are
heavy-tailed, so a long run predicts a long remainder). The simulator computes the same figures from
the trace (``simulator/market_watch.py``); this is the controller's online counterpart.

Held in memory: a restarted controller starts watching afresh (its own instance history, which is
what preemption counts come from, is in the database).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from cloud_providers.base import Offering

from .policy import MarketHistory

MAX_COUNT = 8


@dataclasses.dataclass
class _Watch:
    first_s: float
    last_s: float
    last_avail: int
    ge_s: list[float]
    drops: int = 0
    available_since_s: float | None = None


class MarketWatcher:
    def __init__(self) -> None:
        self._w: dict[str, _Watch] = {}

    def observe(self, now_s: float, offerings: Iterable[Offering]) -> None:
        for o in offerings:
            if o.spot_price_usd_per_hour is None or o.spot_available is None:
                continue
            avail = o.spot_available
            w = self._w.get(o.key)
            if w is None:
                self._w[o.key] = _Watch(now_s, now_s, avail, [0.0] * MAX_COUNT,
                                        available_since_s=now_s if avail > 0 else None)
                continue
            dt = max(0.0, now_s - w.last_s)
            for k in range(MAX_COUNT):
                if w.last_avail >= k + 1:
                    w.ge_s[k] += dt
            if w.last_avail > 0 and avail == 0:
                w.drops += 1
                w.available_since_s = None
            elif w.last_avail == 0 and avail > 0:
                w.available_since_s = now_s
            w.last_s, w.last_avail = now_s, avail

    def merge(self, history: Mapping[str, MarketHistory]) -> dict[str, MarketHistory]:
        """The controller's instance history with what watching the market added."""
        out = dict(history)
        for key, w in self._w.items():
            base = out.get(key, MarketHistory(key))
            out[key] = dataclasses.replace(
                base,
                watched_s=w.last_s - w.first_s,
                available_s_at_least=tuple(w.ge_s),
                drops=w.drops,
                available_since_s=w.available_since_s,
            )
        return out
