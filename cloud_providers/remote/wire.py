"""The agent <-> controller wire format (JSON over HTTP), shared by both ends.

``GET  /v1/agent/assignment[?instance_id=I]`` -> :class:`Assignment` as JSON; 404 while the controller
has not recorded the agent's instance yet (retry), 410 once the instance is terminated for good (the
agent kills its workers and exits).

``POST /v1/agent/report`` with a :class:`Report` body -> the current assignment (same as the GET).

``POST /v1/agent/output`` with an :class:`OutputChunk` body -> ``{"next_offset": N}``: the bytes of one
rank's log from an offset, appended to the controller's copy (``spotrain logs -f`` reads it there);
``next_offset`` is the size of that copy, where the agent sends from next (a chunk it already has is
not appended twice).

Every request is signed with the agent's credential, ``<decision_id>:<mac>`` (the MAC binds the
launch decision to the fleet's agent key), which itself never travels: ``Authorization: Spotrain-Agent
<decision_id> <seq> <signature>`` and ``X-Spotrain-Content-SHA256: <sha256 of the body, or of the raw
query string for the GET>``, where the signature is an HMAC, keyed with the credential, of the method,
path, decision, ``seq`` and that hash (``request_signature``). ``seq`` is the agent's request counter:
it only grows (``agent.py`` keeps it across agent restarts) and the controller takes each value once,
so a captured request replayed later is refused with 409 (its ``X-Spotrain-Last-Seq`` header says the
highest value taken, from which an agent that lost its counter carries on). The controller finds the
instance by the decision it launched it for, so an agent can only ever read or write its own
instance's assignment and reports.

States an agent reports: ``idle`` (no workers), ``setup`` (the job's setup runs), ``running``,
``exited`` (every local rank has exited; ``exit_codes`` complete) and ``stopped`` (the workers were
killed: on the controller's stop order, or they were lost when the agent restarted).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ..errors import ProviderError
from ..launch import CONTROLLER_ONLY_FIELDS, WorkerLaunch

ASSIGNMENT_PATH = "/v1/agent/assignment"
REPORT_PATH = "/v1/agent/report"
OUTPUT_PATH = "/v1/agent/output"
# The most bytes of log one output chunk carries.
MAX_OUTPUT_CHUNK = 64 * 1024
# The one method of each path (the signature covers it; the controller checks it before the body).
METHODS = {ASSIGNMENT_PATH: "GET", REPORT_PATH: "POST", OUTPUT_PATH: "POST"}
AUTH_SCHEME = "Spotrain-Agent"
CONTENT_SHA256_HEADER = "X-Spotrain-Content-SHA256"
LAST_SEQ_HEADER = "X-Spotrain-Last-Seq"
MAX_SEQ = 2**63 - 1
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_SEQ = re.compile(r"^[0-9]{1,19}\Z")
_DECISION = re.compile(r"^[A-Za-z0-9_.-]{1,80}\Z")

STATE_IDLE = "idle"
STATE_SETUP = "setup"
STATE_RUNNING = "running"
STATE_EXITED = "exited"
STATE_STOPPED = "stopped"
STATES = (STATE_IDLE, STATE_SETUP, STATE_RUNNING, STATE_EXITED, STATE_STOPPED)


class WireError(ProviderError, ValueError):
    """A message that does not follow the wire format (one line naming the field)."""


def _int(d: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{key}: expected an integer, got {value!r}")
    return value


def _str(d: Mapping[str, Any], key: str, *, optional: bool = False) -> str | None:
    value = d.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise WireError(f"{key}: expected a string, got {value!r}")
    return value


def launch_to_json(launch: WorkerLaunch) -> dict[str, Any]:
    """The launch as an assignment carries it: without the fields that are the controller's own."""
    return launch.model_dump(mode="json", exclude=set(CONTROLLER_ONLY_FIELDS))


