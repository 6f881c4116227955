"""Errors of the controller and CLI boundary.

    SpotrainError
    ├── SpecError           (the user's job spec, scenario or --set override is invalid)
    ├── ControllerUnreachable (no controller answers at the recorded address)
    ├── AuthError           (the controller refused our token)
    ├── JobNotFound         (no job with that id or name)
    └── ApiError            (any other refusal from the controller, with its HTTP status)

The CLI prints ``str(error)`` on one line and exits non-zero; no traceback reaches the user.
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


class JobNotFound(SpotrainError):
    exit_code = 5


class ApiError(SpotrainError):
    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
