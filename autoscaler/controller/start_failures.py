"""A gang that could not be started: its cause, classified, retried with back-off or ended (issue 21, finding 6).

Starting a gang can fail before any worker runs: the remote executor ships the job's workdir to its
store first, and a store that refuses the archive raised out of ``start_gang``. That ended the tick
for every job (a ``ProviderError`` ends the tick), left the write-ahead attempt recorded with no
workers, and the next tick found the gang "lost" and failed the job with ``IllegalTransition
PENDING -> RECOVERING`` instead of the cause, never retrying even a transient error.

Now the failure is the job's alone. The workers of the attempt already started are stopped, the
attempt is cleared (the job keeps its state and its instances), and the cause is recorded, one line,
as a ``gang-start-failed`` event and the job's reason. Its class decides what follows, by the error
hierarchies of the boundaries (``cloud_providers.errors``, ``autoscaler.errors``):

- permanent: the request or the job itself is wrong and asking again cannot help (``InvalidRequest``,
  ``CredentialsError``, ``SdkMissing``, ``WorkdirError``, any ``ValueError`` such as a ``WireError``,
  and our own ``SpotrainError``\\ s such as a ``SpecError`` for a store URI): the job fails at once
  with the cause;
- transient: any other ``ProviderError`` (throttling, capacity, a store that cannot be written now)
  and ``OSError``: retried after ``backoff_s`` (15 s doubling, at most 10 min, on the controller's
  clock); the ``MAX_START_FAILURES``-th failure in a row fails the job with the cause.

Any other error is a bug of ours; it is left to the tick's containment (``reconcile._contained``).
"""

from __future__ import annotations

import dataclasses

from cloud_providers.errors import CredentialsError, InvalidRequest, ProviderError, SdkMissing
from cloud_providers.remote.workdir import WorkdirError

from ..errors import SpotrainError

MAX_START_FAILURES = 5
BACKOFF_BASE_S = 15.0
BACKOFF_MAX_S = 600.0
GANG_START_FAILED = "gang-start-failed"

_PERMANENT: tuple[type[BaseException], ...] = (InvalidRequest, CredentialsError, SdkMissing, WorkdirError, ValueError,
                                               SpotrainError)
_TRANSIENT: tuple[type[BaseException], ...] = (ProviderError, OSError)


def handled(exc: BaseException) -> bool:
    """Whether ``exc`` is a start failure this module handles (else: a bug, for the tick's containment)."""
    return isinstance(exc, _PERMANENT + _TRANSIENT)


def transient(exc: BaseException) -> bool:
    """Whether asking again may succeed (the module doc): permanent types are checked first, since a
    ``WireError`` is a ``ProviderError`` too."""
    return not isinstance(exc, _PERMANENT) and isinstance(exc, _TRANSIENT)


def backoff_s(failures: int) -> float:
    """Controller-clock seconds to wait after the ``failures``-th failure in a row."""
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** max(0, failures - 1))


def cause(exc: BaseException) -> str:
    """The error as one line: its type and message."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:400]


@dataclasses.dataclass
class StartFailures:
    """The failures in a row of each job's gang starts, and when each may be tried again (controller
    clock). In memory: a restarted controller tries again at once, and counts afresh."""

    failures: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)

    def due(self, job_id: str, now: float) -> bool:
        seen = self.failures.get(job_id)
        return seen is None or now >= seen[1]

    def failed(self, job_id: str, now: float) -> tuple[int, float]:
        """Count one more failure; (failures in a row, seconds until the next try)."""
        n = self.failures.get(job_id, (0, 0.0))[0] + 1
        wait_s = backoff_s(n)
        self.failures[job_id] = (n, now + wait_s)
        return n, wait_s

    def started(self, job_id: str) -> None:
        self.failures.pop(job_id, None)