def launch_from_json(d: Any) -> WorkerLaunch:
    """An assignment's launch, validated (``WireError`` naming the first bad field)."""
    if not isinstance(d, dict):
        raise WireError(f"launch: expected an object, got {type(d).__name__}")
    try:
        return WorkerLaunch.model_validate({k: v for k, v in d.items() if k not in CONTROLLER_ONLY_FIELDS})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ("launch", *first["loc"]))
        got = f", got {first.get('input')!r:.200}" if first["loc"] else ""
        raise WireError(f"{where}: {first['msg']}{got}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Assignment:
    """What the controller wants of an instance now.

    ``launch``: the latest attempt assigned to it (None before the first). ``notice``: the directive for
    that attempt (preemption, rescale, cancel), written to the workers' notice file. ``stop_attempt``:
    workers of attempts up to this one must be killed.
    """

    instance_id: str
    launch: WorkerLaunch | None = None
    notice: Mapping[str, Any] | None = None
    stop_attempt: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "launch": launch_to_json(self.launch) if self.launch else None,
            "notice": dict(self.notice) if self.notice is not None else None,
            "stop_attempt": self.stop_attempt,
        }

    @classmethod
    def from_json(cls, d: Any) -> Assignment:
        if not isinstance(d, dict):
            raise WireError("assignment: expected an object")
        notice = d.get("notice")
        if notice is not None and not isinstance(notice, dict):
            raise WireError("notice: expected an object")
        launch = d.get("launch")
        return cls(
            instance_id=str(_str(d, "instance_id")),
            launch=launch_from_json(launch) if launch is not None else None,
            notice=notice,
            stop_attempt=_int(d, "stop_attempt", 0),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report:
    """What an agent tells the controller, every second and at each change."""

    attempt: int
    state: str
    exit_codes: Mapping[int, int] = dataclasses.field(default_factory=dict)
    progress: Mapping[str, Any] | None = None
    # The cloud's own notice as the agent saw it (reason, source, deadline_unix_s), once seen.
    notice: Mapping[str, Any] | None = None
    instance_id: str | None = None
    address: str | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise WireError(f"state: {self.state!r} is not one of {', '.join(STATES)}")
        if self.attempt < 0:
            raise WireError(f"attempt: must be >= 0, got {self.attempt}")

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "state": self.state,
            "exit_codes": {str(k): v for k, v in self.exit_codes.items()},
            "progress": dict(self.progress) if self.progress is not None else None,
            "notice": dict(self.notice) if self.notice is not None else None,
            "instance_id": self.instance_id,
            "address": self.address,
        }

    @classmethod
    def from_json(cls, d: Any) -> Report:
        if not isinstance(d, dict):
            raise WireError("report: expected an object")
        codes = d.get("exit_codes") or {}
        if not isinstance(codes, dict):
            raise WireError("exit_codes: expected an object of rank -> code")
        try:
            exit_codes = {int(k): int(v) for k, v in codes.items()}
        except (TypeError, ValueError):
            raise WireError(f"exit_codes: expected integer ranks and codes, got {codes!r}") from None
        progress, notice = d.get("progress"), d.get("notice")
        if progress is not None and not isinstance(progress, dict):
            raise WireError("progress: expected an object")
        if notice is not None and not isinstance(notice, dict):
            raise WireError("notice: expected an object")
        return cls(
            attempt=_int(d, "attempt"), state=str(_str(d, "state")), exit_codes=exit_codes, progress=progress,
            notice=notice, instance_id=_str(d, "instance_id", optional=True),
            address=_str(d, "address", optional=True),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputChunk:
    """Bytes ``offset`` .. ``offset + len(data)`` of the log of ``rank`` in gang ``attempt``."""

    attempt: int
    rank: int
    offset: int
    data: bytes

    def __post_init__(self) -> None:
        if self.attempt < 1 or self.rank < 0 or self.offset < 0:
            raise WireError("output: attempt must be >= 1, rank and offset >= 0")
        if len(self.data) > MAX_OUTPUT_CHUNK:
            raise WireError(f"output.data: at most {MAX_OUTPUT_CHUNK} bytes a chunk")

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "rank": self.rank, "offset": self.offset,
                "data": base64.b64encode(self.data).decode("ascii")}

    @classmethod
    def from_json(cls, d: Any) -> OutputChunk:
        if not isinstance(d, dict):
            raise WireError("output: expected an object")
        text = _str(d, "data")
        if text is None or len(text) > 2 * MAX_OUTPUT_CHUNK:
            raise WireError(f"output.data: at most {MAX_OUTPUT_CHUNK} bytes a chunk")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise WireError("output.data: expected base64") from None
        return cls(attempt=_int(d, "attempt"), rank=_int(d, "rank"), offset=_int(d, "offset"), data=data)


# ----- signed requests ------------------------------------------------------------------------------
def request_signature(credential: str, *, method: str, path: str, seq: int, content_sha256: str) -> str:
    """The HMAC-SHA256, keyed with an agent's credential, of one request (see the module doc)."""
    decision_id, _, key = credential.rpartition(":")
    message = f"spotrain-agent-request/1\n{method}\n{path}\n{decision_id}\n{seq}\n{content_sha256}"
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


def signed_headers(credential: str, *, method: str, path: str, seq: int, content: bytes) -> dict[str, str]:
    """The headers that sign one request: ``content`` is its body (POST) or raw query string (GET)."""
    digest = hashlib.sha256(content).hexdigest()
    decision_id = credential.rpartition(":")[0]
    signature = request_signature(credential, method=method, path=path, seq=seq, content_sha256=digest)
    return {"Authorization": f"{AUTH_SCHEME} {decision_id} {seq} {signature}", CONTENT_SHA256_HEADER: digest}


@dataclasses.dataclass(frozen=True)
class SignedRequest:
    """What a signed request's headers claim (checked by the controller: ``autoscaler/remote/auth.py``)."""

    path: str
    decision_id: str
    seq: int
    signature: str
    content_sha256: str


def parse_signed(path: str, authorization: str, content_sha256: str) -> SignedRequest | None:
    """The claims of a request's signing headers, or None when they are missing or malformed."""
    parts = authorization.split(" ")
    if len(parts) != 4 or parts[0] != AUTH_SCHEME:
        return None
    _, decision_id, seq, signature = parts
    if (not _DECISION.match(decision_id) or not _SEQ.match(seq) or not _HEX64.match(signature)
            or not _HEX64.match(content_sha256)):
        return None
    if int(seq) > MAX_SEQ:
        return None
    return SignedRequest(path, decision_id, int(seq), signature, content_sha256)
