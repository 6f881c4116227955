"""Bundled catalog of GPU instance types with their on-demand list prices.

Prices are the public Linux on-demand list prices (USD per hour) of us-east-1 (AWS) and us-central1
(GCP, machine + attached GPUs) as published in 2024; regional differences are small for these types
and are ignored. Real spot prices are not listed here: they come from the cloud (AWS
describe_spot_price_history) or from a market trace (local cloud, simulator).

GCP attaches GPUs to a machine type, so one machine type can carry different GPUs; an offering is
therefore named by machine type *and* accelerator (see ``Offering.key``).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class InstanceType:
    cloud: str
    instance_type: str
    accelerator: str
    gpus: int
    vcpus: int
    memory_gib: float
    on_demand_price_usd_per_hour: float


# Preemption notice each cloud gives before it takes a spot instance back.
NOTICE_SECONDS = {"aws": 120.0, "gcp": 30.0, "local": 120.0}

INSTANCE_TYPES: tuple[InstanceType, ...] = (
    # AWS, us-east-1 on-demand list prices.
    InstanceType("aws", "g4dn.xlarge", "T4", 1, 4, 16, 0.526),
    InstanceType("aws", "g4dn.12xlarge", "T4", 4, 48, 192, 3.912),
    InstanceType("aws", "g5.xlarge", "A10G", 1, 4, 16, 1.006),
    InstanceType("aws", "g5.12xlarge", "A10G", 4, 48, 192, 5.672),
    InstanceType("aws", "g6.xlarge", "L4", 1, 4, 16, 0.8048),
    InstanceType("aws", "p3.2xlarge", "V100", 1, 8, 61, 3.06),
    InstanceType("aws", "p3.8xlarge", "V100", 4, 32, 244, 12.24),
    InstanceType("aws", "p3.16xlarge", "V100", 8, 64, 488, 24.48),
    InstanceType("aws", "p4d.24xlarge", "A100", 8, 96, 1152, 32.7726),
    InstanceType("aws", "p5.48xlarge", "H100", 8, 192, 2048, 98.32),
    # GCP, us-central1: machine type plus attached GPUs.
    InstanceType("gcp", "n1-standard-8", "T4", 1, 8, 30, 0.73),
    InstanceType("gcp", "n1-standard-8", "V100", 1, 8, 30, 2.86),
    InstanceType("gcp", "n1-standard-32", "V100", 4, 32, 120, 11.44),
    InstanceType("gcp", "g2-standard-4", "L4", 1, 4, 16, 0.7068),
    InstanceType("gcp", "a2-highgpu-1g", "A100", 1, 12, 85, 3.673),
    InstanceType("gcp", "a2-highgpu-4g", "A100", 4, 48, 340, 14.694),
)

ACCELERATORS: frozenset[str] = frozenset(t.accelerator for t in INSTANCE_TYPES)
CLOUDS: frozenset[str] = frozenset({"aws", "gcp", "local"})


def find(cloud: str, instance_type: str, accelerator: str | None = None) -> InstanceType | None:
    for t in INSTANCE_TYPES:
        if t.cloud == cloud and t.instance_type == instance_type:
            if accelerator is None or t.accelerator == accelerator:
                return t
    return None


def known_instance_types() -> frozenset[str]:
    return frozenset(t.instance_type for t in INSTANCE_TYPES)


# ---- Egress between regions and clouds (issue 23) ----------------------------------------------
# USD per GB that leaves a region, by the cloud the data leaves. Public list prices (2024-2025):
# - AWS, https://aws.amazon.com/ec2/pricing/on-demand/ ("Data Transfer"): out to another AWS region
#   $0.02/GB (us-east-1 <-> us-east-2 $0.01/GB); out to the internet (another cloud) $0.09/GB for the
#   first 10 TB a month. Within a region, reading the regional checkpoint store (S3) is free.
# - GCP, https://cloud.google.com/vpc/network-pricing ("Data transfer between regions" and Premium Tier
#   internet egress): between regions of one continent $0.02/GiB (some pairs $0.01), between
#   continents $0.05/GiB (Northern America <-> Europe; other pairs more); out to the internet (another
#   cloud) $0.12/GiB for the first TiB to North America. GCS reads within a region are free.
# These are the list prices an egress bill starts from (volume tiers lower them); the local cloud,
# whose offerings name real clouds and regions, replays them.
EGRESS_INTER_REGION_USD_PER_GB = {"aws": 0.02, "gcp": 0.02}
EGRESS_INTER_CONTINENT_USD_PER_GB = {"aws": 0.02, "gcp": 0.05}
EGRESS_INTERNET_USD_PER_GB = {"aws": 0.09, "gcp": 0.12}
# Region pairs priced below the cloud's inter-region rate.
EGRESS_NEAR_PAIRS_USD_PER_GB = {frozenset({"us-east-1", "us-east-2"}): 0.01}

_CONTINENT_PREFIXES = (("us-", "na"), ("ca-", "na"), ("northamerica-", "na"), ("eu-", "eu"), ("europe-", "eu"),
                       ("ap-", "asia"), ("asia-", "asia"), ("australia-", "asia"), ("sa-", "sa"),
                       ("southamerica-", "sa"), ("me-", "me"), ("il-", "me"), ("af-", "af"), ("africa-", "af"))


def continent(region: str) -> str:
    """The continent of a region name (AWS or GCP style); the name itself when unknown."""
    for prefix, name in _CONTINENT_PREFIXES:
        if region.startswith(prefix):
            return name
    return region


def egress_usd_per_gb(src_cloud: str, src_region: str, dst_cloud: str, dst_region: str) -> float:
    """What one GB of a job's state costs to carry from ``src`` to ``dst``: nothing within a region
    (or on the local cloud's own offerings), the source cloud's inter-region rate between its regions,
    its internet egress rate to another cloud."""
    if src_cloud == dst_cloud and src_region == dst_region:
        return 0.0
    if src_cloud == "local" and dst_cloud == "local":
        return 0.0
    if src_cloud != dst_cloud:
        return EGRESS_INTERNET_USD_PER_GB.get(src_cloud, max(EGRESS_INTERNET_USD_PER_GB.values()))
    near = EGRESS_NEAR_PAIRS_USD_PER_GB.get(frozenset({src_region, dst_region}))
    if near is not None and src_cloud == "aws":
        return near
    if continent(src_region) != continent(dst_region):
        return EGRESS_INTER_CONTINENT_USD_PER_GB.get(src_cloud, 0.02)
    return EGRESS_INTER_REGION_USD_PER_GB.get(src_cloud, 0.02)
