"""The executor contract: start, watch, signal and stop a job's worker processes on an instance.

A provider buys machines; an executor runs the job on them. Keeping the two apart lets the same
local executor run the workers of local-cloud instances, of moto-backed AWS instances and of GCP-fake
instances (``--executor local``), while on a real cloud the instance's own agent plays this part.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, Protocol

# The launch record lives in ``launch.py`` (shared with the wire and the agents); executors take it here.
from .launch import WorkerLaunch as WorkerLaunch
from .protocol import ProgressRecord


class GangState(str, enum.Enum):
    RUNNING = "running"
    EXITED = "exited"  # every rank on the instance has exited; see exit_codes
    LOST = "lost"  # the workers are gone without a recorded exit (killed with the machine)
    ABSENT = "absent"  # nothing was ever started for this attempt


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    state: GangState
    # Exit codes of the ranks that have exited so far (rank -> code; 128+N for signal N).
    exit_codes: Mapping[int, int] = dataclasses.field(default_factory=dict)


class Executor(Protocol):
    def start(self, launch: WorkerLaunch) -> None:
        """Start the workers. Idempotent per (instance, attempt)."""
        ...

    def status(self, instance_id: str, attempt: int) -> WorkerStatus: ...

    def notify(self, instance_id: str, notice: Mapping[str, Any]) -> None:
        """Deliver a notice (preemption, rescale, cancel) to the instance's running workers."""
        ...

    def stop(self, instance_id: str) -> None:
        """Kill every worker process of the instance at once. Idempotent."""
        ...

    def progress(self, job_id: str) -> ProgressRecord | None:
        """The last progress report of the job's rank 0, if any."""
        ...

    def progress_file(self, job_id: str) -> str: ...

    def rendezvous(self, instance_id: str) -> tuple[str, int]:
        """Address and a free port for torch.distributed's rendezvous, on the gang's first instance."""
        ...
