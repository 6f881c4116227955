"""Pure conversion of Compute Engine ``Instance`` resources into ``base.Instance``.

State mapping (Compute status -> ours): PROVISIONING, STAGING, REPAIRING -> PENDING; RUNNING ->
RUNNING; STOPPING -> NOTICE for a Spot VM we did not delete (the preemption has begun: Compute sends
the guest an ACPI soft-off and stops it ``NOTICE_SECONDS["gcp"]`` = 30 s later), else TERMINATED;
STOPPED, SUSPENDING, SUSPENDED, TERMINATED -> TERMINATED.

Preemptions: spotrain never stops its instances, it only deletes them, so a Spot VM that is stopping
or stopped although we did not delete it was taken back by Compute (``interruption = "preemption"``).
The notice deadline is ``lastStopTimestamp`` + 30 s; a ``statusMessage`` mentioning a preemption
(as the loopback fake and Compute's own messages word it) confirms it. A Spot VM launched with
``instanceTerminationAction=DELETE`` then disappears; ``provider.py`` reports that from what it saw.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..base import ON_DEMAND, SPOT, Instance, InstanceState, offering_key
from ..catalog import NOTICE_SECONDS
from .catalog import ACCELERATOR_TYPES, GcpType, find_type, region_of
from .labels import decode_labels

INTERRUPTION_PREEMPTION = "preemption"
NOTICE_S = NOTICE_SECONDS["gcp"]
SPOT_MODEL = "SPOT"

_PENDING = frozenset({"PROVISIONING", "STAGING", "REPAIRING", "PENDING"})
_STOPPED = frozenset({"STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"})


def last_segment(url: str) -> str:
    """``.../zones/us-central1-a/machineTypes/n1-standard-8`` -> ``n1-standard-8``."""
    return str(url).rstrip("/").rsplit("/", 1)[-1]


def parse_time(text: str | None) -> float | None:
    """RFC 3339 as Compute writes it (``2024-05-01T10:00:00.123-07:00``) -> Unix seconds."""
    if not text:
        return None
    try:
        stamp = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def catalog_entry(record: Any) -> GcpType | None:
    """The catalog entry an instance was launched as: its machine type and attached GPUs."""
    machine = last_segment(record.machine_type)
    accels = [(last_segment(a.accelerator_type), int(a.accelerator_count)) for a in record.guest_accelerators]
    if len(accels) == 1 and accels[0][0] in ACCELERATOR_TYPES:
        name, count = accels[0]
        return find_type(machine, ACCELERATOR_TYPES[name], count)
    found = find_type(machine)
    return found if found is not None and not found.attached else None


def is_spot(record: Any) -> bool:
    scheduling = record.scheduling
    return str(scheduling.provisioning_model) == SPOT_MODEL or bool(scheduling.preemptible)


def to_instance(record: Any, *, now_s: float, deleted_at_s: float | None = None,
                ended_at_s: float | None = None) -> Instance:
    """``deleted_at_s``: when this provider asked to delete it (then it is ours to end, not a
    preemption). ``ended_at_s``: when this provider first saw it end (kept so billing stops moving)."""
    tags = decode_labels(dict(record.labels))
    status = str(record.status)
    spot = is_spot(record)
    # The provisioning model is the truth; the market tag only says what was asked for.
    market = SPOT if spot else ON_DEMAND
    zone = last_segment(record.zone)
    launched_at_s = parse_time(record.creation_timestamp) or now_s
    stopped_at_s = parse_time(record.last_stop_timestamp)
    marked = "preempt" in str(record.status_message).lower()

    interruption: str | None = None
    deadline: float | None = None
    if status in _PENDING:
        state = InstanceState.PENDING
    elif status == "RUNNING":
        state = InstanceState.RUNNING
    elif deleted_at_s is None and spot and status == "STOPPING":
        state = InstanceState.NOTICE
        interruption = INTERRUPTION_PREEMPTION
        deadline = (stopped_at_s or now_s) + NOTICE_S
    else:
        state = InstanceState.TERMINATED
        if spot and (marked or deleted_at_s is None):
            interruption = INTERRUPTION_PREEMPTION

    ended: float | None = None
    if state is InstanceState.TERMINATED:
        stop_end = min(stopped_at_s + NOTICE_S, now_s) if stopped_at_s is not None else None
        ended = ended_at_s or deleted_at_s or stop_end or now_s
        ended = max(ended, launched_at_s)

    entry = catalog_entry(record)
    key = offering_key("gcp", zone, entry.machine_type, entry.accelerator, entry.gpus) if entry else ""
    interfaces = list(record.network_interfaces)
    address = str(interfaces[0].network_i_p) if interfaces and interfaces[0].network_i_p else None
    return Instance(
        instance_id=str(record.name),
        cloud="gcp",
        region=region_of(zone) if zone else "",
        zone=zone,
        instance_type=last_segment(record.machine_type),
        market=market,
        state=state,
        tags=tags,
        launched_at_s=launched_at_s,
        terminated_at_s=ended,
        interruption=interruption,
        notice_deadline_s=deadline,
        offering_key=key,
        address=address,
    )
