"""Spot room believed available, from what a real cloud lets its user observe (issue 23, item 2).

AWS and GCP do not say how much spot capacity an offering has. What a controller does see: a launch
that succeeded (there was room), a capacity error (``InsufficientInstanceCapacity``,
``ZONE_RESOURCE_POOL_EXHAUSTED``: there was none), a preemption or its notice (room went). Each is a
point observation; between them the market moves on. So the belief that an offering has room now is
the last observation, fading back to a prior as it ages:

    p(room at t) = prior + (seen - prior) * exp(-(t - t_seen) / memory_s)

with ``seen`` 1 after a success and 0 after a refusal or a preemption. ``memory_s`` is how long the
market remembers: the mean length of a spell without room, a Gamma-style posterior mean of the
spells observed (from a refusal or preemption to half-way between the last refusal and the next
success: when the spell ended is known only to that interval) with a prior spell weighted as one.
An offering is believed full while ``p < try_threshold`` and otherwise worth trying: a launch
attempt is the probe (a refused one costs nothing on AWS or GCP), and its outcome is the next
observation. Because a refusal is free, the threshold is low (one chance in ten): the attempt is
worth making long before room is more likely than not, and waiting for even odds (the threshold was
0.5 before issue 23's fourth stop: 1.25 memories, 38 minutes after a refusal with nothing else learnt)
left a job on a dear zone, or idle, for most of a cheap zone's next run of room.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

# With nothing observed an offering is worth trying (the only way to learn is to launch).
PRIOR_ROOM_PROBABILITY = 0.7
# Prior mean spell without room, seconds (GPU spot outages run tens of minutes to hours), and its
# weight in spells.
PRIOR_FULL_SPELL_S = 1800.0
PRIOR_SPELL_WEIGHT = 1.0
# Believed full below this probability of room: a refused launch costs nothing, so one chance in ten
# is worth an attempt (0.15 memories after a refusal: 4.6 minutes with the prior spell).
TRY_THRESHOLD = 0.1
# Spells kept per offering (the newest).
MAX_SPELLS = 32


@dataclasses.dataclass(frozen=True)
class RoomEvidence:
    """The observations of one spot offering. ``last_seen_room``: True after a launch succeeded or
    while instances run there, False after a capacity error or a preemption, None: never observed."""

    last_seen_room: bool | None = None
    last_seen_s: float = 0.0
    # Lengths (seconds) of spells without room that ended in an observed success.
    full_spells_s: tuple[float, ...] = ()
    # When the current spell without room was first observed (None: room seen last, or nothing).
    full_since_s: float | None = None

    def __post_init__(self) -> None:
        if any(x < 0 or not math.isfinite(x) for x in self.full_spells_s):
            raise ValueError("full spells must be finite and >= 0 seconds")


def memory_s(full_spells_s: Sequence[float], *, prior_s: float = PRIOR_FULL_SPELL_S,
             prior_weight: float = PRIOR_SPELL_WEIGHT) -> float:
    """Posterior mean spell without room, seconds (the prior counts as ``prior_weight`` spells)."""
    if prior_s <= 0 or prior_weight <= 0:
        raise ValueError("prior_s and prior_weight must be positive")
    return (prior_s * prior_weight + sum(full_spells_s)) / (prior_weight + len(full_spells_s))


def room_probability(ev: RoomEvidence, now_s: float, *, prior: float = PRIOR_ROOM_PROBABILITY,
                     prior_spell_s: float = PRIOR_FULL_SPELL_S) -> float:
    """Probability that the offering has room for one more instance at ``now_s``."""
    if not 0.0 <= prior <= 1.0:
        raise ValueError("prior must be in [0, 1]")
    if ev.last_seen_room is None:
        return prior
    seen = 1.0 if ev.last_seen_room else 0.0
    age_s = max(0.0, now_s - ev.last_seen_s)
    decay = math.exp(-age_s / memory_s(ev.full_spells_s, prior_s=prior_spell_s))
    return prior + (seen - prior) * decay


def believed_full(ev: RoomEvidence, now_s: float, *, prior: float = PRIOR_ROOM_PROBABILITY,
                  threshold: float = TRY_THRESHOLD) -> bool:
    """Whether the offering is believed to have no room now (not worth a launch attempt)."""
    return room_probability(ev, now_s, prior=prior) < threshold


def believed_full_until_s(ev: RoomEvidence, *, prior: float = PRIOR_ROOM_PROBABILITY,
                          threshold: float = TRY_THRESHOLD) -> float | None:
    """When an offering believed full becomes worth trying again (None: it is not believed full
    after its last observation, or never will be: a prior below the threshold)."""
    if ev.last_seen_room is not False or prior < threshold:
        return None
    if prior == threshold:
        return math.inf
    # prior * (1 - exp(-age / m)) = threshold  <=>  age = m * ln(prior / (prior - threshold))
    return ev.last_seen_s + memory_s(ev.full_spells_s) * math.log(prior / (prior - threshold))


def observe(ev: RoomEvidence, now_s: float, room: bool) -> RoomEvidence:
    """The evidence after observing room (a launch succeeded, instances run) or none (a capacity
    error, a preemption) at ``now_s``. A success after a spell without room records the spell.

    The spell ended somewhere between the last refusal and this success (interval-censored): it is
    recorded as ending half-way. Counting it up to the success would feed back - an offering is
    retried only once believed worth it again (``believed_full_until_s``: 0.15 memories after a
    refusal with the defaults), so every spell would measure at least that long, the memory would
    grow with each one and the offering be retried ever later, while the market had room long since."""
    if room:
        spells = ev.full_spells_s
        if ev.full_since_s is not None:
            ended_s = (ev.last_seen_s + now_s) / 2.0 if ev.last_seen_room is False else now_s
            spells = (*spells, max(0.0, ended_s - ev.full_since_s))[-MAX_SPELLS:]
        return RoomEvidence(True, max(ev.last_seen_s, now_s) if ev.last_seen_room else now_s, spells, None)
    since = ev.full_since_s if ev.full_since_s is not None else now_s
    return RoomEvidence(False, now_s, ev.full_spells_s, since)
