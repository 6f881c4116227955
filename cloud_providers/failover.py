"""Try launch candidates in order; the first that gets capacity wins (SkyPilot's failover loop).

Provider-agnostic: it needs only ``Provider.launch``. Capacity and quota errors are about *this*
candidate (zone, type, region), so the next candidate may succeed; every other error (credentials,
invalid request, throttling that survived the provider's own backoff, unknown failures) would fail
for every candidate too, so it propagates at once instead of burning through the list. Each failure
keeps its zone and type, so the controller can record why it moved on and, when nothing is left,
report FAILED_NO_RESOURCE with the reasons.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .base import Instance, LaunchRequest, Provider
from .errors import CapacityUnavailable, ProviderError, QuotaExceeded

FAILOVER_ERRORS: tuple[type[ProviderError], ...] = (CapacityUnavailable, QuotaExceeded)


@dataclasses.dataclass(frozen=True)
class FailoverResult:
    """``instance`` is None when every candidate failed; ``failures`` lists them in order."""

    instance: Instance | None
    request: LaunchRequest | None
    failures: tuple[tuple[LaunchRequest, ProviderError], ...]

    @property
    def ok(self) -> bool:
        return self.instance is not None


def launch_with_failover(provider: Provider, requests: Iterable[LaunchRequest]) -> FailoverResult:
    """Launch the first candidate that has capacity.

    Candidates usually differ in zone or type and must each carry their own ``decision_id``: a
    retried candidate list (after a crash) then finds the instance that did launch, and never
    launches twice for one decision.
    """
    failures: list[tuple[LaunchRequest, ProviderError]] = []
    for request in requests:
        try:
            instance = provider.launch(request)
        except FAILOVER_ERRORS as exc:
            failures.append((request, exc))
            continue
        return FailoverResult(instance=instance, request=request, failures=tuple(failures))
    return FailoverResult(instance=None, request=None, failures=tuple(failures))
