"""The cloud's own word, read on the instance: spot/preemption notices, instance id, private address.

AWS: IMDSv2 (a session token from ``PUT /latest/api/token`` first; launches require it), documents
``spot/instance-action`` (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html),
``instance-id`` and ``local-ipv4``. GCE: ``instance/preempted`` turns ``TRUE`` about 30 s before the
machine goes (https://cloud.google.com/compute/docs/instances/create-use-preemptible).

The runtime (``runtime/notices.py``) has its own poller for the same documents; the dependency rule
(cloud_providers imports nothing of ours) keeps the two apart. The agent's copy is the one that matters
for the controller: what it sees is written to the workers' notice file *and* reported, so the
controller learns of a notice even where the cloud API shows none yet.

Metadata servers are link-local: requests ignore proxy settings and time out quickly.
"""

from __future__ import annotations

import calendar
import json
import time
from typing import Any, Protocol

import httpx

from ..errors import ProviderError
from .config import NOTICE_SOURCE_AWS, NOTICE_SOURCE_GCE, AgentConfig

NOTICE_PREEMPTION = "preemption"
GCE_NOTICE_S = 30.0


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
        Raises MetadataError when the service cannot be read."""
        ...

    def instance_id(self) -> str | None: ...

    def address(self) -> str | None: ...


class AwsImds:
    name = NOTICE_SOURCE_AWS
    TOKEN_TTL_S = 21600

    def __init__(self, endpoint: str, *, timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s, trust_env=False)
        self._token: str | None = None
        self._token_expiry_s = 0.0

    def _get_token(self) -> str:
        if self._token is None or time.time() > self._token_expiry_s:
            try:
                resp = self._http.put(f"{self.endpoint}/latest/api/token",
                                      headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)})
            except httpx.HTTPError as exc:
                raise MetadataError(f"IMDS token: {exc}") from exc
            if resp.status_code != 200:
                raise MetadataError(f"IMDS token: HTTP {resp.status_code}")
            self._token = resp.text.strip()
            self._token_expiry_s = time.time() + self.TOKEN_TTL_S / 2
        return self._token

    def _get(self, path: str) -> str | None:
        try:
            resp = self._http.get(f"{self.endpoint}/latest/meta-data/{path}",
                                  headers={"X-aws-ec2-metadata-token": self._get_token()})
        except httpx.HTTPError as exc:
            raise MetadataError(f"IMDS {path}: {exc}") from exc
        if resp.status_code == 401:
            self._token = None  # expired session token: get a new one next time
            raise MetadataError(f"IMDS {path}: token rejected")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise MetadataError(f"IMDS {path}: HTTP {resp.status_code}")
        return resp.text

    def check(self) -> dict[str, Any] | None:
        body = self._get("spot/instance-action")
        if not body:
            return None
        try:
            action = json.loads(body)
        except ValueError as exc:
            raise MetadataError(f"IMDS spot/instance-action is not JSON: {exc}") from exc
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
    name = NOTICE_SOURCE_GCE

    def __init__(self, endpoint: str, *, timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s, trust_env=False)

    def _get(self, path: str) -> str | None:
        try:
            resp = self._http.get(f"{self.endpoint}/computeMetadata/v1/instance/{path}",
                                  headers={"Metadata-Flavor": "Google"})
        except httpx.HTTPError as exc:
            raise MetadataError(f"GCE metadata {path}: {exc}") from exc
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise MetadataError(f"GCE metadata {path}: HTTP {resp.status_code}")
        return resp.text.strip()

    def check(self) -> dict[str, Any] | None:
        if (self._get("preempted") or "").upper() != "TRUE":
            return None
        return {"reason": NOTICE_PREEMPTION, "source": self.name, "deadline_unix_s": time.time() + GCE_NOTICE_S}

    def instance_id(self) -> str | None:
        return self._get("name")

    def address(self) -> str | None:
        return self._get("network-interfaces/0/ip")


def sources_for(config: AgentConfig) -> list[NoticeSource]:
    """The metadata services the config names (none unless named: they are link-local addresses)."""
    out: list[NoticeSource] = []
    if NOTICE_SOURCE_AWS in config.notice_sources:
        out.append(AwsImds(config.aws_imds_endpoint))
    if NOTICE_SOURCE_GCE in config.notice_sources:
        out.append(GceMetadata(config.gce_metadata_endpoint))
    return out
