"""The one client of the clouds' spot notices: AWS IMDSv2 and the GCE metadata server, without the I/O.

Two sides read these documents on an instance: the workers (``runtime/notices.py``, so that every rank
stops at one step boundary) and the agent (``cloud_providers/remote/metadata.py``, which relays the
notice to the controller and the workers' notice file). The dependency rule (runtime imports only
cost_models, cloud_providers imports nothing of ours) kept two clients apart, and they drifted (a 401,
a garbled answer and the GCE answer's ``Metadata-Flavor`` were handled differently). Here is all of
the protocol once, against an injected :class:`Transport` of a dozen lines that does the one HTTP
request (the runtime's is urllib), so this module does no I/O itself and reads the clock only through
the ``clock`` it is given. The transport's contract is structural (a method returning a plain tuple,
and one making the caller's error), so a side can provide one without importing anything from here.
The agent still has its own client: ``cloud_providers`` may not import ``cost_models`` (see
``tests/test_layout.py``); moving it onto this one waits on that rule.

AWS (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html): IMDSv2, a session
token from ``PUT /latest/api/token`` (TTL ``IMDS_TOKEN_TTL_S``, renewed at half of it, dropped when a
GET answers 401), then ``spot/instance-action`` (``{"action", "time"}``, ``time`` in ISO 8601 UTC: the
stop deadline) and, for the workers, ``events/recommendations/rebalance`` (a checkpoint-only notice);
``instance-id`` and ``local-ipv4`` name the instance. 404 means "no such document (yet)".

GCE (https://cloud.google.com/compute/docs/instances/spot#preemption-process): ``instance/preempted``
turns ``TRUE`` about ``GCE_NOTICE_S`` before a Spot VM goes; the deadline is when it was seen plus that.
With ``wait_for_change`` each read after the first is the server's long-poll
(``?wait_for_change=true&last_etag=<etag>&timeout_sec=N``,
https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange), so a notice is seen
when given and ``last_etag`` closes the gap between two reads. Requests carry ``Metadata-Flavor:
Google`` and an answer without it is refused, as google-auth does: whatever else answers on that name
is not the metadata server. ``name`` and ``network-interfaces/0/ip`` name the instance.

Error policy, one for both sides: no answer (the transport's ``OSError``), a status other than 200 or
404, a 401 (after dropping the token), a body that is not the document, or an impostor all raise
``transport.failure(message)``: the caller's own error type (``cost_models`` defines no exception
class; each boundary keeps its tree), with a message ``"<service> <document>: <detail>"``. Callers
poll again later; a failed read is never a notice.
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

SOURCE_AWS = "aws-imds"
SOURCE_GCE = "gce-metadata"
SOURCES = (SOURCE_AWS, SOURCE_GCE)
# Notice reasons; equal to the worker protocol's NOTICE_PREEMPTION / NOTICE_REBALANCE.
PREEMPTION = "preemption"
REBALANCE = "rebalance"

# Link-local addresses: contacted only where a config names the source.
DEFAULT_AWS_IMDS_ENDPOINT = "http://169.254.169.254"
DEFAULT_GCE_METADATA_ENDPOINT = "http://metadata.google.internal"
IMDS_TOKEN_TTL_S = 21600
GCE_NOTICE_S = 30.0
# How long one GCE long-poll waits for a change before the server answers with the same value. The
# server's limit is much higher; a shorter wait lets a closing watcher end sooner.
GCE_WAIT_S = 20.0
# Allowance over a long-poll's timeout_sec for the server's answer to arrive.
GCE_WAIT_SLACK_S = 5.0
GCE_FLAVOR = "Google"
ISO_UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


# One HTTP answer, whatever its status: (status, body, headers with names in lower case). A plain
# tuple, so that a transport needs nothing from this module.
Answer = tuple[int, str, Mapping[str, str]]


class Transport(Protocol):
    def request(self, method: str, url: str, headers: Mapping[str, str], timeout_s: float) -> Answer:
        """Do one request (no proxy: the services are link-local) and return its answer, 4xx and 5xx
        included; raise ``OSError`` when no answer came (refused, reset, timed out, garbled)."""
        ...

    def failure(self, message: str) -> Exception:
        """The caller's error for "the metadata service cannot be read" (raised by the clients)."""
        ...


