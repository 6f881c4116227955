"""Pure conversion of EC2 ``describe_instances`` records into ``base.Instance``.

State mapping: pending -> PENDING; running -> RUNNING, or NOTICE once an interruption notice is known;
shutting-down, terminated, stopping, stopped -> TERMINATED (billing of the instance stops at
shutting-down; a stopped one-time spot instance never runs our workers again).

Interruptions: a terminated instance whose state reason is ``Server.SpotInstanceTermination`` was
taken back by EC2 (``interruption = "preemption"``). A notice before that comes from the spot request
status ``marked-for-termination`` (real EC2) or from the ``spotrain-interruption`` tag, whose value is
the notice deadline in Unix seconds (set by the moto test harness, tests/aws/harness.py).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from ..base import ON_DEMAND, SPOT, TAG_MARKET, Instance, InstanceState, offering_key
from ..catalog import find

SPOT_TERMINATION = "Server.SpotInstanceTermination"
INTERRUPTION_PREEMPTION = "preemption"
TAG_INTERRUPTION = "spotrain-interruption"

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
    "stopping": InstanceState.TERMINATED,
    "stopped": InstanceState.TERMINATED,
}
_REASON_TIME = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def tags_of(record: Mapping[str, Any]) -> dict[str, str]:
    return {str(t["Key"]): str(t["Value"]) for t in record.get("Tags", []) or []}


def transition_time_s(record: Mapping[str, Any]) -> float | None:
    """When the instance left ``running``, from ``StateTransitionReason`` ("User initiated (...)")."""
    match = _REASON_TIME.search(str(record.get("StateTransitionReason", "")))
    if not match:
        return None
    stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def to_instance(
    record: Mapping[str, Any],
    *,
    region: str,
    now_s: float,
    notice_deadline_s: float | None = None,
    terminated_at_s: float | None = None,
) -> Instance:
    """``notice_deadline_s``: from the spot request status, if the caller looked it up.
    ``terminated_at_s``: when this provider first saw it terminated (kept so billing stops moving)."""
    tags = tags_of(record)
    aws_state = str(record.get("State", {}).get("Name", "pending"))
    state = _STATES.get(aws_state, InstanceState.PENDING)
    market = SPOT if record.get("InstanceLifecycle") == "spot" else tags.get(TAG_MARKET, ON_DEMAND)
    if market not in (SPOT, ON_DEMAND):
        market = ON_DEMAND
    instance_type = str(record.get("InstanceType", ""))
    zone = str(record.get("Placement", {}).get("AvailabilityZone", ""))
    launch = record.get("LaunchTime")
    launched_at_s = launch.timestamp() if isinstance(launch, dt.datetime) else now_s

    reason_code = str((record.get("StateReason") or {}).get("Code", ""))
    interruption = INTERRUPTION_PREEMPTION if reason_code == SPOT_TERMINATION else None
    deadline = notice_deadline_s if notice_deadline_s is not None else _float(tags.get(TAG_INTERRUPTION))
    if deadline is not None and market == SPOT:
        interruption = INTERRUPTION_PREEMPTION
        if state is InstanceState.RUNNING:
            state = InstanceState.NOTICE
    else:
        deadline = None

    ended: float | None = None
    if state is InstanceState.TERMINATED:
        ended = terminated_at_s or transition_time_s(record) or now_s
        ended = max(ended, launched_at_s)

    info = find("aws", instance_type)
    key = offering_key("aws", zone, instance_type, info.accelerator, info.gpus) if info else ""
    return Instance(
        instance_id=str(record["InstanceId"]),
        cloud="aws",
        region=region,
        zone=zone,
        instance_type=instance_type,
        market=market,
        state=state,
        tags=tags,
        launched_at_s=launched_at_s,
        terminated_at_s=ended,
        interruption=interruption,
        notice_deadline_s=deadline,
        offering_key=key,
        address=str(record["PrivateIpAddress"]) if record.get("PrivateIpAddress") else None,
    )
