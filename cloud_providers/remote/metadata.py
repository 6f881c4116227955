"""The cloud's own word, read on the instance: spot/preemption notices, instance id, private address.

AWS: IMDSv2 (a session token from ``PUT /latest/api/token`` first; launches require it), documents
``spot/instance-action`` (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html),
``instance-id`` and ``local-ipv4``. GCE: ``instance/preempted`` turns ``TRUE`` about 30 s before a Spot
VM goes (https://cloud.google.com/compute/docs/instances/spot#preemption-process); it is watched with
the metadata server's long-poll, ``?wait_for_change=true&last_etag=<etag>&timeout_sec=N``
(https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange), so the notice is
seen the moment it is given rather than at the next poll, and ``last_etag`` closes the gap between
two polls (a change made in between returns at once). Requests carry ``Metadata-Flavor: Google`` and
an answer without it is refused, as google-auth does: whatever else answers on that name is not the
metadata server.

One client for both clouds: :class:`MetadataClient` is the HTTP side (httpx, proxies ignored — the
services are link-local — a short timeout for reads and a longer one for a long-poll, every failure a
:class:`MetadataError`); :class:`AwsImds` and :class:`GceMetadata` are what each cloud's documents mean.

The runtime (``runtime/notices.py``) has its own poller for the same documents; the dependency rule
(cloud_providers imports nothing of ours, runtime imports no cloud_providers) keeps the two apart. The
agent's copy is the one that matters for the controller: what it sees is written to the workers'
notice file *and* reported, so the controller learns of a notice even where the cloud API shows none
yet.
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from ..errors import ProviderError
from .config import NOTICE_SOURCE_AWS, NOTICE_SOURCE_GCE, AgentConfig

NOTICE_PREEMPTION = "preemption"
GCE_NOTICE_S = 30.0
# How long one GCE long-poll waits for a change before the server answers with the same value. The
# server's limit is much higher; a shorter wait lets a closing watcher end sooner.
GCE_WAIT_S = 20.0
GCE_FLAVOR = "Google"


class MetadataError(ProviderError):
    """The metadata service could not be read (unreachable, or an unexpected answer)."""


def _parse_iso_utc(text: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, TypeError):
        return None


class NoticeSource(Protocol):
    name: str

    def check(self) -> dict[str, Any] | None:
        """A stop notice ``{reason, source, deadline_unix_s}`` once the cloud gave one, else None.
        May block for a long-poll (GCE); raises MetadataError when the service cannot be read."""
        ...

    def instance_id(self) -> str | None: ...

    def address(self) -> str | None: ...


class MetadataClient:
    """HTTP to one link-local metadata service (``service`` names it in errors)."""

    def __init__(self, endpoint: str, *, service: str, timeout_s: float = 1.0,
                 headers: Mapping[str, str] | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.service = service
        self.timeout_s = timeout_s
        self._http = httpx.Client(timeout=timeout_s, trust_env=False, headers=dict(headers or {}))

    def request(self, method: str, path: str, *, what: str, headers: Mapping[str, str] | None = None,
                params: Mapping[str, str] | None = None, timeout_s: float | None = None) -> httpx.Response:
        try:
            return self._http.request(method, f"{self.endpoint}{path}", headers=dict(headers or {}),
                                      params=dict(params or {}), timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as exc:
            raise MetadataError(f"{self.service} {what}: {exc or type(exc).__name__}") from exc

    def error(self, what: str, detail: str) -> MetadataError:
        return MetadataError(f"{self.service} {what}: {detail}")


class AwsImds:
    name = NOTICE_SOURCE_AWS
    TOKEN_TTL_S = 21600

    def __init__(self, endpoint: str, *, timeout_s: float = 1.0) -> None:
        self._client = MetadataClient(endpoint, service="IMDS", timeout_s=timeout_s)
        self._token: str | None = None
        self._token_expiry_s = 0.0

    def _get_token(self) -> str:
        if self._token is None or time.time() > self._token_expiry_s:
            resp = self._client.request("PUT", "/latest/api/token", what="token",
                                        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)})
            if resp.status_code != 200:
                raise self._client.error("token", f"HTTP {resp.status_code}")
            self._token = resp.text.strip()
            self._token_expiry_s = time.time() + self.TOKEN_TTL_S / 2
        return self._token

    def _get(self, path: str) -> str | None:
        resp = self._client.request("GET", f"/latest/meta-data/{path}", what=path,
                                    headers={"X-aws-ec2-metadata-token": self._get_token()})
        if resp.status_code == 401:
            self._token = None  # expired session token: get a new one next time
            raise self._client.error(path, "token rejected")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._client.error(path, f"HTTP {resp.status_code}")
        return resp.text

    def check(self) -> dict[str, Any] | None:
        body = self._get("spot/instance-action")
        if not body:
            return None
        try:
            action = json.loads(body)
        except ValueError as exc:
            raise self._client.error("spot/instance-action", f"not JSON: {exc}") from exc
        if not isinstance(action, dict) or not action.get("action"):
            return None
        return {"reason": NOTICE_PREEMPTION, "source": self.name, "action": str(action["action"]),
                "deadline_unix_s": _parse_iso_utc(str(action.get("time", "")))}

    def instance_id(self) -> str | None:
        value = self._get("instance-id")
        return value.strip() if value else None

    def address(self) -> str | None:
        value = self._get("local-ipv4")
        return value.strip() if value else None


class GceMetadata:
    """``wait_for_change``: after the first read, each :meth:`check` long-polls ``preempted`` for up
    to ``wait_s`` (False: plain reads, for a caller that polls)."""

    name = NOTICE_SOURCE_GCE

    def __init__(self, endpoint: str, *, timeout_s: float = 1.0, wait_for_change: bool = True,
                 wait_s: float = GCE_WAIT_S) -> None:
        self._client = MetadataClient(endpoint, service="GCE metadata", timeout_s=timeout_s,
                                      headers={"Metadata-Flavor": GCE_FLAVOR})
        self.wait_for_change = wait_for_change
        self.wait_s = wait_s
        self._etag: str | None = None
        self._notice: dict[str, Any] | None = None

    def _get(self, path: str, *, params: Mapping[str, str] | None = None,
             timeout_s: float | None = None) -> tuple[str | None, str | None]:
        """(value or None when absent, ETag)."""
        resp = self._client.request("GET", f"/computeMetadata/v1/instance/{path}", what=path, params=params,
                                    timeout_s=timeout_s)
        if resp.headers.get("Metadata-Flavor") != GCE_FLAVOR:
            raise self._client.error(path, f"HTTP {resp.status_code} without Metadata-Flavor: Google "
                                           "(not the metadata server)")
        if resp.status_code == 404:
            return None, None
        if resp.status_code != 200:
            raise self._client.error(path, f"HTTP {resp.status_code}")
        return resp.text.strip(), resp.headers.get("ETag")

    def check(self) -> dict[str, Any] | None:
        if self._notice is not None:  # preempted does not turn back
            return dict(self._notice)
        params: dict[str, str] | None = None
        timeout_s: float | None = None
        if self.wait_for_change and self._etag is not None:
            params = {"wait_for_change": "true", "last_etag": self._etag, "timeout_sec": str(int(self.wait_s))}
            timeout_s = self.wait_s + 5.0  # the server answers at timeout_sec; allow for a slow answer
        value, etag = self._get("preempted", params=params, timeout_s=timeout_s)
        self._etag = etag or self._etag
        if (value or "").upper() != "TRUE":
            return None
        self._notice = {"reason": NOTICE_PREEMPTION, "source": self.name,
                        "deadline_unix_s": time.time() + GCE_NOTICE_S}
        return dict(self._notice)

    def instance_id(self) -> str | None:
        return self._get("name")[0]

    def address(self) -> str | None:
        return self._get("network-interfaces/0/ip")[0]


def sources_for(config: AgentConfig) -> list[NoticeSource]:
    """The metadata services the config names (none unless named: they are link-local addresses)."""
    out: list[NoticeSource] = []
    if NOTICE_SOURCE_AWS in config.notice_sources:
        out.append(AwsImds(config.aws_imds_endpoint))
    if NOTICE_SOURCE_GCE in config.notice_sources:
        out.append(GceMetadata(config.gce_metadata_endpoint))
    return out
