"""Translate Google SDK errors into ``cloud_providers.errors`` where they enter, and retry throttling.

The twin of ``aws/errors.py``. Every Compute call of the provider goes through ``call()``: the shared
loop of ``cloud_providers/retry.py`` (``RetryPolicy``, the same as AWS's) retries throttling, transient
server errors and network errors with capped exponential backoff and full jitter, and what remains is
translated here to the most specific ``ProviderError``, ``raise ... from exc``. Compute reports
failures in two places, both handled here:

* the HTTP response of the call (``google.api_core.exceptions``; the reason is in ``errors[].reason``)
* the zone operation a mutation returns, once it is DONE (``operation.error.errors[].code``): a
  stockout is not an HTTP error but an operation that finished with ``ZONE_RESOURCE_POOL_EXHAUSTED``.

    HTTP / reason                                   operation error code                   -> error
    ----------------------------------------------  -------------------------------------  ------------------
                                                    ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS],
                                                    RESOURCE_POOL_EXHAUSTED, STOCKOUT      CapacityUnavailable
    403 quotaExceeded                               QUOTA_EXCEEDED                         QuotaExceeded
    429, 403 rateLimitExceeded/userRateLimitExceeded RATE_LIMIT_EXCEEDED,
      (after the retries)                             RESOURCE_OPERATION_RATE_EXCEEDED     Throttled
    401; 403 (other reasons); DefaultCredentialsError, RefreshError                        CredentialsError
    400, 409, 412                                   any other code                         InvalidRequest
    404 on an instance (get, delete)                                                       InstanceNotFound
    404 elsewhere (zone, machine type, image)                                              InvalidRequest
    5xx, network (after the retries)                                                       ProviderError

Operation errors are not retried here: a retried insert carries the same ``requestId``, so Compute
would answer with the same failed operation; failing over is the caller's move (``failover.py``).
Messages are one line and never contain credentials: for auth errors we name what to do (the roles in
docs/gcp.md), not the SDK's text, and for the rest we keep the API's own first-line message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..errors import (
    CapacityUnavailable,
    CredentialsError,
    InvalidRequest,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from ..retry import RetryPolicy, Where, retrying
from ._google import CREDENTIALS_HINT, api_exceptions, auth_exceptions, sdk_errors

T = TypeVar("T")

CLOUD = "gcp"

CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "STOCKOUT",
    }
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
THROTTLE_CODES = frozenset(
    {"RATE_LIMIT_EXCEEDED", "RESOURCE_OPERATION_RATE_EXCEEDED", "rateLimitExceeded", "userRateLimitExceeded"}
)
TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
API_DISABLED_REASONS = frozenset({"accessNotConfigured", "SERVICE_DISABLED"})


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def reasons_of(exc: BaseException) -> list[str]:
    """The ``errors[].reason`` values of an HTTP error (and the ErrorInfo reason, when given)."""
    out = [str(e["reason"]) for e in getattr(exc, "errors", None) or () if isinstance(e, dict) and e.get("reason")]
    reason = getattr(exc, "reason", None)
    if reason:
        out.append(str(reason))
    return out


def _api_message(exc: BaseException) -> str:
    """The API's own message (not the URL the SDK prefixes), first line only."""
    for e in getattr(exc, "errors", None) or ():
        if isinstance(e, dict) and e.get("message"):
            return _first_line(e["message"])
    message = str(getattr(exc, "message", "") or exc)
    return _first_line(message.split(": ", 1)[-1] if message.startswith(("GET ", "POST ", "DELETE ")) else message)


