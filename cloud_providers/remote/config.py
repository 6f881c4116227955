"""The instance agent's configuration: the JSON document the user data writes to the instance.

Written by the controller at launch (``autoscaler/fleet/clouds.py`` through the provider's ``boot_config_for``)
and read by the agent at start; every field is checked here, so a bad file fails in one line naming
the field. Unknown fields are errors, as in the job spec.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..safe_files import MAX_DOCUMENT_BYTES, FileRefused, parse_json, read_text_file

NOTICE_SOURCE_AWS = "aws-imds"
NOTICE_SOURCE_GCE = "gce-metadata"
NOTICE_SOURCES = (NOTICE_SOURCE_AWS, NOTICE_SOURCE_GCE)
# The link-local metadata services; tests point these at tests/fakes/imds.FakeMetadataServer.
DEFAULT_AWS_IMDS_ENDPOINT = "http://169.254.169.254"
DEFAULT_GCE_METADATA_ENDPOINT = "http://metadata.google.internal"
DEFAULT_STATE_DIR = "/var/lib/spotrain"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    controller_url: str
    # "<decision_id>:<mac>" (see wire.py); a secret: the config file is root-only (mode 0600).
    agent_credential: str
    decision_id: str
    instance_id: str | None = None
    job_id: str | None = None
    controller_id: str | None = None
    notice_sources: tuple[str, ...] = ()
    aws_imds_endpoint: str = DEFAULT_AWS_IMDS_ENDPOINT
    gce_metadata_endpoint: str = DEFAULT_GCE_METADATA_ENDPOINT
    state_dir: str = DEFAULT_STATE_DIR
    # The address other instances reach this one on (rank 0's rendezvous); default: the cloud's
    # private address (IMDS local-ipv4, GCE network-interfaces/0/ip, or the provider's record).
    advertise_address: str | None = None
    # The controller's self-signed certificate (PEM): the agent's only trust anchor (``tls.py``).
    controller_cert_pem: str | None = None
    # The spotrain version the controller runs and the user data installed: the agent refuses another.
    agent_version: str | None = None
    # The wheel the controller serves (``agent_boot.py``, install ``served``): its file name and sha256,
    # which the boot checks before pip installs it.
    agent_wheel: str | None = None
    agent_wheel_sha256: str | None = None
    poll_s: float = 0.5
    report_s: float = 1.0
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        url = urlparse(self.controller_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(f"controller_url: {self.controller_url!r} is not an http(s) URL")
        if not self.decision_id or not self.agent_credential.startswith(self.decision_id + ":"):
            raise ValueError("agent_credential: does not belong to decision_id")
        for source in self.notice_sources:
            if source not in NOTICE_SOURCES:
                raise ValueError(f"notice_sources: {source!r} is not one of {', '.join(NOTICE_SOURCES)}")
        for name in ("poll_s", "report_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if not self.state_dir:
            raise ValueError("state_dir: must be a directory path")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["notice_sources"] = list(self.notice_sources)
        return d

    @classmethod
    def from_json(cls, data: Any) -> AgentConfig:
        if not isinstance(data, dict):
            raise ValueError("agent config: expected a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown agent config field")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            if name == "notice_sources":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"notice_sources: expected a list of names, got {value!r}")
                value = tuple(value)
            elif name in ("poll_s", "report_s", "request_timeout_s"):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{name}: expected a number, got {value!r}")
                value = float(value)
            elif value is not None and not isinstance(value, str):
                raise ValueError(f"{name}: expected a string, got {value!r}")
            kwargs[name] = value
        for name in ("controller_url", "agent_credential", "decision_id"):
            if not kwargs.get(name):
                raise ValueError(f"{name}: required")
        return cls(**kwargs)

    @classmethod
    def load(cls, path: str | Path) -> AgentConfig:
        try:  # the bounded reader of every file the product reads (issue 21, finding 11)
            text = read_text_file(path, max_bytes=MAX_DOCUMENT_BYTES, what="")
        except FileRefused as exc:
            raise ValueError(f"--config: cannot read {exc}") from None
        try:
            data = parse_json(text, source=str(path))
        except FileRefused as exc:
            raise ValueError(f"--config: {exc}") from None
        return cls.from_json(data)
