"""Translate botocore errors into ``cloud_providers.errors`` where they enter, and retry throttling.

Every EC2 call of the provider goes through ``call()``: the shared loop of ``cloud_providers/retry.py``
retries throttling and transient server or network errors with capped exponential backoff and full
jitter, and what remains is translated here to the most specific ``ProviderError``,
``raise ... from exc``:

    InsufficientInstanceCapacity, InsufficientHostCapacity,
    SpotMaxPriceTooLow, MaxSpotInstanceCountExceeded, Unsupported    -> CapacityUnavailable
    RequestLimitExceeded, Throttling, ... (after the retries)         -> Throttled
    VcpuLimitExceeded, InstanceLimitExceeded, any other *LimitExceeded -> QuotaExceeded
    AuthFailure, UnauthorizedOperation, expired/invalid keys,
    NoCredentialsError, PartialCredentialsError                       -> CredentialsError
    Invalid*, MissingParameter, IdempotentParameterMismatch, ...      -> InvalidRequest
    InvalidInstanceID.NotFound                                        -> InstanceNotFound
    anything else (5xx after retries, network)                        -> ProviderError

Messages are one line and never contain credentials: for auth errors we name what is missing and
where the policy lives (docs/aws.md), not the SDK's encoded authorization message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import (
    CapacityUnavailable,
    CredentialsError,
    InstanceNotFound,
    InvalidRequest,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from ..retry import RetryPolicy, Where, retrying
from ._boto import botocore_exceptions

T = TypeVar("T")

CLOUD = "aws"

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "InsufficientReservedInstanceCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        # "Your requested instance type is not supported in your requested Availability Zone".
        "Unsupported",
    }
)
THROTTLE_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
    }
)
TRANSIENT_CODES = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"})
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "RequestExpired",
        "OptInRequired",
        "Blocked",
    }
)
NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound"})


def error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def _retryable(exc: BaseException) -> bool:
    bex = botocore_exceptions()
    code = error_code(exc)
    if code is not None:
        return code in THROTTLE_CODES or code in TRANSIENT_CODES
    return isinstance(exc, (bex.EndpointConnectionError, bex.ConnectionClosedError, bex.ReadTimeoutError))


def translate(exc: BaseException, *, operation: str, where: Where, attempts: int = 1) -> ProviderError:
    """The most specific ProviderError for a botocore exception (the caller raises it ``from exc``)."""
    bex = botocore_exceptions()
    kw = where.error_kwargs(CLOUD, attempts)
    place = where.place(CLOUD)
    if isinstance(exc, bex.NoCredentialsError):
        return CredentialsError(
            "AWS credentials not found: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or run on a host with an instance role",
            **kw,
        )
    if isinstance(exc, bex.PartialCredentialsError):
        return CredentialsError(
            "AWS credentials are incomplete: both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(and AWS_SESSION_TOKEN for temporary keys) are needed",
            **kw,
        )
    code = error_code(exc)
    if code is None:
        # Network trouble and other SDK errors: keep only the class name and a one-line reason.
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return ProviderError(f"AWS {operation} failed at {place}: {reason}", **kw)
    message = str(exc.response.get("Error", {}).get("Message", "")).splitlines()  # type: ignore[attr-defined]
    detail = message[0] if message else code
    if code in CAPACITY_CODES:
        return CapacityUnavailable(f"no AWS capacity at {place} ({code}): {detail}", **kw)
    if code in THROTTLE_CODES:
        return Throttled(f"AWS {operation} throttled at {place} after {attempts} attempts ({code})", **kw)
    if code.endswith("LimitExceeded"):
        return QuotaExceeded(
            f"AWS quota exceeded at {place} ({code}): request a limit increase in Service Quotas "
            f"or use another region or instance type",
            **kw,
        )
    if code in AUTH_CODES:
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            return CredentialsError(
                f"AWS denied {operation} to these credentials ({code}): attach the spotrain policy "
                f"from docs/aws.md",
                **kw,
            )
        if code == "OptInRequired":
            return CredentialsError(f"AWS account is not opted in to region {where.region} ({code})", **kw)
        return CredentialsError(
            f"AWS rejected the credentials ({code}): refresh or replace AWS_ACCESS_KEY_ID / "
            f"AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or the profile",
            **kw,
        )
    if code in NOT_FOUND_CODES:
        return InstanceNotFound(f"AWS {operation}: instance not found ({code}): {detail}", **kw)
    if code.startswith(("Invalid", "Missing", "Unknown")) or code in (
        "IdempotentParameterMismatch",
        "DryRunOperation",
        "ValidationError",
    ):
        return InvalidRequest(f"AWS {operation} rejected at {place} ({code}): {detail}", **kw)
    return ProviderError(f"AWS {operation} failed at {place} ({code}): {detail}", **kw)


def call(fn: Callable[..., T], *, operation: str, where: Where, retry: RetryPolicy, **kwargs: Any) -> T:
    """Call ``fn(**kwargs)``, retrying throttling and transient errors; translate the rest (only
    botocore's exception types are caught)."""
    bex = botocore_exceptions()
    return retrying(lambda: fn(**kwargs), retry=retry, sdk_errors=(bex.ClientError, bex.BotoCoreError),
                    retryable=_retryable,
                    translate=lambda exc, attempts: translate(exc, operation=operation, where=where,
                                                              attempts=attempts))


__all__ = ["CLOUD", "RetryPolicy", "Where", "call", "error_code", "translate"]
