"""The launch record: one instance's share of a gang attempt, the one type the controller, the wire and
the agents share.

The controller's gang start makes one per instance and hands it to its executor (``executor.py``); the
remote executor stores it and sends it to the instance's agent as the assignment's ``launch``
(``remote/wire.py``: ``launch_to_json`` / ``launch_from_json``, without the two fields that are the
controller's own); the local executor writes it to the local agent's config file. On the machine, the
agent runs it as a ``local.agent.Gang`` (with ``env`` the ranks' whole base environment, ``cwd`` where
they run and ``log_dir`` where their logs go there).

Scalars are strict (a message with ``"attempt": "1"`` or ``true`` is refused, not coerced): this is
validated at the wire's edge, where the input is another machine's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, field_validator, model_validator

# What the controller keeps to itself: which instance runs the launch and where the controller keeps
# its logs (the agent knows its instance and keeps logs under its state directory).
CONTROLLER_ONLY_FIELDS = frozenset({"instance_id", "log_dir"})


class WorkerLaunch(BaseModel):
    """Everything needed to start one instance's share of a gang (one process per local rank)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_id: StrictStr = ""
    job_id: StrictStr
    attempt: StrictInt
    run: StrictStr
    setup: StrictStr | None = None
    cwd: StrictStr
    ranks: list[StrictInt]
    world_size: StrictInt
    master_addr: StrictStr
    master_port: StrictInt
    # Environment common to all ranks (the worker protocol's SPOTRAIN_* variables).
    env: Mapping[StrictStr, StrictStr]
    log_dir: StrictStr = ""
    # The job's workdir as the controller shipped it (``remote/workdir.py``): ``{"uri", "sha256", "size"}``
    # of its archive in the job's store, or ``{"error": ...}`` when it could not be shipped. None: run in
    # ``cwd`` as it is on the instance.
    workdir: Mapping[str, Any] | None = None

    @field_validator("ranks")
    @classmethod
    def _some_ranks(cls, ranks: list[int]) -> list[int]:
        if not ranks:
            raise ValueError("a gang launch needs at least one rank")
        return ranks

    @model_validator(mode="after")
    def _ranks_fit(self) -> WorkerLaunch:
        if self.world_size < len(self.ranks):
            raise ValueError(f"world_size {self.world_size} is smaller than the {len(self.ranks)} local ranks")
        return self

    def with_(self, **changes: Any) -> WorkerLaunch:
        """A copy with ``changes``, validated again."""
        return WorkerLaunch.model_validate({**self.model_dump(), **changes})


__all__ = ["CONTROLLER_ONLY_FIELDS", "WorkerLaunch"]
