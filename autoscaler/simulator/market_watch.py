"""What a controller watching the market would have learnt by time ``t``: ``MarketHistory`` per offering.

The simulator gives the policy only the past (online estimation): for each spot offering, the seconds
watched since the trace began, the seconds with room for at least k instances, how often room
vanished, and since when it has had room. Prefix sums over the trace's change points make each query
O(log n).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np

from cloud_providers.local.market import MarketTrace

from ..policy.base import MarketHistory

MAX_COUNT = 8


class _KeyWatch:
    def __init__(self, trace: MarketTrace, key: str) -> None:
        times = sorted({t for t in trace.change_times()})
        # Only this key's own change points matter; offering_at gives its state at each.
        own = [t for t in times if t == 0 or trace.offering_at(key, t) != trace.offering_at(key, np.nextafter(t, -1))]
        self.times = own if own and own[0] == 0 else [0.0, *own]
        avail = [trace.offering_at(key, t).spot_available or 0 for t in self.times]
        self.avail = np.array(avail, dtype=np.int64)
        seg = np.diff(np.array(self.times + [self.times[-1]], dtype=np.float64))
        self.cum_ge = np.zeros((MAX_COUNT, len(self.times) + 1))
        for k in range(1, MAX_COUNT + 1):
            self.cum_ge[k - 1, 1:] = np.cumsum(seg * (self.avail >= k))
        drops = np.zeros(len(self.times), dtype=np.int64)
        drops[1:] = (self.avail[1:] == 0) & (self.avail[:-1] > 0)
        self.cum_drops = np.cumsum(drops)
        run_start = []
        start: float | None = None
        for t, a in zip(self.times, avail):
            if a > 0 and start is None:
                start = t
            elif a == 0:
                start = None
            run_start.append(start)
        self.run_start = run_start

    def at(self, key: str, t: float) -> MarketHistory:
        i = max(0, bisect.bisect_right(self.times, t) - 1)
        into = t - self.times[i]
        ge = tuple(float(self.cum_ge[k, i] + into * (self.avail[i] >= k + 1)) for k in range(MAX_COUNT))
        return MarketHistory(
            offering_key=key,
            watched_s=max(0.0, t),
            available_s_at_least=ge,
            drops=int(self.cum_drops[i]),
            available_since_s=self.run_start[i],
        )


class MarketWatch:
    """Online market history for a set of offerings of one trace."""

    def __init__(self, trace: MarketTrace, keys: Iterable[str]) -> None:
        self._keys = {k: _KeyWatch(trace, k) for k in keys}

    def history_at(self, t: float) -> dict[str, MarketHistory]:
        return {k: w.at(k, t) for k, w in self._keys.items()}