def _status_of(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    return int(code) if isinstance(code, int) else None


def retryable(exc: BaseException) -> bool:
    """Throttling, 5xx and network errors: worth another try after a backoff."""
    api = api_exceptions()
    if isinstance(exc, api.GoogleAPICallError):
        status = _status_of(exc)
        return status == 429 or status in TRANSIENT_STATUS or any(r in THROTTLE_CODES for r in reasons_of(exc))
    if isinstance(exc, auth_exceptions().TransportError):
        return True
    return isinstance(exc, _requests_errors())


def _requests_errors() -> tuple[type[BaseException], ...]:
    return tuple(t for t in sdk_errors() if t.__module__.startswith("requests"))


def translate(
    exc: BaseException,
    *,
    operation: str,
    where: Where,
    attempts: int = 1,
    not_found: type[ProviderError] = InvalidRequest,
) -> ProviderError:
    """The most specific ProviderError for an SDK exception (the caller raises it ``from exc``)."""
    api = api_exceptions()
    auth = auth_exceptions()
    kw = where.error_kwargs(CLOUD, attempts)
    place = where.place(CLOUD)
    if isinstance(exc, auth.DefaultCredentialsError):
        return CredentialsError(CREDENTIALS_HINT, **kw)
    if isinstance(exc, auth.RefreshError):
        return CredentialsError(
            "GCP credentials could not be refreshed (expired or revoked): run `gcloud auth application-default "
            "login` again or replace the key in GOOGLE_APPLICATION_CREDENTIALS",
            **kw,
        )
    if not isinstance(exc, api.GoogleAPICallError):
        reason = _first_line(str(exc)) or type(exc).__name__
        return ProviderError(f"GCP {operation} failed at {place}: {type(exc).__name__}: {reason}", **kw)
    status = _status_of(exc)
    reasons = reasons_of(exc)
    detail = _api_message(exc) or type(exc).__name__
    tag = f"HTTP {status}" + (f" {reasons[0]}" if reasons else "")
    if status == 429 or any(r in THROTTLE_CODES for r in reasons):
        return Throttled(f"GCP {operation} throttled at {place} after {attempts} attempts ({tag})", **kw)
    if any(r in QUOTA_CODES for r in reasons):
        return QuotaExceeded(
            f"GCP quota exceeded at {place} ({tag}): {detail}; request more in IAM & Admin > Quotas "
            f"or use another region or machine type",
            **kw,
        )
    if status == 401:
        return CredentialsError(
            f"GCP rejected the credentials ({tag}): run `gcloud auth application-default login` or set "
            f"GOOGLE_APPLICATION_CREDENTIALS to a valid service-account key",
            **kw,
        )
    if status == 403:
        if any(r in API_DISABLED_REASONS for r in reasons):
            return CredentialsError(
                f"GCP {operation}: the Compute Engine API is not enabled for this project ({tag}): "
                f"gcloud services enable compute.googleapis.com",
                **kw,
            )
        return CredentialsError(
            f"GCP denied {operation} to these credentials ({tag}): grant the roles listed in docs/gcp.md", **kw
        )
    if status == 404:
        return not_found(f"GCP {operation}: not found at {place} ({tag}): {detail}", **kw)
    if status in (400, 409, 412):
        return InvalidRequest(f"GCP {operation} rejected at {place} ({tag}): {detail}", **kw)
    return ProviderError(f"GCP {operation} failed at {place} ({tag}): {detail}", **kw)


def operation_error_codes(op: Any) -> list[tuple[str, str]]:
    """``[(code, message)]`` of a finished zone operation (empty when it succeeded)."""
    error = getattr(op, "error", None)
    return [(str(e.code), _first_line(e.message)) for e in (getattr(error, "errors", None) or ())]


def translate_operation(
    errors: Iterable[tuple[str, str]], *, operation: str, where: Where, http_status: int | None = None
) -> ProviderError:
    """The ProviderError for a zone operation that finished with ``errors`` (``(code, message)``)."""
    errors = list(errors)
    codes = [c for c, _ in errors]
    kw = where.error_kwargs(CLOUD)
    place = where.place(CLOUD)
    first_code, first_message = errors[0] if errors else ("UNKNOWN", "")
    for code, message in errors:
        if code in CAPACITY_CODES:
            return CapacityUnavailable(f"no GCP capacity at {place} ({code}): {message}", **kw)
    for code, message in errors:
        if code in QUOTA_CODES:
            return QuotaExceeded(
                f"GCP quota exceeded at {place} ({code}): {message}; request more in IAM & Admin > Quotas "
                f"or use another region or machine type",
                **kw,
            )
    if any(c in THROTTLE_CODES for c in codes):
        return Throttled(f"GCP {operation} throttled at {place} ({', '.join(codes)})", **kw)
    if http_status in (401, 403):
        return CredentialsError(
            f"GCP denied {operation} ({first_code}): grant the roles listed in docs/gcp.md", **kw
        )
    if http_status is not None and http_status >= 500:
        return ProviderError(f"GCP {operation} failed at {place} ({first_code}): {first_message}", **kw)
    return InvalidRequest(f"GCP {operation} failed at {place} ({first_code}): {first_message}", **kw)


def call(
    fn: Callable[..., T],
    *,
    operation: str,
    where: Where,
    retry: RetryPolicy,
    not_found: type[ProviderError] = InvalidRequest,
    timeout_s: float = 60.0,
    **kwargs: Any,
) -> T:
    """Call ``fn(**kwargs)`` (the SDK's own retry turned off), retrying throttling, 5xx and network errors;
    translate the rest.

    Only the SDK's exception types are caught.
    """
    return retrying(lambda: fn(retry=None, timeout=timeout_s, **kwargs), retry=retry, sdk_errors=sdk_errors(),
                    retryable=retryable,
                    translate=lambda exc, attempts: translate(exc, operation=operation, where=where,
                                                              attempts=attempts, not_found=not_found))


__all__ = [
    "CLOUD",
    "RetryPolicy",
    "Where",
    "call",
    "operation_error_codes",
    "retryable",
    "translate",
    "translate_operation",
]
