"""The AWS provider: EC2 through boto3, behind the narrow ``cloud_providers.base.Provider`` contract.

Idempotent launch, twice over: every ``run_instances`` carries ``ClientToken = decision_id`` (EC2
returns the original reservation for a repeated token, so a retry after a timeout or a controller
crash never buys a second instance), and before launching we look for an instance already tagged
with the decision (``spotrain-decision``), which also covers tokens EC2 has forgotten and moto, which
ignores ClientToken. Tags are applied atomically at launch (TagSpecifications), so an instance is
never visible untagged: recovery finds everything with ``list_instances`` by tag.

Billing: per-second, with EC2's one-minute minimum for Linux, from ``LaunchTime`` to termination (the
time in ``StateTransitionReason`` or when we first saw it gone). The spot price is the one cached at
launch (recorded on the instance as tag ``spotrain-price-usd-per-hour``, so it survives a controller
restart), capped at the on-demand price, which is the default maximum spot price. Real spot bills
follow the hourly price changes; the launch price is within a few percent over a job's lifetime.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..base import (
    SPOT,
    TAG_CONTROLLER,
    TAG_DECISION,
    TAG_JOB,
    Instance,
    InstanceState,
    LaunchRequest,
    Offering,
)
from ..catalog import NOTICE_SECONDS, find
from ..cloud_base import BootConfigFor, CloudProviderBase
from ..errors import InstanceNotFound, InvalidRequest
from ..retry import RetryPolicy, Where
from . import userdata
from ._boto import ClientFactory, make_client_factory
from .errors import CLOUD, call
from .instances import to_instance
from .offerings import ZoneType, catalog_types, discover
from .pricing import SpotPriceCache

# The PyTorch Deep Learning AMI (x86_64, Ubuntu 24.04), resolved by EC2 itself from the public SSM
# parameter at launch (RunInstances accepts "resolve:ssm:<name>" in place of an AMI id).
DEFAULT_IMAGE_ID = (
    "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
    "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id"
)
MIN_BILLED_S = 60.0
# An instance EC2 does not list yet is not "gone" until this long after its launch (describe is
# eventually consistent right after RunInstances).
VANISH_GRACE_S = 300.0
SPOT_NOTICE_S = NOTICE_SECONDS["aws"]


def _describe_all(client: Any, *, region: str, retry: RetryPolicy, **kwargs: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = call(client.describe_instances, operation="DescribeInstances", where=Where(region=region),
                    retry=retry, **(kwargs | ({"NextToken": token} if token else {})))
        for reservation in page.get("Reservations", []):
            records.extend(reservation.get("Instances", []))
        token = page.get("NextToken") or None
        if not token:
            return records


def _tag_filters(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{k}", "Values": [v]} for k, v in sorted(tags.items())]


class AwsProvider(CloudProviderBase):
    """EC2 spot and on-demand GPU instances in ``regions`` (optionally only ``zones``).

    Pass ``client_factory`` (region -> EC2 client) to inject Stubber'd or moto clients, or a boto3
    ``session``; with neither, boto3's default credential chain and endpoint settings apply.
    """

    name = "aws"
    min_billed_s = MIN_BILLED_S

    def __init__(
        self,
        *,
        regions: Sequence[str],
        controller_id: str,
        zones: Sequence[str] | None = None,
        session: Any | None = None,
        client_factory: ClientFactory | None = None,
        endpoint_url: str | None = None,
        image_id: str = DEFAULT_IMAGE_ID,
        spot_price_overrides: Mapping[str, float] | None = None,
        spot_price_ttl_s: float = 300.0,
        catalog_ttl_s: float = 3600.0,
        boot_config_for: BootConfigFor | None = None,
        agent_boot: userdata.AgentBoot | None = None,
        subnet_by_zone: Mapping[str, str] | None = None,
        security_group_ids: Sequence[str] = (),
        key_name: str | None = None,
        instance_profile: str | None = None,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(regions, str) or not regions:
            raise ValueError(f"regions must be a non-empty list of AWS regions, got {regions!r}")
        if not controller_id:
            raise ValueError("controller_id must be a non-empty string")
        if zones is not None:
            stray = [z for z in zones if not any(z.startswith(r) and len(z) > len(r) for r in regions)]
            if isinstance(zones, str) or stray:
                raise ValueError(f"zones {stray or zones!r} are not zones of regions {list(regions)}")
        if not image_id:
            raise ValueError("image_id must name an AMI (ami-...) or resolve:ssm:<parameter>")
        if catalog_ttl_s < 0:
            raise ValueError(f"catalog_ttl_s must be >= 0, got {catalog_ttl_s}")
        if client_factory is not None and (session is not None or endpoint_url is not None):
            raise ValueError("pass either client_factory or session/endpoint_url, not both")
        super().__init__(controller_id=controller_id, retry=retry, clock=clock, catalog_ttl_s=catalog_ttl_s,
                         boot_config_for=boot_config_for)
        self.regions = tuple(regions)
        self.zones = frozenset(zones) if zones is not None else None
        self.image_id = image_id
        self._client_for = client_factory or make_client_factory(session, endpoint_url=endpoint_url)
        self._prices = SpotPriceCache(client_for=self._client_for, retry=self._retry, clock=clock,
                                      ttl_s=spot_price_ttl_s, overrides=spot_price_overrides)
        self._agent_boot = agent_boot or userdata.AgentBoot()
        self._subnet_by_zone = dict(subnet_by_zone or {})
        self._security_group_ids = list(security_group_ids or ())
        self._key_name = key_name
        self._instance_profile = instance_profile
        self._region_of: dict[str, str] = {}

    # -- catalog -------------------------------------------------------------------------------
    def _types_in(self, region: str) -> Sequence[ZoneType]:
        return self._cached_catalog(region, lambda: discover(self._client_for(region), region=region,
                                                             zones=self.zones, retry=self._retry))

    def _type_names(self, region: str) -> set[str]:
        return {t.catalog.instance_type for t in self._types_in(region)}

    def offerings(self) -> Sequence[Offering]:
        out: list[Offering] = []
        for region in self.regions:
            types = self._types_in(region)
            names = {t.catalog.instance_type for t in types}
            for t in types:
                # The lambda is called (if at all) inside this iteration, so it sees this region's names.
                spot = self._prices.price(region, t.zone, t.catalog.instance_type, lambda: names)  # noqa: B023
                out.append(
                    Offering(
                        cloud=CLOUD,
                        region=region,
                        zone=t.zone,
                        instance_type=t.catalog.instance_type,
                        accelerator=t.accelerator,
                        gpus=t.gpus,
                        on_demand_price_usd_per_hour=t.catalog.on_demand_price_usd_per_hour,
                        spot_price_usd_per_hour=spot,
                        spot_available=None,
                        notice_seconds=SPOT_NOTICE_S,
                    )
                )
        return out

    # -- launch --------------------------------------------------------------------------------
    def _offering_problem(self, o: Offering) -> str | None:
        if o.cloud != CLOUD:
            return f"offering {o.key} is not an AWS offering"
        if o.region not in self.regions:
            return f"region {o.region} is not one of this provider's regions {list(self.regions)}"
        if self.zones is not None and o.zone not in self.zones:
            return f"zone {o.zone} is not one of this provider's zones {sorted(self.zones)}"
        if o.instance_type not in catalog_types():
            return f"instance type {o.instance_type} is not in the spotrain catalog"
        return None

    def _decision_problem(self, decision_id: str) -> str | None:
        token = decision_id
        if not token or len(token) > 64 or not token.isascii() or not token.isprintable():
            return f"decision_id {token!r} must be 1-64 printable ASCII characters (EC2 ClientToken)"
        return None

    def _launch_tags(self, request: LaunchRequest, price_usd_per_hour: float) -> dict[str, str]:
        tags = super()._launch_tags(request, price_usd_per_hour)
        tags.setdefault("Name", f"spotrain-{tags.get(TAG_JOB, 'instance')}")
        return tags

    def find_decision(self, region: str, decision_id: str) -> Instance | None:
        """The instance this controller launched for ``decision_id``, in any state, if EC2 lists it."""
        client = self._client_for(region)
        records = _describe_all(client, region=region, retry=self._retry, Filters=_tag_filters(
            {TAG_CONTROLLER: self.controller_id, TAG_DECISION: decision_id}))
        found = [self._convert(r, region) for r in records]
        found.sort(key=lambda i: (i.launched_at_s, i.instance_id))
        return found[0] if found else None

    def launch(self, request: LaunchRequest) -> Instance:
        where = self._check(request)
        o = request.offering
        existing = self.find_decision(o.region, request.decision_id)
        if existing is not None:
            return existing
        price = o.on_demand_price_usd_per_hour
        if request.market == SPOT:
            live = self._prices.price(o.region, o.zone, o.instance_type, lambda: self._type_names(o.region))
            price = min(live, price) if live is not None else price
        try:
            user_data = userdata.render(self._boot_config(request), self._agent_boot)
        except ValueError as exc:
            raise InvalidRequest(str(exc), cloud=CLOUD, region=o.region, zone=o.zone,
                                 instance_type=o.instance_type) from exc
        tags = self._launch_tags(request, price)
        params: dict[str, Any] = {
            "ImageId": self.image_id,
            "InstanceType": o.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": request.decision_id,
            "UserData": user_data,
            "Placement": {"AvailabilityZone": o.zone},
            # IMDSv2 only; hop limit 2 so the agent can reach IMDS from a container too.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}
            ],
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if request.market == SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        if o.zone in self._subnet_by_zone:
            params["SubnetId"] = self._subnet_by_zone[o.zone]
        if self._security_group_ids:
            params["SecurityGroupIds"] = self._security_group_ids
        if self._key_name:
            params["KeyName"] = self._key_name
        if self._instance_profile:
            params["IamInstanceProfile"] = {"Name": self._instance_profile}
        response = call(self._client_for(o.region).run_instances, operation="RunInstances", where=where,
                        retry=self._retry, **params)
        record = dict(response["Instances"][0])
        # Tags were applied atomically at launch; not every response echoes them.
        record.setdefault("Tags", [{"Key": k, "Value": v} for k, v in sorted(tags.items())])
        instance = self._convert(record, o.region)
        with self._lock:
            self._seen[instance.instance_id] = instance
        return instance

    # -- terminate, list, poll -----------------------------------------------------------------
    def terminate(self, instance_id: str) -> None:
        with self._lock:
            known = self._region_of.get(instance_id)
        for region in ([known] if known else list(self.regions)):
            try:
                response = call(self._client_for(region).terminate_instances, operation="TerminateInstances",
                                where=Where(region=region), retry=self._retry, InstanceIds=[instance_id])
            except InstanceNotFound:
                continue
            previous = [t.get("PreviousState", {}).get("Name") for t in response.get("TerminatingInstances", [])]
            with self._lock:
                self._region_of[instance_id] = region
                # Billing ends now, unless it had already ended (then describe tells when).
                if not any(p in ("shutting-down", "terminated") for p in previous):
                    self._ended_at_s.setdefault(instance_id, self._clock())
            return

    def _convert(self, record: Mapping[str, Any], region: str, notice_deadline_s: float | None = None) -> Instance:
        instance_id = str(record["InstanceId"])
        with self._lock:
            self._region_of[instance_id] = region
            ended = self._ended_at_s.get(instance_id)
        instance = to_instance(record, region=region, now_s=self._clock(),
                               notice_deadline_s=notice_deadline_s, terminated_at_s=ended)
        if instance.terminated_at_s is not None and ended is None:
            with self._lock:
                self._ended_at_s[instance_id] = instance.terminated_at_s
        return instance

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        out: list[Instance] = []
        for region in self.regions:
            records = _describe_all(self._client_for(region), region=region, retry=self._retry,
                                    **({"Filters": _tag_filters(tags)} if tags else {}))
            out.extend(self._convert(r, region) for r in records)
        return out

    def _spot_notices(self, region: str, records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Instance id -> notice deadline, for spot requests EC2 has marked for termination."""
        request_ids = [str(r["SpotInstanceRequestId"]) for r in records
                       if r.get("SpotInstanceRequestId") and r.get("State", {}).get("Name") == "running"]
        if not request_ids:
            return {}
        page = call(self._client_for(region).describe_spot_instance_requests,
                    operation="DescribeSpotInstanceRequests", where=Where(region=region), retry=self._retry,
                    SpotInstanceRequestIds=request_ids)
        notices: dict[str, float] = {}
        for req in page.get("SpotInstanceRequests", []):
            status = req.get("Status", {})
            if status.get("Code") == "marked-for-termination" and req.get("InstanceId"):
                updated = status.get("UpdateTime")
                start = updated.timestamp() if updated is not None else self._clock()
                notices[str(req["InstanceId"])] = start + SPOT_NOTICE_S
        return notices

    def _listed_now(self) -> dict[str, Instance]:
        current: dict[str, Instance] = {}
        for region in self.regions:
            records = _describe_all(self._client_for(region), region=region, retry=self._retry,
                                    Filters=_tag_filters({TAG_CONTROLLER: self.controller_id}))
            notices = self._spot_notices(region, records)
            for r in records:
                inst = self._convert(r, region, notices.get(str(r["InstanceId"])))
                current[inst.instance_id] = inst
        return current

    def _vanished(self, current: Mapping[str, Instance]) -> list[Instance]:
        now = self._clock()
        changed: list[Instance] = []
        with self._lock:
            for instance_id, old in list(self._seen.items()):
                if instance_id in current:
                    continue
                if old.alive and now - old.launched_at_s > VANISH_GRACE_S:
                    # EC2 forgets terminated instances after about an hour; we must not miss the end.
                    gone = dataclasses.replace(old, state=InstanceState.TERMINATED, terminated_at_s=now,
                                               notice_deadline_s=None)
                    self._ended_at_s.setdefault(instance_id, now)
                    changed.append(gone)
                    del self._seen[instance_id]
                elif not old.alive:
                    del self._seen[instance_id]
        return changed

    # -- money and boot config -----------------------------------------------------------------
    def _on_demand_price(self, instance: Instance) -> float:
        info = find(CLOUD, instance.instance_type)
        if info is None:
            raise InvalidRequest(f"instance type {instance.instance_type} is not in the spotrain catalog",
                                 cloud=CLOUD, region=instance.region, zone=instance.zone,
                                 instance_type=instance.instance_type)
        return info.on_demand_price_usd_per_hour

    def _spot_price(self, instance: Instance) -> float | None:
        return self._prices.price(instance.region, instance.zone, instance.instance_type,
                                  lambda: self._type_names(instance.region))

    def boot_config(self, instance: Instance) -> dict[str, Any]:
        """The agent config in the instance's user data (what the local executor runs under moto)."""
        client = self._client_for(instance.region)
        attr = call(client.describe_instance_attribute, operation="DescribeInstanceAttribute",
                    where=Where(region=instance.region, zone=instance.zone, instance_type=instance.instance_type),
                    retry=self._retry, InstanceId=instance.instance_id, Attribute="userData")
        encoded = (attr.get("UserData") or {}).get("Value", "")
        try:
            return userdata.decode(base64.b64decode(encoded).decode())
        except ValueError as exc:
            raise InvalidRequest(f"instance {instance.instance_id}: {exc}", cloud=CLOUD,
                                 region=instance.region, zone=instance.zone) from exc


__all__ = ["AwsProvider", "BootConfigFor", "DEFAULT_IMAGE_ID"]
