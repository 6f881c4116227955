"""The GCP provider: Compute Engine Spot and on-demand GPU VMs through ``google-cloud-compute``.

Idempotent launch, three times over. The instance *name* is derived from the decision
(``instance_name``), so before inserting we ``get`` it: a relaunch after a crash finds the instance
that did launch. Every ``instances.insert`` carries ``requestId`` = a UUID derived from the decision
(``request_id``), so Compute answers a retried insert with the original operation instead of buying
a second VM. And a name already taken (a concurrent insert) is a 409 we answer with that instance.
Tags are written at insert time as labels (``labels.py``), so an instance is never visible untagged:
recovery finds everything with ``list_instances`` by tag.

Mutations return a zone operation, which we await with ``zoneOperations.wait`` (our own client from
the factory, so tests and private endpoints reach the same host); a stockout or quota failure is an
operation that ends with ``error.errors[].code`` (``errors.translate_operation``).

Spot VMs are inserted with ``provisioningModel=SPOT``, ``instanceTerminationAction=DELETE`` (a
preempted VM is deleted, so nothing is left to bill for its disk) and ``onHostMaintenance=TERMINATE``
(GPUs cannot live-migrate). Compute forgets a deleted VM at once, unlike EC2, so the provider keeps
what it saw of its instances for ``terminated_retention_s``: ``list_instances`` and ``poll`` still
report a deleted or preempted instance as TERMINATED, once. A Spot VM that Compute preempted and
deleted before this provider ever saw it (the controller was down) is learned from the zones'
``compute.instances.preempted`` operations and its name (``names.py``), so recovery counts it as a
preemption, ended with its notice, instead of an instance lost at restart time.

Billing: per second with a one-minute minimum (Compute's rule for Spot and on-demand), from
``creationTimestamp`` to our delete or the end of the preemption, at the price recorded on the
instance at launch (label ``spotrain-price-usd-per-hour``), which is the bundled list price unless
overridden, capped at on-demand.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..base import (
    SPOT,
    TAG_CONTROLLER,
    TAG_JOB,
    TAG_MARKET,
    TAG_PRICE,
    Instance,
    InstanceState,
    LaunchRequest,
    Offering,
)
from ..cloud_base import BootConfigFor, CloudProviderBase
from ..errors import InstanceNotFound, InvalidRequest, ProviderError
from ..retry import RetryPolicy, Where
from . import userdata
from ._google import (
    ACCELERATOR_TYPES,
    INSTANCES,
    MACHINE_TYPES,
    ZONE_OPERATIONS,
    ClientFactory,
    api_exceptions,
    make_client_factory,
)
from ._google import compute as sdk
from .catalog import DEFAULT_REGIONS, ZONES, GcpType, find_type, region_of
from .errors import CLOUD, call, operation_error_codes, translate_operation
from .instances import INTERRUPTION_PREEMPTION, NOTICE_S, parse_time, to_instance
from .labels import decode_labels, encode_tags, label_filter
from .names import instance_name, named_for, request_id
from .offerings import ZoneType, discover

# Google's Deep Learning VM image with PyTorch and the NVIDIA driver (see docs/gcp.md).
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
MIN_BILLED_S = 60.0
PREEMPTED_OPERATION = "compute.instances.preempted"


def _status(op: Any) -> str:
    value = op.status
    return str(getattr(value, "name", value))


def _override(overrides: Mapping[str, float], zone: str, t: GcpType) -> float | None:
    suffix = f"{t.machine_type}/{t.accelerator}:{t.gpus}"
    for key in (f"{zone}/{suffix}", suffix, f"{zone}/{t.machine_type}", t.machine_type):
        if key in overrides:
            return overrides[key]
    return None


class GcpProvider(CloudProviderBase):
    """Compute Engine Spot and on-demand GPU VMs of ``project`` in ``zones`` (default: the bundled GPU
    zones of ``regions``).

    ``machine_types`` restricts the offerings to machine types (``g2-standard-4``) or catalog entries
    (``n1-standard-32/V100:4``). Pass ``client_factory`` (kind -> compute_v1 client, see ``_google.py``) to inject clients, or
    ``endpoint`` / ``credentials``; with none, the standard Google auth chain and endpoint apply.
    """

    name = "gcp"
    min_billed_s = MIN_BILLED_S

    def __init__(
        self,
        *,
        project: str,
        controller_id: str,
        regions: Sequence[str] | None = None,
        zones: Sequence[str] | None = None,
        client_factory: ClientFactory | None = None,
        credentials: Any | None = None,
        endpoint: str | None = None,
        image: str = DEFAULT_IMAGE,
        network: str = "global/networks/default",
        subnetwork: str | None = None,
        external_ip: bool = True,
        service_account: str | None = None,
        disk_size_gb: int = 100,
        machine_types: Sequence[str] | None = None,
        spot_price_overrides: Mapping[str, float] | None = None,
        catalog_ttl_s: float = 3600.0,
        boot_config_for: BootConfigFor | None = None,
        agent_boot: userdata.AgentBoot | None = None,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.time,
        operation_timeout_s: float = 600.0,
        terminated_retention_s: float = 3600.0,
    ) -> None:
        if not project:
            raise ValueError("project must name a GCP project (SPOTRAIN_GCP_PROJECT)")
        if not controller_id:
            raise ValueError("controller_id must be a non-empty string")
        if zones is not None and (isinstance(zones, str) or not zones):
            raise ValueError(f"zones must be a non-empty list of GCP zones, got {zones!r}")
        if regions is not None and (isinstance(regions, str) or not regions):
            raise ValueError(f"regions must be a non-empty list of GCP regions, got {regions!r}")
        if zones is None:
            unknown = [r for r in regions or DEFAULT_REGIONS if r not in ZONES]
            if unknown:
                raise ValueError(f"no bundled GPU zones for region(s) {unknown}: pass zones explicitly")
            zones = [z for r in regions or DEFAULT_REGIONS for z in ZONES[r]]
        for zone in zones:
            region_of(zone)
        if regions is not None:
            stray = [z for z in zones if region_of(z) not in regions]
            if stray:
                raise ValueError(f"zones {stray} are not zones of regions {list(regions)}")
        if client_factory is not None and (credentials is not None or endpoint is not None):
            raise ValueError("pass either client_factory or credentials/endpoint, not both")
        for key, value in (spot_price_overrides or {}).items():
            if not value > 0:
                raise ValueError(f"spot price override {key}={value} must be > 0")
        if catalog_ttl_s < 0 or operation_timeout_s <= 0 or terminated_retention_s < 0 or disk_size_gb < 10:
            raise ValueError("catalog_ttl_s and terminated_retention_s must be >= 0, operation_timeout_s > 0, "
                             "disk_size_gb >= 10")
        if not image:
            raise ValueError("image must name a boot image (projects/<p>/global/images/[family/]<name>)")
        super().__init__(controller_id=controller_id, retry=retry, clock=clock, catalog_ttl_s=catalog_ttl_s,
                         boot_config_for=boot_config_for)
        self.project = project
        self.zones = tuple(dict.fromkeys(zones))
        self.regions = tuple(dict.fromkeys(region_of(z) for z in self.zones))
        self.image = image
        self._client = client_factory or make_client_factory(credentials=credentials, endpoint=endpoint)
        self._network, self._subnetwork, self._external_ip = network, subnetwork, external_ip
        self._service_account, self._disk_size_gb = service_account, disk_size_gb
        self._machine_types = frozenset(machine_types) if machine_types is not None else None
        self._overrides = dict(spot_price_overrides or {})
        self._agent_boot = agent_boot or userdata.AgentBoot()
        self._operation_timeout_s = operation_timeout_s
        self._retention_s = terminated_retention_s
        self._zone_of: dict[str, str] = {}
        self._deleted_at: dict[str, float] = {}
        # Every instance seen (listed or polled) until ``terminated_retention_s`` after its end.
        self._known: dict[str, Instance] = {}
        self._scanned_preemptions = False

    # -- catalog -------------------------------------------------------------------------------
    def _types_in(self, zone: str) -> Sequence[ZoneType]:
        return self._cached_catalog(zone, lambda: discover(
            machine_types=self._client(MACHINE_TYPES), accelerator_types=self._client(ACCELERATOR_TYPES),
            project=self.project, zone=zone, retry=self._retry, only=self._machine_types))

    def spot_price(self, zone: str, t: GcpType) -> float:
        """The Spot price of a catalog entry in a zone (an override, else the bundled list price)."""
        forced = _override(self._overrides, zone, t)
        return forced if forced is not None else t.spot_price_usd_per_hour

    def offerings(self) -> Sequence[Offering]:
        out: list[Offering] = []
        for zone in self.zones:
            for zt in self._types_in(zone):
                t = zt.catalog
                out.append(Offering(
                    cloud=CLOUD, region=zt.region, zone=zone, instance_type=t.machine_type,
                    accelerator=t.accelerator, gpus=t.gpus,
                    on_demand_price_usd_per_hour=t.on_demand_price_usd_per_hour,
                    spot_price_usd_per_hour=self.spot_price(zone, t), spot_available=None, notice_seconds=NOTICE_S,
                ))
        return out

    # -- launch --------------------------------------------------------------------------------
    def _offering_problem(self, o: Offering) -> str | None:
        if o.cloud != CLOUD:
            return f"offering {o.key} is not a GCP offering"
        if o.zone not in self.zones:
            return f"zone {o.zone} is not one of this provider's zones {list(self.zones)}"
        if find_type(o.instance_type, o.accelerator, o.gpus) is None:
            return f"{o.instance_type} with {o.accelerator}:{o.gpus} is not in the spotrain GCP catalog"
        return None

    def _decision_problem(self, decision_id: str) -> str | None:
        if not decision_id or not decision_id.isprintable():
            return f"decision_id {decision_id!r} must be a non-empty printable string"
        return None

    def _resource(self, request: LaunchRequest, name: str, entry: GcpType, labels: Mapping[str, str],
                  items: Mapping[str, str]) -> Any:
        c = sdk()
        zone = request.offering.zone
        if request.market == SPOT:
            scheduling = c.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                                      on_host_maintenance="TERMINATE", automatic_restart=False)
        else:
            scheduling = c.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE",
                                      automatic_restart=True)
        accelerators = [c.AcceleratorConfig(accelerator_type=f"zones/{zone}/acceleratorTypes/{entry.accelerator_type}",
                                            accelerator_count=entry.gpus)] if entry.attached else []
        nic = c.NetworkInterface(network=self._network)
        if self._subnetwork:
            nic.subnetwork = self._subnetwork
        if self._external_ip:
            nic.access_configs = [c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        resource = c.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{entry.machine_type}",
            labels=dict(labels),
            scheduling=scheduling,
            guest_accelerators=accelerators,
            disks=[c.AttachedDisk(boot=True, auto_delete=True, type_="PERSISTENT",
                                  initialize_params=c.AttachedDiskInitializeParams(
                                      source_image=self.image, disk_size_gb=self._disk_size_gb))],
            network_interfaces=[nic],
            metadata=c.Metadata(items=[c.Items(key=k, value=v) for k, v in sorted(items.items())]),
        )
        if self._service_account:
            resource.service_accounts = [c.ServiceAccount(
                email=self._service_account, scopes=["https://www.googleapis.com/auth/cloud-platform"])]
        return resource

    def _launch_labels(self, request: LaunchRequest, where: Where, price_usd_per_hour: float) -> dict[str, str]:
        try:
            return encode_tags(self._launch_tags(request, price_usd_per_hour))
        except InvalidRequest as exc:
            raise InvalidRequest(exc.message, **_where_kw(where)) from exc

    def _boot_items(self, request: LaunchRequest, where: Where) -> dict[str, str]:
        try:
            items = userdata.render(self._boot_config(request), self._agent_boot)
        except ValueError as exc:
            raise InvalidRequest(str(exc), **_where_kw(where)) from exc
        # Google's Deep Learning VM images install the NVIDIA driver on first boot when asked.
        items["install-nvidia-driver"] = "True"
        return items

    def get_record(self, zone: str, name: str) -> Any | None:
        """The Compute ``Instance`` resource, or None if Compute does not know it."""
        try:
            return call(self._client(INSTANCES).get, operation="instances.get",
                        where=Where(region=region_of(zone), zone=zone), retry=self._retry,
                        not_found=InstanceNotFound, project=self.project, zone=zone, instance=name)
        except InstanceNotFound:
            return None

    def launch(self, request: LaunchRequest) -> Instance:
        where = self._check(request)
        o = request.offering
        entry = find_type(o.instance_type, o.accelerator, o.gpus)
        assert entry is not None  # _check made sure
        name = instance_name(request.decision_id, request.tags.get(TAG_JOB), controller_id=self.controller_id)
        existing = self.get_record(o.zone, name)
        if existing is not None:
            return self._observe(existing, seen=True)
        price = o.on_demand_price_usd_per_hour if request.market != SPOT else min(
            self.spot_price(o.zone, entry), entry.on_demand_price_usd_per_hour)
        labels = self._launch_labels(request, where, price)
        resource = self._resource(request, name, entry, labels, self._boot_items(request, where))
        insert = {"project": self.project, "zone": o.zone, "instance_resource": resource,
                  "request_id": request_id(request.decision_id)}
        try:
            op = call(self._client(INSTANCES).insert, operation="instances.insert", where=where, retry=self._retry,
                      request=insert)
        except InvalidRequest as exc:
            raced = self.get_record(o.zone, name) if isinstance(exc.__cause__, api_exceptions().Conflict) else None
            if raced is None:
                raise
            return self._observe(raced, seen=True)
        done = self.wait(op, where=where, operation="instances.insert")
        record = self.get_record(o.zone, name)
        if record is None:
            return self._vanished_at_birth(request, name, labels, done)
        return self._observe(record, seen=True)

    def _vanished_at_birth(self, request: LaunchRequest, name: str, labels: Mapping[str, str], op: Any) -> Instance:
        """The insert succeeded, yet Compute no longer knows the VM: preempted and deleted already, or
        (after a controller crash) the operation is the original one of a VM long gone. It is reported
        as launched and terminated, so the controller records it and recovers, instead of retrying."""
        now = self._clock()
        o = request.offering
        born = parse_time(str(op.insert_time)) or now
        gone = Instance(instance_id=name, cloud=CLOUD, region=o.region, zone=o.zone, instance_type=o.instance_type,
                        market=request.market, state=InstanceState.TERMINATED, tags=decode_labels(labels),
                        launched_at_s=born, terminated_at_s=max(born, now),
                        interruption=INTERRUPTION_PREEMPTION if request.market == SPOT else None, offering_key=o.key)
        with self._lock:
            self._zone_of[name] = o.zone
            self._ended_at_s.setdefault(name, gone.terminated_at_s or now)
            self._known[name] = gone
        return gone

    def wait(self, op: Any, *, where: Where, operation: str) -> Any:
        """Await a zone operation (``zoneOperations.wait``, which returns when it is DONE or after about
        two minutes); raise its error, translated, if it failed."""
        ops = self._client(ZONE_OPERATIONS)
        deadline = time.monotonic() + self._operation_timeout_s
        current = op
        while _status(current) != "DONE":
            if time.monotonic() > deadline:
                raise ProviderError(f"GCP {operation}: operation {current.name} not done after "
                                    f"{self._operation_timeout_s:.0f} s", **_where_kw(where))
            current = call(ops.wait, operation="zoneOperations.wait", where=where, retry=self._retry,
                           timeout_s=150.0,
                           request={"project": self.project, "zone": where.zone, "operation": str(current.name)})
        errors = operation_error_codes(current)
        if errors:
            status = int(current.http_error_status_code or 0) or None
            raise translate_operation(errors, operation=operation, where=where, http_status=status)
        return current

    # -- what we saw ---------------------------------------------------------------------------
    def _observe(self, record: Any, *, seen: bool = False) -> Instance:
        """Convert a Compute record, keeping what only this provider knows (when it ended, a notice)."""
        name = str(record.name)
        now = self._clock()
        with self._lock:
            deleted, ended, prior = self._deleted_at.get(name), self._ended_at_s.get(name), self._known.get(name)
        instance = to_instance(record, now_s=now, deleted_at_s=deleted, ended_at_s=ended)
        if prior is not None and prior.interruption and instance.interruption is None:
            instance = dataclasses.replace(instance, interruption=prior.interruption)
        with self._lock:
            self._zone_of[name] = instance.zone
            if instance.terminated_at_s is not None:
                self._ended_at_s.setdefault(name, instance.terminated_at_s)
            self._known[name] = instance
            if seen:
                self._seen[name] = instance
        return instance

    def _gone(self, old: Instance) -> Instance:
        """What a known instance that Compute no longer lists has become: terminated (deleted)."""
        now = self._clock()
        name = old.instance_id
        with self._lock:
            ended = self._ended_at_s.get(name) or self._deleted_at.get(name)
            deleted = name in self._deleted_at
        if ended is None:
            ended = min(old.notice_deadline_s, now) if old.notice_deadline_s is not None else now
        interruption = old.interruption
        if old.market == SPOT and not deleted:
            interruption = INTERRUPTION_PREEMPTION
        gone = dataclasses.replace(old, state=InstanceState.TERMINATED, terminated_at_s=max(ended, old.launched_at_s),
                                   notice_deadline_s=None, interruption=interruption)
        with self._lock:
            self._ended_at_s.setdefault(name, gone.terminated_at_s or now)
            self._known[name] = gone
        return gone

    def _forget_old(self) -> None:
        cutoff = self._clock() - self._retention_s
        with self._lock:
            for name, inst in list(self._known.items()):
                if not inst.alive and (inst.terminated_at_s or 0.0) < cutoff:
                    for table in (self._known, self._deleted_at, self._ended_at_s, self._zone_of):
                        table.pop(name, None)

    def _records(self, tags: Mapping[str, str]) -> list[Any]:
        """Every instance of the provider's zones whose labels carry ``tags`` (one aggregated list)."""
        text = label_filter(tags)
        request: dict[str, Any] = {"project": self.project}
        if text:
            request["filter"] = text
        client = self._client(INSTANCES)
        pairs = call(lambda **kw: list(client.aggregated_list(**kw)), operation="instances.aggregatedList",
                     where=Where(), retry=self._retry, request=request)
        zones = set(self.zones)
        return [r for scope, scoped in pairs if scope.rsplit("/", 1)[-1] in zones for r in scoped.instances]

    # -- terminate, list, poll -----------------------------------------------------------------
    def terminate(self, instance_id: str) -> None:
        with self._lock:
            known = self._zone_of.get(instance_id)
        for zone in [known] if known else list(self.zones):
            where = Where(region=region_of(zone), zone=zone)
            try:
                call(self._client(INSTANCES).delete, operation="instances.delete", where=where, retry=self._retry,
                     not_found=InstanceNotFound, project=self.project, zone=zone, instance=instance_id)
            except InstanceNotFound:
                continue
            with self._lock:
                self._zone_of[instance_id] = zone
                # Billing ends now, unless it had already ended (preempted before we asked).
                self._deleted_at.setdefault(instance_id, self._clock())
            return

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        self._forget_old()
        found = {i.instance_id: i for i in (self._observe(r) for r in self._records(tags))}
        with self._lock:
            remembered = [i for name, i in self._known.items()
                          if name not in found and all(i.tags.get(k) == v for k, v in tags.items())]
        for old in remembered:
            found[old.instance_id] = old if not old.alive else self._gone(old)
        for gone in self._preempted_while_away(tags, found):
            found[gone.instance_id] = gone
        return list(found.values())

    def _preempted_while_away(self, tags: Mapping[str, str], listed: Mapping[str, Instance]) -> list[Instance]:
        """This controller's Spot VMs that Compute preempted, and deleted, before this provider saw them
        (a controller restarted after one): each zone's ``compute.instances.preempted`` operations.

        Compute keeps nothing else of a deleted VM, not even its labels, so the VM is known by its name
        (``named_for``) and reported with the tags the name vouches for, controller and market, TERMINATED
        at the end of its notice, ``interruption="preemption"``, ``instance_type`` unknown ("") and
        ``launched_at_s`` the preemption's start (its launch time went with it), for as long as Compute
        keeps the operation (however long the controller was down, the bill ends at the
        preemption). EC2 lists such an instance for about an hour with ``Server.SpotInstanceTermination``;
        recovery counts either as a preemption, not a lost instance. Asked once per provider: afterwards
        every VM of the controller has been seen, and ``poll`` reports how it ends."""
        vouched = {TAG_CONTROLLER: self.controller_id, TAG_MARKET: SPOT}
        if self._scanned_preemptions or any(vouched.get(k) != v for k, v in tags.items()):
            return []
        client = self._client(ZONE_OPERATIONS)
        now = self._clock()
        out: list[Instance] = []
        for zone in self.zones:
            where = Where(region=region_of(zone), zone=zone)
            ops = call(lambda **kw: list(client.list(**kw)), operation="zoneOperations.list", where=where,
                       retry=self._retry, request={"project": self.project, "zone": zone,
                                                   "filter": f'operationType = "{PREEMPTED_OPERATION}"'})
            for op in ops:
                name = str(op.target_link).rstrip("/").rsplit("/", 1)[-1]
                began = parse_time(str(op.insert_time)) or now
                with self._lock:
                    known = name in self._known
                if name in listed or known or not named_for(name, self.controller_id):
                    continue
                gone = Instance(instance_id=name, cloud=CLOUD, region=where.region or "", zone=zone, instance_type="",
                                market=SPOT, state=InstanceState.TERMINATED, tags=dict(vouched), launched_at_s=began,
                                terminated_at_s=min(began + NOTICE_S, now), interruption=INTERRUPTION_PREEMPTION)
                with self._lock:
                    self._zone_of[name] = zone
                    self._ended_at_s.setdefault(name, gone.terminated_at_s or now)
                    self._known[name] = gone
                out.append(gone)
        self._scanned_preemptions = True
        return out

    def _listed_now(self) -> dict[str, Instance]:
        self._forget_old()
        return {i.instance_id: i for i in (self._observe(r) for r in self._records({TAG_CONTROLLER: self.controller_id}))}

    def _vanished(self, current: Mapping[str, Instance]) -> list[Instance]:
        changed: list[Instance] = []
        with self._lock:
            vanished = [old for name, old in self._seen.items() if name not in current]
            # Listed (by recovery, say) but never polled: its end must not go unreported either.
            vanished += [old for name, old in self._known.items() if name not in current and name not in self._seen
                         and old.alive and old.tags.get(TAG_CONTROLLER) == self.controller_id]
        for old in vanished:
            if old.alive:
                changed.append(self._gone(old))
            with self._lock:
                self._seen.pop(old.instance_id, None)
        return changed

    # -- money and boot config -----------------------------------------------------------------
    def _on_demand_price(self, instance: Instance) -> float:
        entry = _entry_of(instance)
        if entry is None:
            raise InvalidRequest(f"instance {instance.instance_id} ({instance.instance_type}) is not in the spotrain "
                                 f"GCP catalog", cloud=CLOUD, region=instance.region, zone=instance.zone,
                                 instance_type=instance.instance_type)
        return entry.on_demand_price_usd_per_hour

    def _spot_price(self, instance: Instance) -> float | None:
        entry = _entry_of(instance)
        return self.spot_price(instance.zone, entry) if entry is not None else None

    def boot_config(self, instance: Instance) -> dict[str, Any]:
        """The agent config in the instance's metadata (what its startup script hands the agent)."""
        record = self.get_record(instance.zone, instance.instance_id)
        if record is None:
            raise InstanceNotFound(f"GCP instance {instance.instance_id} not found", cloud=CLOUD, zone=instance.zone)
        items = {str(i.key): str(i.value) for i in record.metadata.items}
        try:
            return userdata.decode(items)
        except ValueError as exc:
            raise InvalidRequest(f"instance {instance.instance_id}: {exc}", cloud=CLOUD, zone=instance.zone) from exc


def _where_kw(where: Where) -> dict[str, Any]:
    return {"cloud": CLOUD, "region": where.region, "zone": where.zone, "instance_type": where.instance_type}


def _entry_of(instance: Instance) -> GcpType | None:
    parts = instance.offering_key.split("/")
    if len(parts) == 4 and ":" in parts[3]:
        accelerator, _, gpus = parts[3].partition(":")
        found = find_type(parts[2], accelerator, int(gpus)) if gpus.isdigit() else None
        if found is not None:
            return found
    return find_type(instance.instance_type)


__all__ = ["BootConfigFor", "DEFAULT_IMAGE", "GcpProvider", "MIN_BILLED_S", "TAG_PRICE", "instance_name", "request_id"]
