"""A loopback fake of the Compute Engine REST API (v1), driven by the real ``google-cloud-compute`` clients.

``FakeCompute`` serves plain HTTP on 127.0.0.1:<free port> from a thread. Clients reach it the way the
provider does in production, through ``compute_v1`` REST transports
(``InstancesRestTransport(host=..., url_scheme="http", credentials=AnonymousCredentials())``, which
``cloud_providers/gcp/_google.make_client_factory(endpoint=fake.endpoint)`` builds); a controller
subprocess reaches it through ``fake.env()`` (``SPOTRAIN_GCP_ENDPOINT``, ``SPOTRAIN_GCP_PROJECT``). No
method of the Google clients is patched: requests and responses are the API's JSON, errors are the
API's error bodies (``{"error": {"code", "message", "errors": [{"reason", ...}]}}``, which api_core
turns into its exception types), and a stockout or quota failure is, as on Compute, an insert whose
zone operation ends DONE with ``error.errors[].code`` (``ZONE_RESOURCE_POOL_EXHAUSTED``,
``QUOTA_EXCEEDED``).

The subset served: instances insert (``requestId`` deduplicated: a repeated id returns the original
operation) / get / list (``filter`` on labels and name) / delete, aggregated instances list, zone
operations get, wait and list (``filter`` on ``operationType``: a preemption leaves a
``compute.instances.preempted`` operation by ``system``, which outlives the VM), machineTypes and
acceleratorTypes lists.

Knobs (Python methods, thread-safe): ``stockout``, ``quota``, ``throttle`` (429 for the next N
calls), ``fail`` (any HTTP error for the next N matching calls), ``preempt`` (Spot VM to STOPPING
with ``lastStopTimestamp`` and a preempted ``statusMessage``; then ``complete_preemption`` deletes it
or leaves it TERMINATED, as its ``instanceTerminationAction`` says), ``set_status``. ``calls`` logs
every request; ``on_preempt`` hooks let a test relay the notice (e.g. to a metadata-server fake).
Timestamps come from ``clock`` (default wall time), so tests can share a fake clock with the provider.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cloud_providers.gcp.catalog import ACCELERATOR_TYPE_OF, TYPES

API = "https://www.googleapis.com/compute/v1"
DEFAULT_PROJECT = "spotrain-test"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_CLAUSE = re.compile(r'^\(?\s*(labels\.[a-z0-9_-]+|name|status|operationType|targetLink)\s*(=|eq)\s*"?([^"()]*?)"?\s*\)?$')
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

# Machine types without GPUs that every fake zone lists too (the provider must skip them).
PLAIN_TYPES = {"e2-standard-2": (2, 8192), "n2-standard-8": (8, 32768)}
ALL_GPUS = {"nvidia-tesla-t4": 4, "nvidia-tesla-v100": 8, "nvidia-l4": 8, "nvidia-tesla-a100": 16,
            "nvidia-h100-80gb": 8, "nvidia-tesla-p100": 4}
_N1 = tuple(sorted({t.machine_type for t in TYPES if t.family == "n1"}))
_G2 = tuple(sorted({t.machine_type for t in TYPES if t.family == "g2"}))
_A2 = tuple(sorted({t.machine_type for t in TYPES if t.family == "a2"}))


@dataclasses.dataclass(frozen=True)
class ZoneSpec:
    """What one fake zone has: machine type names and accelerator type -> maximum cards per instance."""

    machine_types: tuple[str, ...]
    accelerators: Mapping[str, int]


def _gpus(*names: str) -> dict[str, int]:
    return {n: ALL_GPUS[n] for n in names}


DEFAULT_ZONES: dict[str, ZoneSpec] = {
    "us-central1-a": ZoneSpec(_N1 + _G2 + _A2 + ("a3-highgpu-8g",), dict(ALL_GPUS)),
    "us-central1-b": ZoneSpec(_N1 + _G2 + _A2, _gpus("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4",
                                                     "nvidia-tesla-a100")),
    "us-central1-c": ZoneSpec(_N1 + _G2 + _A2 + ("a3-highgpu-8g",), dict(ALL_GPUS)),
    "us-central1-f": ZoneSpec(_N1 + _A2, _gpus("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-a100")),
    "us-east1-c": ZoneSpec(_N1 + _G2, _gpus("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4")),
    "us-west1-b": ZoneSpec(_N1 + _G2 + _A2, _gpus("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4",
                                                  "nvidia-tesla-a100")),
}


class HttpError(Exception):
    """An API error response: status, reason (``errors[].reason``), message."""

    def __init__(self, status: int, reason: str, message: str, domain: str = "global") -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.domain = status, reason, message, domain

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}]}}


@dataclasses.dataclass
class _Rule:
    """An injected HTTP failure for the next ``remaining`` matching requests (None: until cleared)."""

    error: HttpError
    remaining: int | None
    method: str | None
    path: re.Pattern[str] | None

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (self.path is None or bool(self.path.search(path)))


@dataclasses.dataclass
class _Failure:
    """An injected operation failure for inserts in (zone, machine type, market); None matches any."""

    code: str
    message: str
    http_status: int
    http_message: str
    zone: str | None
    machine_type: str | None
    spot_only: bool
    as_http: HttpError | None = None

    def matches(self, zone: str, machine_type: str, spot: bool) -> bool:
        return (self.zone in (None, zone) and self.machine_type in (None, machine_type)
                and (spot or not self.spot_only))


def _machine_json(project: str, zone: str, name: str) -> dict[str, Any]:
    entry = next((t for t in TYPES if t.machine_type == name), None)
    if entry is not None:
        cpus, memory_mb = entry.vcpus, int(entry.memory_gib * 1024)
    else:
        cpus, memory_mb = PLAIN_TYPES[name]
    item: dict[str, Any] = {
        "kind": "compute#machineType", "id": str(abs(hash(name)) % 10**12), "name": name,
        "description": f"{cpus} vCPUs, {memory_mb / 1024:g} GB RAM", "guestCpus": cpus, "memoryMb": memory_mb,
        "maximumPersistentDisks": 128, "maximumPersistentDisksSizeGb": "263168", "zone": zone,
        "selfLink": f"{API}/projects/{project}/zones/{zone}/machineTypes/{name}", "isSharedCpu": False,
    }
    if entry is not None and not entry.attached:
        item["accelerators"] = [{"guestAcceleratorType": entry.accelerator_type, "guestAcceleratorCount": entry.gpus}]
    return item


class FakeCompute:
    """The fake Compute API. ``start()`` / ``stop()`` or use as a context manager; ``endpoint`` once started."""

    def __init__(
        self,
        *,
        project: str = DEFAULT_PROJECT,
        zones: Mapping[str, ZoneSpec] | None = None,
        clock: Callable[[], float] = time.time,
        delete_delay_s: float = 0.0,
    ) -> None:
        self.project = project
        self.zones = dict(zones if zones is not None else DEFAULT_ZONES)
        self.clock = clock
        self.delete_delay_s = delete_delay_s
        self.endpoint = ""
        self.calls: list[tuple[str, str]] = []
        # (method, path, query) of every request, e.g. to read an insert's requestId.
        self.queries: list[tuple[str, str, dict[str, str]]] = []
        self.on_preempt: list[Callable[[str, dict[str, Any]], None]] = []
        self._lock = threading.RLock()
        self._instances: dict[tuple[str, str], dict[str, Any]] = {}
        self._operations: dict[tuple[str, str], dict[str, Any]] = {}
        self._requests: dict[str, tuple[str, str]] = {}
        # (zone, name) -> when it disappears, and the operation that finishes then.
        self._deletions: dict[tuple[str, str], tuple[float, str | None]] = {}
        self._on_done: dict[tuple[str, str], Callable[[], None]] = {}
        self._rules: list[_Rule] = []
        self._failures: list[_Failure] = []
        self._ids = itertools.count(1000)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> FakeCompute:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-compute", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeCompute:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment for a process whose provider should use this fake (``make_provider``)."""
        return {"SPOTRAIN_GCP_ENDPOINT": self.endpoint, "SPOTRAIN_GCP_PROJECT": self.project,
                "SPOTRAIN_GCP_ZONES": ",".join(self.zones)}

    def reset(self) -> None:
        """Forget every instance, operation and injected failure."""
        with self._lock:
            for table in (self._instances, self._operations, self._requests, self._deletions, self._on_done):
                table.clear()
            self._rules.clear()
            self._failures.clear()
            self.calls.clear()
            self.queries.clear()

    # -- knobs ---------------------------------------------------------------------------------
    def stockout(self, zone: str | None = None, machine_type: str | None = None, *, spot_only: bool = False,
                 with_details: bool = False) -> None:
        """Inserts in ``zone`` (None: every zone) of ``machine_type`` (None: every type) end with a
        ZONE_RESOURCE_POOL_EXHAUSTED operation error until ``clear_stockouts``."""
        code = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" if with_details else "ZONE_RESOURCE_POOL_EXHAUSTED"
        where = f"projects/{self.project}/zones/{zone or '-'}"
        message = (f"The zone '{where}' does not have enough resources available to fulfill the request.  "
                   f"Try a different zone, or try again later.")
        with self._lock:
            self._failures.append(_Failure(code, message, 503, "SERVICE UNAVAILABLE", zone, machine_type, spot_only))

    def clear_stockouts(self) -> None:
        with self._lock:
            self._failures = [f for f in self._failures if not f.code.startswith("ZONE_RESOURCE_POOL")]

    def quota(self, zone: str | None = None, machine_type: str | None = None, *, metric: str = "GPUS_ALL_REGIONS",
              http: bool = False) -> None:
        """Inserts end with QUOTA_EXCEEDED (an operation error; ``http=True``: a synchronous 403
        ``quotaExceeded``) until ``clear_quota``."""
        region = zone.rsplit("-", 1)[0] if zone else "us-central1"
        message = f"Quota '{metric}' exceeded.  Limit: 0.0 in region {region}."
        as_http = HttpError(403, "quotaExceeded", message, domain="usageLimits") if http else None
        with self._lock:
            self._failures.append(_Failure("QUOTA_EXCEEDED", message, 403, "FORBIDDEN", zone, machine_type, False,
                                           as_http))

    def clear_quota(self) -> None:
        with self._lock:
            self._failures = [f for f in self._failures if f.code != "QUOTA_EXCEEDED"]

    def fail(self, status: int, reason: str, message: str | None = None, *, times: int | None = 1,
             method: str | None = None, path: str | None = None, domain: str = "global") -> None:
        """The next ``times`` requests (None: all, until ``clear_failures``) matching ``method`` and the
        regex ``path`` get this HTTP error."""
        error = HttpError(status, reason, message or f"fake {reason}", domain)
        with self._lock:
            self._rules.append(_Rule(error, times, method, re.compile(path) if path else None))

    def throttle(self, times: int, *, method: str | None = None, path: str | None = None) -> None:
        """429 rateLimitExceeded for the next ``times`` matching requests."""
        self.fail(429, "rateLimitExceeded", "Rate Limit Exceeded", times=times, method=method, path=path,
                  domain="usageLimits")

    def clear_failures(self) -> None:
        with self._lock:
            self._rules.clear()

    def preempt(self, name: str, *, complete: bool = False) -> float:
        """Begin a preemption of Spot VM ``name``: STOPPING, ``lastStopTimestamp`` now, a preempted
        ``statusMessage``. Returns the notice deadline (now + 30 s). ``complete=True`` also ends it."""
        with self._lock:
            key, inst = self._find(name)
            if inst["scheduling"].get("provisioningModel") != "SPOT" and not inst["scheduling"].get("preemptible"):
                raise ValueError(f"{name} is not a Spot VM")
            now = self.clock()
            inst.update(status="STOPPING", lastStopTimestamp=_stamp(now), statusMessage="Instance was preempted.")
            self._record_system_operation(key, "compute.instances.preempted")
            hooks = list(self.on_preempt)
            snapshot = json.loads(json.dumps(inst))
        for hook in hooks:
            hook(name, snapshot)
        if complete:
            self.complete_preemption(name)
        return now + 30.0

    def complete_preemption(self, name: str) -> bool:
        """End a preemption: the VM is deleted (``instanceTerminationAction=DELETE``) or TERMINATED (STOP).
        False, and nothing done, if the VM is gone already (its owner deleted it during the notice)."""
        self._settle()
        with self._lock:
            found = next(((k, i) for k, i in self._instances.items() if k[1] == name), None)
            if found is None:
                return False
            key, inst = found
            if inst["scheduling"].get("instanceTerminationAction") == "DELETE":
                del self._instances[key]
            else:
                inst["status"] = "TERMINATED"
            return True

    def set_status(self, name: str, status: str) -> None:
        with self._lock:
            self._find(name)[1]["status"] = status

    def instances(self) -> list[dict[str, Any]]:
        self._settle()
        with self._lock:
            return [json.loads(json.dumps(i)) for i in self._instances.values()]

    def instance(self, name: str) -> dict[str, Any] | None:
        return next((i for i in self.instances() if i["name"] == name), None)

    def count(self, method: str, path_regex: str) -> int:
        """How many requests with ``method`` and a path matching ``path_regex`` were served."""
        pattern = re.compile(path_regex)
        with self._lock:
            return sum(1 for m, p in self.calls if m == method and pattern.search(p))

    # -- helpers -------------------------------------------------------------------------------
    def _find(self, name: str) -> tuple[tuple[str, str], dict[str, Any]]:
        for key, inst in self._instances.items():
            if key[1] == name:
                return key, inst
        raise KeyError(f"no instance {name}")

    def _url(self, zone: str, *parts: str) -> str:
        return "/".join([f"{API}/projects/{self.project}/zones/{zone}", *parts])

    def _new_operation(self, zone: str, kind: str, target: str, *, done: bool = False) -> dict[str, Any]:
        now = _stamp(self.clock())
        name = f"operation-{int(self.clock() * 1000)}-{uuid.uuid4().hex[:12]}"
        op = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name,
            "zone": self._url(zone), "operationType": kind, "targetLink": self._url(zone, "instances", target),
            "targetId": str(next(self._ids)), "status": "DONE" if done else "RUNNING", "user": "fake@spotrain.test",
            "progress": 100 if done else 0, "insertTime": now, "startTime": now,
            "selfLink": self._url(zone, "operations", name),
        }
        if done:
            op["endTime"] = now
        self._operations[(zone, name)] = op
        return op

    def _record_system_operation(self, key: tuple[str, str], kind: str) -> None:
        op = self._new_operation(key[0], kind, key[1], done=True)
        op["user"] = "system"

    def _finish(self, zone: str, name: str) -> dict[str, Any]:
        op = self._operations.get((zone, name))
        if op is None:
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/operations/{name}' "
                                             f"was not found")
        if op["status"] != "DONE":
            op.update(status="DONE", progress=100, endTime=_stamp(self.clock()))
            done = self._on_done.pop((zone, name), None)
            if done is not None:
                done()
        return op

    def _settle(self) -> None:
        """Deletions whose time has come: the instance disappears and its operation is DONE."""
        now = self.clock()
        with self._lock:
            for key, (due, op_name) in list(self._deletions.items()):
                if due <= now:
                    del self._deletions[key]
                    self._instances.pop(key, None)
                    if op_name is not None and (key[0], op_name) in self._operations:
                        self._finish(key[0], op_name)

    # -- the API -------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: Mapping[str, list[str]], body: Any) -> tuple[int, Any]:
        with self._lock:
            self.calls.append((method, path))
            self.queries.append((method, path, {k: v[-1] for k, v in query.items()}))
            for rule in self._rules:
                if rule.matches(method, path) and rule.remaining != 0:
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    raise rule.error
        self._settle()
        with self._lock:
            return self._dispatch(method, path, query, body)

    def _dispatch(self, method: str, path: str, query: Mapping[str, list[str]], body: Any) -> tuple[int, Any]:
        q = {k: v[-1] for k, v in query.items()}
        match = re.match(r"^/compute/v1/projects/([^/]+)/(.*)$", path)
        if not match:
            raise HttpError(404, "notFound", f"no such API path {path}")
        project, rest = match.groups()
        if project != self.project:
            raise HttpError(404, "notFound", f"The resource 'projects/{project}' was not found")
        if rest == "aggregated/instances" and method == "GET":
            return 200, self._aggregated(q)
        match = re.match(r"^zones/([^/]+)/(.*)$", rest)
        if not match:
            raise HttpError(404, "notFound", f"no such API path {path}")
        zone, rest = match.groups()
        if zone not in self.zones:
            raise HttpError(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
        routes: list[tuple[str, str, Callable[..., tuple[int, Any]]]] = [
            ("POST", r"instances", lambda: self._insert(zone, q, body)),
            ("GET", r"instances", lambda: (200, self._list(zone, q))),
            ("GET", r"instances/([^/]+)", lambda n: (200, self._get(zone, n))),
            ("DELETE", r"instances/([^/]+)", lambda n: (200, self._delete(zone, n))),
            ("GET", r"operations", lambda: (200, self._operations_list(zone, q))),
            ("GET", r"operations/([^/]+)", lambda n: (200, self._finish(zone, n))),
            ("POST", r"operations/([^/]+)/wait", lambda n: (200, self._finish(zone, n))),
            ("GET", r"machineTypes", lambda: (200, self._machine_types(zone))),
            ("GET", r"acceleratorTypes", lambda: (200, self._accelerator_types(zone))),
        ]
        for verb, pattern, fn in routes:
            m = re.fullmatch(pattern, rest)
            if m and verb == method:
                return fn(*m.groups())
        raise HttpError(404, "notFound", f"no such API path {method} {path}")

    def _get(self, zone: str, name: str) -> dict[str, Any]:
        inst = self._instances.get((zone, name))
        if inst is None:
            raise HttpError(404, "notFound",
                            f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found")
        return inst

    def _list(self, zone: str, q: Mapping[str, str]) -> dict[str, Any]:
        keep = _parse_filter(q.get("filter", ""))
        items = [i for (z, _), i in sorted(self._instances.items()) if z == zone and keep(i)]
        out: dict[str, Any] = {"kind": "compute#instanceList", "id": f"projects/{self.project}/zones/{zone}/instances",
                               "items": items, "selfLink": self._url(zone, "instances")}
        return out

    def _aggregated(self, q: Mapping[str, str]) -> dict[str, Any]:
        keep = _parse_filter(q.get("filter", ""))
        items: dict[str, Any] = {}
        for zone in self.zones:
            found = [i for (z, _), i in sorted(self._instances.items()) if z == zone and keep(i)]
            if found:
                items[f"zones/{zone}"] = {"instances": found}
            else:
                items[f"zones/{zone}"] = {"warning": {
                    "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope 'zones/" + zone + "' on this page.",
                    "data": [{"key": "scope", "value": f"zones/{zone}"}]}}
        return {"kind": "compute#instanceAggregatedList", "id": f"projects/{self.project}/aggregated/instances",
                "items": items, "selfLink": f"{API}/projects/{self.project}/aggregated/instances"}

    def _operations_list(self, zone: str, q: Mapping[str, str]) -> dict[str, Any]:
        """The zone's operations, kept after their targets are gone (the fake never expires them)."""
        keep = _parse_filter(q.get("filter", ""))
        items = [op for (z, _), op in sorted(self._operations.items()) if z == zone and keep(op)]
        return {"kind": "compute#operationList", "id": f"projects/{self.project}/zones/{zone}/operations",
                "items": items, "selfLink": self._url(zone, "operations")}

    def _machine_types(self, zone: str) -> dict[str, Any]:
        names = sorted(set(self.zones[zone].machine_types) | set(PLAIN_TYPES))
        return {"kind": "compute#machineTypeList", "items": [_machine_json(self.project, zone, n) for n in names],
                "selfLink": self._url(zone, "machineTypes")}

    def _accelerator_types(self, zone: str) -> dict[str, Any]:
        items = [{"kind": "compute#acceleratorType", "id": str(abs(hash(n)) % 10**12), "name": n,
                  "description": n.replace("nvidia-", "NVIDIA ").replace("tesla-", "Tesla "),
                  "maximumCardsPerInstance": cards, "zone": self._url(zone),
                  "selfLink": self._url(zone, "acceleratorTypes", n)}
                 for n, cards in sorted(self.zones[zone].accelerators.items())]
        return {"kind": "compute#acceleratorTypeList", "items": items, "selfLink": self._url(zone, "acceleratorTypes")}

    def _delete(self, zone: str, name: str) -> dict[str, Any]:
        inst = self._get(zone, name)
        if (zone, name) in self._deletions:
            op_name = self._deletions[(zone, name)][1]
            if op_name is not None:
                return self._operations[(zone, op_name)]
        inst["status"] = "STOPPING"
        op = self._new_operation(zone, "delete", name)
        self._deletions[(zone, name)] = (self.clock() + self.delete_delay_s, op["name"])
        return op

    def _insert(self, zone: str, q: Mapping[str, str], body: Any) -> tuple[int, Any]:
        rid = q.get("requestId")
        if rid is not None and not _UUID.match(rid):
            raise HttpError(400, "invalid", f"Invalid value for field 'requestId': '{rid}'. Must be a valid UUID.")
        if rid is not None and rid in self._requests:
            return 200, self._operations[self._requests[rid]]
        inst, spot = self._validate(zone, body)
        name = inst["name"]
        machine_type = inst["machineType"].rsplit("/", 1)[-1]
        failure = next((f for f in self._failures if f.matches(zone, machine_type, spot)), None)
        if failure is not None and failure.as_http is not None:
            raise failure.as_http
        if (zone, name) in self._instances:
            raise HttpError(409, "alreadyExists",
                            f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists")
        op = self._new_operation(zone, "insert", name)
        if rid is not None:
            self._requests[rid] = (zone, op["name"])
        if failure is not None:
            op.update(status="DONE", progress=100, endTime=op["startTime"],
                      error={"errors": [{"code": failure.code, "message": failure.message}]},
                      httpErrorStatusCode=failure.http_status, httpErrorMessage=failure.http_message)
            return 200, op
        self._instances[(zone, name)] = inst

        def running() -> None:
            if self._instances.get((zone, name)) is inst and inst["status"] == "PROVISIONING":
                inst.update(status="RUNNING", lastStartTimestamp=_stamp(self.clock()))

        self._on_done[(zone, op["name"])] = running
        return 200, op

    def _validate(self, zone: str, body: Any) -> tuple[dict[str, Any], bool]:
        """The instance resource an insert creates, after the checks Compute makes (400 otherwise)."""
        if not isinstance(body, dict):
            raise HttpError(400, "parseError", "Parse Error")
        name = str(body.get("name", ""))
        if not _NAME.match(name):
            raise HttpError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'. Must be a match of "
                                            f"regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'")
        machine_type = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        spec = self.zones[zone]
        if machine_type not in spec.machine_types and machine_type not in PLAIN_TYPES:
            raise HttpError(400, "invalid", f"Invalid value for field 'resource.machineType': '{machine_type}'. "
                                            f"Machine type with name '{machine_type}' does not exist in zone '{zone}'.")
        labels = body.get("labels") or {}
        if len(labels) > 64 or not all(_LABEL_KEY.match(k) and _LABEL_VALUE.match(str(v)) for k, v in labels.items()):
            raise HttpError(400, "invalid", "Invalid value for field 'resource.labels': "
                                            f"{json.dumps(labels)[:200]}. Label keys and values must be valid.")
        accelerators = body.get("guestAccelerators") or []
        entry = next((t for t in TYPES if t.machine_type == machine_type and not t.attached), None)
        shown = []
        for a in accelerators:
            kind = str(a.get("acceleratorType", "")).rsplit("/", 1)[-1]
            count = int(a.get("acceleratorCount", 0))
            if kind not in spec.accelerators or count < 1 or count > spec.accelerators[kind]:
                raise HttpError(400, "invalid", f"Invalid value for field 'resource.guestAccelerators[0]"
                                                f".acceleratorType': '{kind}'. Accelerator type '{kind}' with count "
                                                f"{count} is not available in zone '{zone}'.")
            shown.append({"acceleratorType": self._url(zone, "acceleratorTypes", kind), "acceleratorCount": count})
        if entry is not None:
            if accelerators and [(s["acceleratorType"].rsplit("/", 1)[-1], s["acceleratorCount"]) for s in shown] != [
                    (ACCELERATOR_TYPE_OF[entry.accelerator], entry.gpus)]:
                raise HttpError(400, "invalid", f"Machine type {machine_type} comes with its own accelerators")
            shown = [{"acceleratorType": self._url(zone, "acceleratorTypes", entry.accelerator_type),
                      "acceleratorCount": entry.gpus}]
        scheduling = dict(body.get("scheduling") or {})
        spot = scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))
        if shown and scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
            raise HttpError(400, "invalid", "Instances with guest accelerators do not support live migration.")
        if spot and scheduling.get("automaticRestart", True):
            raise HttpError(400, "invalid", "Spot VMs cannot have automatic restart enabled: set automaticRestart "
                                            "to false")
        if spot and scheduling.get("instanceTerminationAction", "STOP") not in ("STOP", "DELETE"):
            raise HttpError(400, "invalid", "Invalid value for field 'resource.scheduling.instanceTerminationAction'")
        disks = body.get("disks") or []
        if not any(d.get("boot") and (d.get("initializeParams") or {}).get("sourceImage") for d in disks):
            raise HttpError(400, "invalid", "Invalid value for field 'resource.disks': a boot disk with a source "
                                            "image is required")
        items = (body.get("metadata") or {}).get("items") or []
        if len({i.get("key") for i in items}) != len(items):
            raise HttpError(400, "invalid", "Invalid value for field 'resource.metadata': duplicate keys")
        now = _stamp(self.clock())
        nics = []
        for n, nic in enumerate(body.get("networkInterfaces") or [{}]):
            nics.append({"kind": "compute#networkInterface", "name": f"nic{n}",
                         "network": f"{API}/projects/{self.project}/{nic.get('network', 'global/networks/default')}",
                         "networkIP": f"10.128.{next(self._ids) % 250}.{next(self._ids) % 250 + 2}",
                         "accessConfigs": [dict(a, natIP="34.0.0.1", kind="compute#accessConfig")
                                           for a in nic.get("accessConfigs") or []]})
        instance = dict(body)
        instance.update(
            kind="compute#instance", id=str(next(self._ids)), creationTimestamp=now, status="PROVISIONING",
            zone=self._url(zone), machineType=self._url(zone, "machineTypes", machine_type), labels=dict(labels),
            labelFingerprint=uuid.uuid4().hex[:12], guestAccelerators=shown, networkInterfaces=nics,
            scheduling=dict({"onHostMaintenance": "MIGRATE", "automaticRestart": True, "preemptible": False,
                             "provisioningModel": "STANDARD"}, **scheduling),
            metadata={"kind": "compute#metadata", "fingerprint": uuid.uuid4().hex[:12], "items": items},
            selfLink=self._url(zone, "instances", name), cpuPlatform="Intel Cascade Lake",
            startRestricted=False, deletionProtection=False,
        )
        return instance, spot


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def _parse_filter(text: str) -> Callable[[dict[str, Any]], bool]:
    """The subset of Compute's list filter the provider uses: clauses ``(labels.k = "v")``, ``name``,
    ``status``, ``operationType``, ``targetLink``, joined by AND. Anything else is a 400, so a provider
    bug is not silently matched."""
    text = text.strip()
    if not text:
        return lambda inst: True
    checks: list[tuple[str, str]] = []
    for clause in re.split(r"\s+AND\s+", text):
        m = _CLAUSE.match(clause.strip())
        if not m:
            raise HttpError(400, "invalid", f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.")
        checks.append((m.group(1), m.group(3)))

    def keep(inst: dict[str, Any]) -> bool:
        for field, want in checks:
            have = inst.get("labels", {}).get(field[7:]) if field.startswith("labels.") else inst.get(field)
            if have is None or str(have) != want:
                return False
        return True

    return keep


class _Handler(BaseHTTPRequestHandler):
    owner: FakeCompute
    protocol_version = "HTTP/1.1"
    # Headers and body in one write: separate small writes meet the client's delayed ACK (40 ms a call).
    wbufsize = 1 << 16

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            status, payload = 400, HttpError(400, "parseError", "Parse Error").body()
        else:
            try:
                status, payload = self.owner.handle(method, parts.path, parse_qs(parts.query), body)
            except HttpError as exc:
                status, payload = exc.status, exc.body()
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")


def start(**kwargs: Any) -> FakeCompute:
    """A started fake (``stop()`` it when done)."""
    return FakeCompute(**kwargs).start()


__all__ = ["DEFAULT_ZONES", "FakeCompute", "HttpError", "ZoneSpec", "start"]
