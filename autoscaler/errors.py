"""Errors of the controller and CLI boundary: everything ``autoscaler`` raises on purpose.

    SpotrainError
    ├── SpecError               (the user's job spec, scenario, workload or --set override is invalid)
    │   └── WorkloadError       (simulator/workload.py: a workload file; also a ValueError)
    ├── ControllerUnreachable   (no controller answers at the recorded address)
    ├── AuthError               (the controller refused our token)
    ├── DomainError             (an operation refused for a reason of the domain; nothing in it knows HTTP)
    │   ├── JobNotFound         (no job with that id or name)
    │   ├── Conflict            (the request contradicts the state: the operation cannot be done now)
    │   │   ├── JobNameTaken    (jobs/domain.py: a live job already has the name)
    │   │   ├── NotOwner        (jobs/domain.py: the job belongs to another controller)
    │   │   └── NotResumable    (server/resume.py: the job is live, or it succeeded: nothing to resume)
    │   └── IllegalTransition   (jobs/domain.py: a move the lifecycle table forbids; a bug, not the user's doing)
    ├── AgentLookupError        (remote/executor.py: an agent's credential maps to no usable instance)
    │   ├── InstanceNotYetKnown (not recorded yet: the agent retries)
    │   ├── InstanceTerminated  (terminated for good: the agent stops)
    │   └── WrongInstance       (the agent claims another instance than its decision launched)
    ├── TransportFailed         (client/plainhttp.py: a plain-HTTP request got no answer; the client
    │                            raises ControllerUnreachable for it)
    ├── _NotHttp                (client/plainhttp.py: internal, an answer that is not HTTP/1.x; always
    │                            turned into TransportFailed)
    ├── BudgetExceeded          (jobs/globmatch.py: a workdir's ignore patterns used up their matching steps)
    ├── SecretError             (home.py: the API token or another secret file is empty or unreadable)
    ├── SchemaTooNew            (state/migrate.py: the database was migrated by a newer spotrain)
    ├── PlanTooLarge            (simulator/omniscient.py: the offline problem is too large; also a ValueError)
    └── ApiError                (any other refusal from the controller, with its HTTP status)

HTTP lives only at the edges: the API (``server/api.py``, ``remote/endpoints.py``) maps each type to a status and
an ``ErrorBody`` (``server/schemas.py``) naming the type; the client (``client/http.py``) maps that body back to
the same type, so a ``JobNameTaken`` raised in the controller is a ``JobNameTaken`` in the CLI.

The CLI prints ``str(error)`` on one line and exits with the type's ``exit_code``; no traceback
reaches the user. The other boundaries have their own roots: ``cloud_providers.errors.ProviderError``
and ``runtime.errors.RuntimeFailure`` (``tests/test_error_hierarchy.py`` checks that every error type
of the four packages descends from one of the three).
"""

from __future__ import annotations


class SpotrainError(Exception):
    exit_code = 1


class SpecError(SpotrainError):
    exit_code = 2


class ControllerUnreachable(SpotrainError):
    exit_code = 3


class AuthError(SpotrainError):
    exit_code = 4


class DomainError(SpotrainError):
    """A controller operation refused for a reason of the domain (the API maps each subclass to an
    HTTP status; nothing here knows HTTP)."""


class JobNotFound(DomainError):
    exit_code = 5


class Conflict(DomainError):
    """The operation contradicts the current state (a name in use, a job owned elsewhere)."""


class SchemaTooNew(SpotrainError):
    """The state database is at a schema revision this spotrain does not know: a newer one wrote it."""


class ApiError(SpotrainError):
    """A refusal of the controller the client has no more specific type for."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
