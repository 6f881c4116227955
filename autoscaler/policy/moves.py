"""Where a job's state lives, and what carrying it elsewhere costs (issue 23).

A job's state (its last checkpoint) lives in the region of the gang that wrote it: ``cloud/region``
of the placement holding most of the gang's GPUs (ties: the first by name). A new gang elsewhere
carries it over: egress at the catalog's list price (``cloud_providers.catalog.egress_usd_per_gb``,
which the local cloud replays), and the transfer time. One rule for the policy, the controller and
the simulator's fast path, so that what the policy values is what the controller bills.
"""

from __future__ import annotations

from collections.abc import Iterable

from cloud_providers.catalog import egress_usd_per_gb
from cost_models import moves as mv

from .base import JobView


def location(cloud: str, region: str) -> str:
    return f"{cloud}/{region}"


def gang_location(parts: Iterable[tuple[str, str, int]]) -> str | None:
    """``cloud/region`` of the (cloud, region, GPUs) parts holding most GPUs; None for no GPUs."""
    gpus: dict[str, int] = {}
    for cloud, region, n in parts:
        if n > 0:
            loc = location(cloud, region)
            gpus[loc] = gpus.get(loc, 0) + n
    if not gpus:
        return None
    return min(gpus, key=lambda k: (-gpus[k], k))


def egress_usd_per_gb_between(src: str, dst: str) -> float:
    """The catalog's egress price from one location to another (0 within one)."""
    if src == dst:
        return 0.0
    sc, _, sr = src.partition("/")
    dc, _, dr = dst.partition("/")
    return egress_usd_per_gb(sc, sr, dc, dr)


def bandwidth_gb_per_s(src: str, dst: str) -> float:
    same_cloud = src.partition("/")[0] == dst.partition("/")[0]
    return mv.DEFAULT_TRANSFER_GB_PER_S if same_cloud else mv.CROSS_CLOUD_TRANSFER_GB_PER_S


def state_size_gb(job: JobView) -> float:
    """The size of the job's state: the runtime's measured size once known, else the spec's
    ``checkpoint.size_gb``, else 0."""
    if job.checkpoint_size_gb is not None:
        return max(0.0, job.checkpoint_size_gb)
    return job.spec.checkpoint.size_gb or 0.0


def is_move(state_location: str | None, new_location: str | None) -> bool:
    """A new gang at ``new_location`` moves the job's state when there is a state elsewhere."""
    return state_location is not None and new_location is not None and new_location != state_location


def move_egress_usd(state_location: str | None, new_location: str | None, size_gb: float) -> float:
    """What the cloud bills for carrying the state to a new gang (0 when nothing moves)."""
    if state_location is None or new_location is None or not is_move(state_location, new_location):
        return 0.0
    return mv.egress_usd(max(0.0, size_gb), egress_usd_per_gb_between(state_location, new_location))


def carry_state(state_location: str | None, new_location: str | None, *, has_state: bool,
                size_gb: float) -> tuple[str | None, float, bool]:
    """A new gang starts at ``new_location``: (where the state lives now, the egress it bills, whether
    that was a move). The billing rule the controller and the simulator's fast path share: a job
    with state (progress made) carries it to a gang in another region or cloud, billed at the
    catalog's egress price; a job without state just starts there."""
    if new_location is None:
        return state_location, 0.0, False
    if not has_state or state_location is None:
        return new_location, 0.0, False
    if new_location == state_location:
        return state_location, 0.0, False
    return new_location, move_egress_usd(state_location, new_location, size_gb), True
