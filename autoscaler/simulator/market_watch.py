"""What a controller watching the market would have learnt by time ``t``: ``MarketHistory`` per offering.

The simulator gives the policy only the past (online estimation). It does not re-implement the
controller's market watch: it runs it (``autoscaler.fleet.market_watch.Watch``) once per trace, observing
each offering at each of its own change points from the trace's start, and keeps the immutable watch
after each. A query at ``t`` takes the last snapshot at or before ``t`` and advances it to ``t`` with
the room of the moment - what the controller's ``MarketWatcher`` would report had it observed at
every change point and at ``t``. O(log n) per offering and query.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np

from autoscaler.fleet.market_watch import Watch, watched
from cloud_providers.local.market import MarketTrace

from ..policy.base import MarketHistory


class _KeyWatch:
    def __init__(self, trace: MarketTrace, key: str, times: list[float]) -> None:
        # Only this key's own change points matter; offering_at gives its state at each.
        own = [t for t in times if t == 0 or trace.offering_at(key, t) != trace.offering_at(key, np.nextafter(t, -1))]
        self.times: list[float] = []
        self.watches: list[Watch] = []
        w: Watch | None = None
        for t in own if own and own[0] == 0 else [0.0, *own]:
            o = trace.offering_at(key, t)
            if not watched(o):
                continue
            avail: int = o.spot_available  # type: ignore[assignment]
            w = Watch.start(t, avail) if w is None else w.advance(t, avail)
            self.times.append(t)
            self.watches.append(w)

    def watch_at(self, t: float) -> Watch | None:
        i = bisect.bisect_right(self.times, t) - 1
        if not self.watches:
            return None
        w = self.watches[max(0, i)]
        return w.advance(t, w.last_avail)

    def at(self, key: str, t: float) -> MarketHistory | None:
        w = self.watch_at(t)
        return None if w is None else w.history(key)


class MarketWatch:
    """Online market history for a set of offerings of one trace (offerings without a spot market
    that reports its room are not watched, as in the controller)."""

    def __init__(self, trace: MarketTrace, keys: Iterable[str]) -> None:
        times = sorted(set(trace.change_times()))
        self._keys = {k: _KeyWatch(trace, k, times) for k in keys}

    def watches_at(self, t: float) -> dict[str, Watch]:
        """The controller's watch of each offering at ``t`` (to seed a ``MarketWatcher``)."""
        out = {}
        for k, kw in self._keys.items():
            w = kw.watch_at(t)
            if w is not None:
                out[k] = w
        return out

    def history_at(self, t: float) -> dict[str, MarketHistory]:
        out = {}
        for k, w in self._keys.items():
            h = w.at(k, t)
            if h is not None:
                out[k] = h
        return out
