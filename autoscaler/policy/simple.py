"""The first-slice policy: the cheapest offerings that fit, spot first.

For each job: fill ``workers.max`` physical workers from the cheapest per-GPU price, spot when the spec
allows it and the market has room (``spot: auto|always``), then on-demand when ``spot`` is ``auto`` or
``never``. It keeps what a job holds unless that is gone, so it never thrashes. The goodput-per-dollar
policy replaces it (issue: the policy).
"""

from __future__ import annotations

from collections.abc import Mapping

from autoscaler.jobs.domain import Outcome
from cloud_providers.base import ON_DEMAND, SPOT, Offering

from .base import Allocation, JobView, Placement, PolicyInput, eligible_offerings
from .jobmath import CAPACITY_BACKOFF_S


class CheapestPolicy:
    name = "cheapest"

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        by_key = {o.key: o for o in inp.offerings}
        return [self._one(job, inp, by_key) for job in inp.jobs]

    def _one(self, job: JobView, inp: PolicyInput, by_key: Mapping[str, Offering]) -> Allocation:
        spec = job.spec
        want = spec.workers.max
        options = eligible_offerings(spec, inp.offerings)
        if not options:
            return Allocation(job.job_id, (), reason="no offering matches the job's resources", outcome=Outcome.NO_RESOURCE)
        # Keep what the job holds (no thrashing), as long as it still exists.
        placements: dict[tuple[str, str], int] = {}
        have = 0
        spot_room = {o.key: (o.spot_available if o.spot_available is not None else want) for o in options}
        for h in job.held:
            o = by_key.get(h.offering_key)
            if o is None:
                continue
            n = min(h.instances, max(0, (want - have) // o.gpus))
            if n:
                placements[(h.offering_key, h.market)] = placements.get((h.offering_key, h.market), 0) + n
                have += n * o.gpus
                if h.market == SPOT:
                    spot_room[o.key] = max(0, spot_room[o.key] - n)
        candidates: list[tuple[float, str, Offering]] = []
        for o in options:
            if inp.now_s - job.recent_capacity_failures.get(o.key + "|" + SPOT, -1e18) < CAPACITY_BACKOFF_S:
                pass
            elif spec.resources.spot in ("auto", "always") and o.spot_price_usd_per_hour is not None:
                candidates.append((o.spot_price_usd_per_hour / o.gpus, SPOT, o))
            if spec.resources.spot in ("auto", "never"):
                if inp.now_s - job.recent_capacity_failures.get(o.key + "|" + ON_DEMAND, -1e18) >= CAPACITY_BACKOFF_S:
                    candidates.append((o.on_demand_price_usd_per_hour / o.gpus, ON_DEMAND, o))
        candidates.sort(key=lambda c: (c[0], c[1] != SPOT, c[2].key))
        for _, market, o in candidates:
            if have >= want:
                break
            if o.gpus > want - have:
                continue
            n = (want - have) // o.gpus
            if market == SPOT:
                n = min(n, spot_room[o.key])
                spot_room[o.key] -= n
            if n > 0:
                placements[(o.key, market)] = placements.get((o.key, market), 0) + n
                have += n * o.gpus
        if have < spec.workers.min:
            return Allocation(job.job_id, (), reason=f"only {have} of at least {spec.workers.min} workers available; waiting")
        return Allocation(
            job.job_id,
            tuple(Placement(k, m, n) for (k, m), n in sorted(placements.items())),
            reason=f"cheapest {have} workers",
        )
