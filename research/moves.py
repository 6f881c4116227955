"""Region moves of a policy in the simulator, and the checkpoint egress they would bill.

The simulator's own bill does not include egress yet (issue 23 adds it to the engine's billing);
until it does, ``MoveRecorder`` wraps any policy and counts, from the allocations it makes, every
change of the region its gang runs in, pricing each with ``MoveCosts`` the way omniscient's planner
does (the checkpoint lives where the last gang ran; the first launch moves nothing). What a decision
holds is what the simulator's cloud grants: spot beyond an offering's room is refused.
"""

from __future__ import annotations

from autoscaler.policy.base import Allocation, Policy, PolicyInput
from autoscaler.simulator.omniscient import MoveCosts, region_of
from cloud_providers.base import SPOT


class MoveRecorder:
    """A policy that decides as ``inner`` does and records its region moves and their egress."""

    def __init__(self, inner: Policy, costs: MoveCosts | None = None) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.costs = costs or MoveCosts()
        self.moves = 0
        self.egress_usd = 0.0
        self._regions: frozenset[str] = frozenset()  # where the checkpoint is (empty: not written yet)

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        out = self.inner.decide(inp)
        offers = {o.key: o for o in inp.offerings}
        for alloc in out[:1]:  # the simulator runs one job
            held: set[str] = set()
            for p in alloc.placements:
                o = offers.get(p.offering_key)
                if o is None or p.instances <= 0 or (p.market == SPOT and (o.spot_available or 0) <= 0):
                    continue
                held.add(region_of(o))
            if not held or held == self._regions:
                continue
            if self._regions:
                src = min(self._regions)
                new = held - self._regions
                if new:
                    self.moves += 1
                    self.egress_usd += sum(self.costs.usd(src, r) for r in new)
            self._regions = frozenset(held)
        return out
