"""The bundled GCP catalog: GPU machine types, their accelerators, and on-demand and Spot list prices.

GCP sells a GPU VM as a machine type plus accelerators: N1 machines take attached T4 or V100 cards
(``guestAccelerators`` on insert), while A2 (A100), G2 (L4) and A3 (H100) machine types come with
their GPUs built in. A catalog entry is one (machine type, accelerator, count) that can be launched,
and its offering key is ``gcp/<zone>/<machine type>/<ACCEL>:<N>`` (``base.offering_key``).

Prices are USD per hour for the whole VM (machine + GPUs), approximate public **list prices of
us-central1 as published in 2024-2025** on https://cloud.google.com/compute/vm-instance-pricing,
https://cloud.google.com/compute/gpus-pricing and https://cloud.google.com/spot-vms/pricing (N1:
$0.0316/vCPU-h + $0.0042/GB-h on demand; T4 $0.35, V100 $2.48 per GPU-h; the rows that are also in
``cloud_providers/catalog.py`` carry exactly its prices). Spot prices there change at most once every
30 days and differ by region; they are approximate here, so a deployment that cares overrides them
(``spot_price_overrides`` / ``SPOTRAIN_GCP_SPOT_PRICES``). GCP bills per second with a one-minute
minimum, Spot and on-demand alike.

``ZONES`` names the GPU zones searched by default (from
https://cloud.google.com/compute/docs/gpus/gpu-regions-zones, 2024); which of these types a zone
really has is asked of the API at run time (``offerings.py``: machineTypes.list and
acceleratorTypes.list), so this table only chooses where to look.
"""

from __future__ import annotations

import dataclasses

# Compute Engine accelerator type name -> the catalog's accelerator name.
ACCELERATOR_TYPES = {
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-v100": "V100",
    "nvidia-l4": "L4",
    "nvidia-tesla-a100": "A100",
    "nvidia-h100-80gb": "H100",
}
ACCELERATOR_TYPE_OF = {v: k for k, v in ACCELERATOR_TYPES.items()}


@dataclasses.dataclass(frozen=True)
class GcpType:
    """One launchable (machine type, accelerator, count) with its list prices."""

    machine_type: str
    accelerator: str
    gpus: int
    vcpus: int
    memory_gib: float
    on_demand_price_usd_per_hour: float
    spot_price_usd_per_hour: float
    # True: the GPUs are attached on insert (N1). False: the machine type has them built in.
    attached: bool

    @property
    def accelerator_type(self) -> str:
        """The Compute Engine accelerator type name (``nvidia-tesla-t4``)."""
        return ACCELERATOR_TYPE_OF[self.accelerator]

    @property
    def family(self) -> str:
        return self.machine_type.split("-", 1)[0]


def _n1(vcpus: int, accelerator: str, gpus: int, gpu_on_demand: float, gpu_spot: float) -> GcpType:
    # n1-standard-N: N vCPUs, 3.75 GB per vCPU. On demand $0.0475/h per vCPU (with its memory) in
    # us-central1, Spot about $0.01.
    return GcpType(f"n1-standard-{vcpus}", accelerator, gpus, vcpus, vcpus * 3.75,
                   round(vcpus * 0.0475 + gpus * gpu_on_demand, 4), round(vcpus * 0.01 + gpus * gpu_spot, 4),
                   attached=True)


TYPES: tuple[GcpType, ...] = (
    # T4 ($0.35 on demand, ~$0.14 Spot per GPU) and V100 ($2.48, ~$0.99) on N1.
    _n1(4, "T4", 1, 0.35, 0.14),
    _n1(8, "T4", 1, 0.35, 0.14),
    _n1(16, "T4", 2, 0.35, 0.14),
    _n1(32, "T4", 4, 0.35, 0.14),
    _n1(8, "V100", 1, 2.48, 0.99),
    _n1(16, "V100", 2, 2.48, 0.99),
    _n1(32, "V100", 4, 2.48, 0.99),
    _n1(64, "V100", 8, 2.48, 0.99),
    # L4 on G2 (machine price includes the GPU); Spot about 60% off.
    GcpType("g2-standard-4", "L4", 1, 4, 16, 0.7068, 0.2827, attached=False),
    GcpType("g2-standard-8", "L4", 1, 8, 32, 0.8536, 0.3414, attached=False),
    GcpType("g2-standard-12", "L4", 1, 12, 48, 1.0004, 0.4002, attached=False),
    GcpType("g2-standard-16", "L4", 1, 16, 64, 1.1472, 0.4589, attached=False),
    GcpType("g2-standard-24", "L4", 2, 24, 96, 2.0008, 0.8003, attached=False),
    GcpType("g2-standard-32", "L4", 1, 32, 128, 1.7344, 0.6938, attached=False),
    GcpType("g2-standard-48", "L4", 4, 48, 192, 4.0016, 1.6006, attached=False),
    GcpType("g2-standard-96", "L4", 8, 96, 384, 8.0032, 3.2013, attached=False),
    # A100 40GB on A2; Spot about 70% off.
    GcpType("a2-highgpu-1g", "A100", 1, 12, 85, 3.673, 1.1019, attached=False),
    GcpType("a2-highgpu-2g", "A100", 2, 24, 170, 7.347, 2.2041, attached=False),
    GcpType("a2-highgpu-4g", "A100", 4, 48, 340, 14.694, 4.4082, attached=False),
    GcpType("a2-highgpu-8g", "A100", 8, 96, 680, 29.387, 8.8161, attached=False),
    # H100 80GB on A3.
    GcpType("a3-highgpu-8g", "H100", 8, 208, 1872, 88.49, 26.547, attached=False),
)

# Region -> its GPU zones searched by default. A zone lacking a type simply does not list it.
ZONES: dict[str, tuple[str, ...]] = {
    "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
    "us-east1": ("us-east1-b", "us-east1-c", "us-east1-d"),
    "us-east4": ("us-east4-a", "us-east4-b", "us-east4-c"),
    "us-west1": ("us-west1-a", "us-west1-b"),
    "europe-west4": ("europe-west4-a", "europe-west4-b", "europe-west4-c"),
    "asia-southeast1": ("asia-southeast1-a", "asia-southeast1-b", "asia-southeast1-c"),
}
DEFAULT_REGIONS = ("us-central1",)


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``."""
    region, sep, suffix = zone.rpartition("-")
    if not sep or not region or not suffix:
        raise ValueError(f"{zone!r} is not a GCP zone (region-letter, e.g. us-central1-a)")
    return region


def find_type(machine_type: str, accelerator: str | None = None, gpus: int | None = None) -> GcpType | None:
    for t in TYPES:
        if t.machine_type == machine_type and accelerator in (None, t.accelerator) and gpus in (None, t.gpus):
            return t
    return None


def types_by_key() -> dict[tuple[str, str, int], GcpType]:
    return {(t.machine_type, t.accelerator, t.gpus): t for t in TYPES}
