"""The job's domain: its states, the transitions allowed between them, and the typed outcomes a
policy can ask for. Pure (no database, no HTTP): the store enforces the table, the policy returns
``Outcome`` values, and the API maps ``DomainError`` subclasses to HTTP statuses at its edge.
``DomainError`` is a ``SpotrainError`` (its tree is in ``errors.py``); the errors of the job's domain
are defined here.

DESIGN.md "Job lifecycle": PENDING -> PROVISIONING -> RUNNING <-> RESCALING / RECOVERING ->
SUCCEEDED | FAILED | CANCELLED | FAILED_NO_RESOURCE | FAILED_BUDGET. Every live state may end in any
terminal state (a cancel, the budget guard or a user-code failure can come at any moment), and a
terminal state is final.
"""

from __future__ import annotations

import enum

from autoscaler.errors import Conflict, DomainError

__all__ = ["JobState", "TERMINAL", "LIVE", "TRANSITIONS", "check_transition", "Outcome", "DomainError",
           "JobNameTaken", "NotOwner", "IllegalTransition"]


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    RESCALING = "RESCALING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    FAILED_NO_RESOURCE = "FAILED_NO_RESOURCE"
    FAILED_BUDGET = "FAILED_BUDGET"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.FAILED_NO_RESOURCE, JobState.FAILED_BUDGET}
)
LIVE = frozenset(JobState) - TERMINAL

_S = JobState
# Allowed moves between different states (staying in a state is always allowed: a no-op).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.PENDING: frozenset({_S.PROVISIONING, _S.RUNNING}) | TERMINAL,
    _S.PROVISIONING: frozenset({_S.PENDING, _S.RUNNING, _S.RECOVERING, _S.RESCALING}) | TERMINAL,
    _S.RUNNING: frozenset({_S.PENDING, _S.RESCALING, _S.RECOVERING}) | TERMINAL,
    _S.RESCALING: frozenset({_S.PENDING, _S.PROVISIONING, _S.RUNNING, _S.RECOVERING}) | TERMINAL,
    _S.RECOVERING: frozenset({_S.PENDING, _S.PROVISIONING, _S.RUNNING, _S.RESCALING}) | TERMINAL,
    **{t: frozenset() for t in TERMINAL},
}


class JobNameTaken(Conflict):
    """A live job already has the name (DESIGN.md: names are unique among live jobs)."""

    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class NotOwner(Conflict):
    """The job belongs to another controller, which alone may change it."""

    def __init__(self, message: str, *, job_id: str = "", owner: str = "") -> None:
        super().__init__(message)
        self.job_id, self.owner = job_id, owner


class IllegalTransition(DomainError):
    """A move the lifecycle table does not allow (a bug in the caller, never the user's doing)."""

    def __init__(self, job_id: str, from_state: str, to_state: str) -> None:
        super().__init__(f"job {job_id}: illegal transition {from_state} -> {to_state}")
        self.job_id, self.from_state, self.to_state = job_id, from_state, to_state


def check_transition(job_id: str, from_state: str, to_state: JobState) -> None:
    """Raise ``IllegalTransition`` unless ``from_state -> to_state`` is in the table."""
    try:
        src = JobState(from_state)
    except ValueError:
        raise IllegalTransition(job_id, from_state, to_state.value) from None
    if src is to_state:
        return
    if to_state not in TRANSITIONS[src]:
        raise IllegalTransition(job_id, src.value, to_state.value)


class Outcome(str, enum.Enum):
    """What a policy may end a job with when it cannot run under its constraints."""

    NO_RESOURCE = "FAILED_NO_RESOURCE"
    BUDGET = "FAILED_BUDGET"

    @property
    def state(self) -> JobState:
        return JobState(self.value)
