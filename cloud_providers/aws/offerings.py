"""Which catalog GPU types each zone offers: ``describe_instance_type_offerings`` + ``describe_instance_types``.

Only the GPU types in ``cloud_providers/catalog.py`` are considered, so one job spec means the same on
the local cloud, in the simulator and on AWS. We ask for the zone offerings first and describe only
the types some zone has: ``DescribeInstanceTypes`` rejects the whole call if one name is unknown in
the region (moto, for example, has no p3 types), whereas the offerings filter simply omits them.
The accelerator and GPU count come from ``GpuInfo`` when AWS gives one; the catalog fills the gap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..catalog import INSTANCE_TYPES, InstanceType
from ..retry import RetryPolicy, Where
from .errors import call


@dataclasses.dataclass(frozen=True)
class ZoneType:
    """One catalog instance type offered in one zone (prices are attached later)."""

    region: str
    zone: str
    catalog: InstanceType
    accelerator: str
    gpus: int


def catalog_types() -> dict[str, InstanceType]:
    return {t.instance_type: t for t in INSTANCE_TYPES if t.cloud == "aws"}


def _paginate(fn: Callable[..., Any], key: str, *, operation: str, where: Where, retry: RetryPolicy,
              **kwargs: Any) -> list[Any]:
    items: list[Any] = []
    token: str | None = None
    while True:
        page = call(fn, operation=operation, where=where, retry=retry,
                    **(kwargs | ({"NextToken": token} if token else {})))
        items.extend(page.get(key, []))
        token = page.get("NextToken") or None
        if not token:
            return items


def gpu_of(info: dict[str, Any], fallback: InstanceType) -> tuple[str, int]:
    """(accelerator, count) from ``GpuInfo``, or the catalog's when AWS does not say."""
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if len(gpus) == 1 and gpus[0].get("Name") and gpus[0].get("Count"):
        return str(gpus[0]["Name"]), int(gpus[0]["Count"])
    return fallback.accelerator, fallback.gpus


def discover(client: Any, *, region: str, zones: Collection[str] | None, retry: RetryPolicy) -> Sequence[ZoneType]:
    """Catalog GPU types offered in ``region`` (restricted to ``zones`` when given), sorted."""
    catalog = catalog_types()
    where = Where(region=region)
    offered = _paginate(
        client.describe_instance_type_offerings,
        "InstanceTypeOfferings",
        operation="DescribeInstanceTypeOfferings",
        where=where,
        retry=retry,
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": sorted(catalog)}],
    )
    pairs = sorted(
        {
            (str(o["Location"]), str(o["InstanceType"]))
            for o in offered
            if o.get("InstanceType") in catalog and (zones is None or o.get("Location") in zones)
        }
    )
    if not pairs:
        return []
    names = sorted({t for _, t in pairs})
    infos = _paginate(
        client.describe_instance_types,
        "InstanceTypes",
        operation="DescribeInstanceTypes",
        where=where,
        retry=retry,
        InstanceTypes=names,
    )
    gpu = {str(i["InstanceType"]): gpu_of(i, catalog[str(i["InstanceType"])]) for i in infos}
    out = []
    for zone, name in pairs:
        accelerator, count = gpu.get(name, (catalog[name].accelerator, catalog[name].gpus))
        out.append(ZoneType(region=region, zone=zone, catalog=catalog[name], accelerator=accelerator, gpus=count))
    return out