@dataclass(frozen=True)
class Notice:
    """A notice: ``stop`` ones (preemption) end the attempt at the next step boundary; a rebalance
    recommendation (``stop=False``) only asks for a checkpoint now. ``action``: IMDS's
    instance-action (``terminate``, ``stop``, ``hibernate``) where the cloud named one."""

    reason: str
    source: str
    deadline_unix_s: float | None = None
    stop: bool = True
    action: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The notice as the agent reports it on the wire (``reason``, ``source``, ``deadline_unix_s``)."""
        out: dict[str, Any] = {"reason": self.reason, "source": self.source, "deadline_unix_s": self.deadline_unix_s}
        if self.action is not None:
            out["action"] = self.action
        return out


def parse_iso_utc(text: str) -> float | None:
    """Seconds since the epoch of an IMDS time (``2026-12-02T08:00:00Z``); None if it is not one."""
    try:
        return float(calendar.timegm(time.strptime(text, ISO_UTC_FORMAT)))
    except (ValueError, TypeError):
        return None


class _Service:
    """One metadata service behind a transport: requests, and failures named ``<service> <what>``."""

    def __init__(self, transport: Transport, endpoint: str, service: str, timeout_s: float) -> None:
        self.transport = transport
        self.endpoint = endpoint.rstrip("/")
        self.service = service
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, *, what: str, headers: Mapping[str, str],
                timeout_s: float | None = None) -> Answer:
        try:
            return self.transport.request(method, f"{self.endpoint}{path}", headers, timeout_s or self.timeout_s)
        except OSError as exc:
            raise self.failure(what, str(exc) or type(exc).__name__) from exc

    def failure(self, what: str, detail: str) -> Exception:
        return self.transport.failure(f"{self.service} {what}: {detail}")


class AwsImds:
    """The spot documents over IMDSv2. :meth:`check` gives the stop notice (instance-action) and, with
    ``rebalance``, the checkpoint-only rebalance recommendation (the agent asks for the former only)."""

    name = SOURCE_AWS

    def __init__(self, transport: Transport, endpoint: str = DEFAULT_AWS_IMDS_ENDPOINT, *, timeout_s: float = 1.0,
                 rebalance: bool = False, clock: Callable[[], float] = time.time) -> None:
        self._service = _Service(transport, endpoint, "IMDS", timeout_s)
        self.rebalance = rebalance
        self._clock = clock
        self._token: str | None = None
        self._token_expiry_unix_s = 0.0

    def _get_token(self) -> str:
        if self._token is None or self._clock() > self._token_expiry_unix_s:
            status, body, _ = self._service.request(
                "PUT", "/latest/api/token", what="token",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)})
            if status != 200 or not body.strip():
                raise self._service.failure("token", f"HTTP {status}")
            self._token = body.strip()
            self._token_expiry_unix_s = self._clock() + IMDS_TOKEN_TTL_S / 2
        return self._token

    def _get(self, path: str) -> str | None:
        """The document's text; None when the service has none (404)."""
        status, body, _ = self._service.request("GET", f"/latest/meta-data/{path}", what=path,
                                                headers={"X-aws-ec2-metadata-token": self._get_token()})
        if status == 401:
            self._token = None  # an expired or revoked session token: get a new one next time
            raise self._service.failure(path, "token rejected")
        if status == 404:
            return None
        if status != 200:
            raise self._service.failure(path, f"HTTP {status}")
        return body

    def _get_object(self, path: str) -> dict[str, Any] | None:
        body = self._get(path)
        if not body or not body.strip():
            return None
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise self._service.failure(path, f"not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise self._service.failure(path, f"not a JSON object: {type(doc).__name__}")
        return doc

    def check(self) -> list[Notice]:
        notices = []
        action = self._get_object("spot/instance-action")
        if action is not None and action.get("action"):
            notices.append(Notice(reason=PREEMPTION, source=self.name, action=str(action["action"]),
                                  deadline_unix_s=parse_iso_utc(str(action.get("time", "")))))
        if self.rebalance:
            recommendation = self._get_object("events/recommendations/rebalance")
            if recommendation is not None and recommendation.get("noticeTime"):
                notices.append(Notice(reason=REBALANCE, source=self.name, stop=False))
        return notices

    def instance_id(self) -> str | None:
        value = self._get("instance-id")
        return value.strip() if value else None

    def address(self) -> str | None:
        value = self._get("local-ipv4")
        return value.strip() if value else None


class GceMetadata:
    """``preempted`` on the GCE metadata server. With ``wait_for_change`` (the agent: one thread per
    source) every :meth:`check` after the first long-polls for up to ``wait_s``; without it (the
    workers' single polling thread) each is a plain read. Once ``TRUE``, the notice sticks and the
    server is not asked again."""

    name = SOURCE_GCE

    def __init__(self, transport: Transport, endpoint: str = DEFAULT_GCE_METADATA_ENDPOINT, *,
                 timeout_s: float = 1.0, wait_for_change: bool = True, wait_s: float = GCE_WAIT_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._service = _Service(transport, endpoint, "GCE metadata", timeout_s)
        self.wait_for_change = wait_for_change
        self.wait_s = wait_s
        self._clock = clock
        self._etag: str | None = None
        self._notice: Notice | None = None

    def _get(self, path: str, *, query: Mapping[str, str] | None = None,
             timeout_s: float | None = None) -> tuple[str | None, str | None]:
        """(the value, stripped, or None when absent; the answer's ETag)."""
        url = f"/computeMetadata/v1/instance/{path}" + (f"?{urlencode(query)}" if query else "")
        status, body, headers = self._service.request("GET", url, what=path, headers={"Metadata-Flavor": GCE_FLAVOR},
                                                      timeout_s=timeout_s)
        if headers.get("metadata-flavor") != GCE_FLAVOR:
            raise self._service.failure(path, f"HTTP {status} without Metadata-Flavor: {GCE_FLAVOR} "
                                              "(not the metadata server)")
        if status == 404:
            return None, None
        if status != 200:
            raise self._service.failure(path, f"HTTP {status}")
        return body.strip(), headers.get("etag")

    def check(self) -> list[Notice]:
        if self._notice is not None:  # preempted does not turn back
            return [self._notice]
        query: dict[str, str] | None = None
        timeout_s: float | None = None
        if self.wait_for_change and self._etag is not None:
            query = {"wait_for_change": "true", "last_etag": self._etag, "timeout_sec": str(int(self.wait_s))}
            timeout_s = self.wait_s + GCE_WAIT_SLACK_S
        value, etag = self._get("preempted", query=query, timeout_s=timeout_s)
        self._etag = etag or self._etag
        if (value or "").upper() != "TRUE":
            return []
        self._notice = Notice(reason=PREEMPTION, source=self.name, deadline_unix_s=self._clock() + GCE_NOTICE_S)
        return [self._notice]

    def instance_id(self) -> str | None:
        return self._get("name")[0]

    def address(self) -> str | None:
        return self._get("network-interfaces/0/ip")[0]
