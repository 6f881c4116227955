"""Online market watching: what the controller learns of each spot offering by observing it every tick.

Where a provider reports ``spot_available`` (the local cloud; a trace in the simulator), the hazard
estimate can use far more evidence than the controller's own preemptions: how long each offering has
had room, how often room vanished, and how long the current run of availability has lasted (runs are
heavy-tailed, so a long run predicts a long remainder).

This is the one implementation: ``Watch.advance`` is the accounting rule, ``MarketWatcher`` applies it
tick by tick in the controller, and the simulator's ``simulator/market_watch.py`` applies it at each
change point of a trace ahead of time (so a query is a lookup plus one ``advance``) - the policy sees
the same ``MarketHistory`` either way.

Where the provider reports no room (AWS, GCP; the local cloud and the simulator unless their
``oracle`` is on), ``RoomWatcher`` keeps what launches, capacity errors and preemptions showed.

Held in memory: a restarted controller starts watching afresh (its own instance history, which is
what preemption counts come from, is in the database).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from autoscaler.policy import MarketHistory
from cloud_providers.base import Offering
from cost_models.availability import RoomEvidence, believed_full, believed_full_until_s, observe

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


class RoomWatcher:
    """Spot room as a real cloud lets its user learn it (issue 23, item 2): AWS and GCP report no
    ``spot_available``, so the only evidence is what happened to this controller's own launches and
    instances - a launch that succeeded or instances still running (room), a capacity error, a
    preemption or its notice (none). ``cost_models.availability`` turns that into a belief that
    fades back to a prior; an offering believed full is shown to the policy with no more room than is
    held there, any other one as unknown (the policy tries it: the launch attempt is the probe, and a
    refusal is only an observation, never a preemption). Shared by all jobs of a controller (a
    refusal seen by one is news for all); the simulator's fast path keeps one per run."""

    def __init__(self) -> None:
        self._ev: dict[str, RoomEvidence] = {}

    def saw(self, key: str, now_s: float, room: bool) -> None:
        """A launch on ``key`` succeeded (``room``) or was refused for capacity, or an instance there
        was preempted (not ``room``)."""
        self._ev[key] = observe(self._ev.get(key, RoomEvidence()), now_s, room)

    def holding(self, key: str, now_s: float) -> None:
        """Instances run on ``key`` now: there is room for them (unless a preemption was seen at this
        very moment: room went below what is held)."""
        ev = self._ev.get(key)
        if ev is not None and ev.last_seen_room is False and ev.last_seen_s >= now_s:
            return
        self.saw(key, now_s, True)

    def evidence(self) -> dict[str, RoomEvidence]:
        return dict(self._ev)

    def believed(self, offerings: Iterable[Offering], held: Mapping[str, int], now_s: float) -> list[Offering]:
        """``offerings`` as the policy should see them: where the provider reports no room (a real
        cloud), an offering believed full offers the ``held`` instances and no more; any other keeps
        ``spot_available=None`` (unknown: worth a launch attempt). An offering whose provider does
        report room (the local cloud or a simulation with the oracle on) is left as it is."""
        out = []
        for o in offerings:
            ev = self._ev.get(o.key)
            if (o.spot_price_usd_per_hour is not None and o.spot_available is None and ev is not None
                    and believed_full(ev, now_s)):
                o = dataclasses.replace(o, spot_available=held.get(o.key, 0))
            out.append(o)
        return out

    def next_try_s(self, now_s: float) -> float | None:
        """The next moment after ``now_s`` at which an offering believed full becomes worth trying
        (the simulator wakes the controller then, as the service's next tick would see it)."""
        due = [t for ev in self._ev.values() if (t := believed_full_until_s(ev)) is not None and now_s < t < math.inf]
        return min(due) if due else None
