"""Which catalog GPU types each zone offers: ``machineTypes.list`` + ``acceleratorTypes.list`` per zone.

Only the types in the bundled catalog (``catalog.py``) are considered, so one job spec means the same
on the local cloud, in the simulator and on GCP. A zone offers a catalog entry when it lists the
machine type and, for N1 with attached GPUs, also the accelerator type (and allows that many cards
per instance); A2, G2 and A3 machine types bring their GPUs, so listing the machine type is enough.
Two list calls per zone, cached by the provider for ``catalog_ttl_s``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from ..retry import RetryPolicy, Where
from .catalog import ACCELERATOR_TYPES, TYPES, GcpType, region_of
from .errors import call


@dataclasses.dataclass(frozen=True)
class ZoneType:
    """One catalog entry offered in one zone (prices are attached later)."""

    region: str
    zone: str
    catalog: GcpType


def selected(t: GcpType, only: Collection[str]) -> bool:
    return t.machine_type in only or f"{t.machine_type}/{t.accelerator}:{t.gpus}" in only


def _names(pager: Any) -> dict[str, Any]:
    return {str(item.name): item for item in pager}


def discover(
    *,
    machine_types: Any,
    accelerator_types: Any,
    project: str,
    zone: str,
    retry: RetryPolicy,
    only: Collection[str] | None = None,
) -> Sequence[ZoneType]:
    """Catalog entries offered in ``zone``, sorted. ``only`` restricts them to the named machine types
    (``n1-standard-8``) or entries (``n1-standard-32/V100:4``)."""
    where = Where(region=region_of(zone), zone=zone)
    machines = _names(call(machine_types.list, operation="machineTypes.list", where=where, retry=retry,
                           project=project, zone=zone))
    wanted = [t for t in TYPES if t.machine_type in machines and (only is None or selected(t, only))]
    cards: dict[str, int] = {}
    if any(t.attached for t in wanted):
        accelerators = _names(call(accelerator_types.list, operation="acceleratorTypes.list", where=where,
                                   retry=retry, project=project, zone=zone))
        for name, item in accelerators.items():
            if name in ACCELERATOR_TYPES:
                cards[ACCELERATOR_TYPES[name]] = int(getattr(item, "maximum_cards_per_instance", 0) or 8)
    out = [
        ZoneType(region=where.region or "", zone=zone, catalog=t)
        for t in wanted
        if not t.attached or cards.get(t.accelerator, 0) >= t.gpus
    ]
    return sorted(out, key=lambda z: (z.catalog.machine_type, z.catalog.accelerator, z.catalog.gpus))
