"""The retry loop every cloud SDK call of a provider goes through, and where the call happened.

One policy for AWS and GCP: throttling and transient server or network errors are retried with capped
exponential backoff and *full jitter* (sleep ~ U(0, min(cap, base * 2**attempt))), the variant that
spreads a thundering herd best in Brooker's "Exponential Backoff And Jitter" (AWS Architecture Blog,
2015); what remains is translated to the most specific ``ProviderError`` and raised ``from`` the SDK's
exception. Which exceptions are the SDK's, which of them are worth another try and how each translates
is the cloud's own knowledge (``aws/errors.py``, ``gcp/errors.py``); the loop is here, once.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import ProviderError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a call happened: copied into every error so the caller can fail over."""

    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None

    def error_kwargs(self, cloud: str, attempts: int = 1) -> dict[str, Any]:
        """The keyword arguments of a ``ProviderError`` raised for a call here."""
        return {"cloud": cloud, "region": self.region, "zone": self.zone, "instance_type": self.instance_type,
                "attempts": attempts}

    def place(self, cloud: str) -> str:
        """``cloud/zone-or-region/type``, as error messages name the place."""
        return "/".join(p for p in (cloud, self.zone or self.region, self.instance_type) if p)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter. ``sleep`` and ``rng`` are seams for tests."""

    max_attempts: int = 5
    base_s: float = 0.5
    cap_s: float = 20.0
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = dataclasses.field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_s < 0 or self.cap_s < 0:
            raise ValueError(f"backoff base_s/cap_s must be >= 0, got {self.base_s}/{self.cap_s}")

    def delay_s(self, attempt: int) -> float:
        """Sleep before retry number ``attempt`` (1-based): U(0, min(cap, base * 2**(attempt-1)))."""
        return self.rng.uniform(0.0, min(self.cap_s, self.base_s * 2.0 ** (attempt - 1)))


def retrying(
    attempt: Callable[[], T],
    *,
    retry: RetryPolicy,
    sdk_errors: tuple[type[BaseException], ...],
    retryable: Callable[[BaseException], bool],
    translate: Callable[[BaseException, int], ProviderError],
) -> T:
    """``attempt()``, again after a backoff while it raises a retryable SDK error, at most
    ``retry.max_attempts`` times; any other SDK error, or the last, is raised as ``translate(exc,
    attempts)`` from it.

    Only ``sdk_errors`` are caught (never a bare ``Exception``): anything else is a bug in our code and
    must surface as itself.
    """
    attempts = 1
    while True:
        try:
            return attempt()
        except sdk_errors as exc:
            if retryable(exc) and attempts < retry.max_attempts:
                retry.sleep(retry.delay_s(attempts))
                attempts += 1
                continue
            raise translate(exc, attempts) from exc


__all__ = ["RetryPolicy", "Where", "retrying"]
