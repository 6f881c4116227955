"""Errors raised at the cloud boundary: everything ``cloud_providers`` raises on purpose.

Every error a cloud SDK raises is translated where it enters, to the most specific type below, with
``raise ... from exc`` so the original stays attached. Recovery code chooses by type: capacity means
"fail over to the next zone or type", throttling means "back off and retry", quota and credentials mean
"stop and tell the user", invalid request is a bug or bad input.

    ProviderError
    ├── CapacityUnavailable   (no capacity for this offering now; fail over)
    ├── QuotaExceeded         (account limit; fail over to another region/type or stop)
    ├── Throttled             (API rate limit; exponential backoff with jitter)
    ├── CredentialsError      (missing or invalid credentials; one line to the user)
    ├── InvalidRequest        (the request itself is wrong)
    ├── InstanceNotFound      (asked about an instance the cloud does not know)
    ├── SdkMissing            (the cloud's SDK is not installed: ``pip install 'spotrain[aws]'``)
    ├── TraceError            (local/market.py: a market trace file is malformed; names line and column)
    ├── ScenarioError         (local/scenario.py: a local-cloud scenario file is invalid; names the field)
    ├── FileRefused           (safe_files.py: a user's file is not a bounded regular file of sane YAML/JSON)
    │   └── UnsafeJobFile     (jobfiles.py: a file a job wrote is a link, not regular, or over its cap)
    ├── WireError             (remote/wire.py: an agent <-> controller message breaks the wire format)
    ├── ProgressError         (protocol.py: a worker's progress file is not a progress record)
    ├── MetadataError         (remote/metadata.py: the instance's metadata service cannot be read)
    ├── WorkdirError          (remote/workdir.py: the job's shipped workdir is unreadable, tampered or unsafe)
    ├── ControllerUnreachable (remote/agent.py: the agent's controller does not answer; retry later)
    └── InstanceGone          (remote/agent.py: the controller says the agent's instance is gone for good)

``SdkMissing``, ``TraceError``, ``ScenarioError``, ``FileRefused`` and ``WireError`` are also ``ValueError``s: like a bad
provider setting, they reject input (a setting, a file, a message) and are shown as one line.
The other boundaries have their own roots: ``autoscaler.errors.SpotrainError`` (controller and CLI)
and ``runtime.errors.RuntimeFailure``.
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base of every error raised by a provider (and by the local cloud's files and the remote agent).
    Carries where it happened, for failover decisions."""

    def __init__(
        self,
        message: str,
        *,
        cloud: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.cloud = cloud
        self.region = region
        self.zone = zone
        self.instance_type = instance_type
        self.attempts = attempts

    def where(self) -> str:
        parts = [p for p in (self.cloud, self.zone or self.region, self.instance_type) if p]
        return "/".join(parts)


class CapacityUnavailable(ProviderError):
    """No capacity for the offering right now (spot or on-demand). Try another zone or type."""


class QuotaExceeded(ProviderError):
    """An account quota (vCPUs, GPUs, spot requests) would be exceeded."""


class Throttled(ProviderError):
    """The cloud API rate-limited us. Retry with exponential backoff and jitter."""


class CredentialsError(ProviderError):
    """Credentials are missing, expired or lack a permission."""


class InvalidRequest(ProviderError):
    """The request is malformed or names something that does not exist."""


class InstanceNotFound(ProviderError):
    """The instance is unknown to the cloud (never existed, or long gone)."""


class FileRefused(ProviderError, ValueError):
    """A user's file that the product will not read (``safe_files.py``, ``jobfiles.py``); the message
    is one line and names the file. Defined here, not in ``safe_files.py``, so that refusing a job's
    file does not import YAML (``spotrain logs`` stays light)."""


class SdkMissing(ProviderError, ValueError):
    """The cloud's SDK is not installed; the message names the extra that brings it."""
