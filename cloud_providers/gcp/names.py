"""What a launch decision is called on Compute: the instance name and the insert ``requestId``.

Both are derived from the decision, so a replayed decision finds (by name) or is answered with (by
``requestId``) what the first attempt made; see ``provider.py``. The name also carries a mark of the
controller: Compute forgets a deleted VM entirely, labels included, and a preemption that deleted one
while no controller watched leaves only an operation naming it (``compute.instances.preempted``), so
the name alone must say whose it was (``named_for``).
"""

from __future__ import annotations

import hashlib
import re
import uuid

# Namespace of the insert requestIds derived from decision ids (uuid5).
REQUEST_ID_NAMESPACE = uuid.UUID("5b0f8a36-2f4e-4c3e-9a59-2b1d9b0e6c11")
_NAME_CHARS = re.compile(r"[^a-z0-9-]+")
_NAMED = re.compile(r"sp-(?:[a-z0-9-]+-)?([0-9a-f]{8})-[0-9a-f]{16}")


def request_id(decision_id: str) -> str:
    """The insert ``requestId`` for a decision: a UUID (Compute requires one), the same every time."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, decision_id))


def controller_mark(controller_id: str) -> str:
    """The 8 hex digits that stand for a controller in its instances' names."""
    return hashlib.sha256(controller_id.encode()).hexdigest()[:8]


def instance_name(decision_id: str, job: str | None = None, *, controller_id: str) -> str:
    """A valid, unique instance name for a decision: ``sp-<job>-<controller mark>-<hash of the decision>``
    (``[a-z]([-a-z0-9]{0,61}[a-z0-9])``, at most 59 characters)."""
    digest = hashlib.sha256(decision_id.encode()).hexdigest()[:16]
    slug = _NAME_CHARS.sub("-", (job or "").lower()).strip("-")[:30].strip("-")
    tail = f"{controller_mark(controller_id)}-{digest}"
    return f"sp-{slug}-{tail}" if slug else f"sp-{tail}"


def named_for(name: str, controller_id: str) -> bool:
    """Whether ``name`` is an ``instance_name`` of this controller's."""
    match = _NAMED.fullmatch(name)
    return match is not None and match.group(1) == controller_mark(controller_id)


__all__ = ["controller_mark", "instance_name", "named_for", "request_id"]
