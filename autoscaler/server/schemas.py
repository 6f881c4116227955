"""The controller API's request and response models, shared by the API, the client and the CLI.

The API declares them (``response_model=``, ``responses=``), so ``/openapi.json`` describes what it
really sends; the client parses every answer into them; the CLI and ``Controller``'s operations give
their ``to_json_dict()`` (exactly the JSON the API sends) to scripts and the renderers.
``JobSummary`` is the job of DESIGN.md's ``--json`` contract: at least ``job_id, name, state,
preemptions, cost_usd, on_demand_cost_usd, metric, final_model, deadline_met``.

Unknown fields in an answer are ignored, so a client reads the answers of a newer controller.
Non-finite floats (a diverged loss) are sent as ``null``: JSON has no NaN.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from autoscaler.jobs.domain import JobState
from cloud_providers.base import InstanceState


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_json_dict(self) -> dict[str, Any]:
        """The answer as the API sends it: plain JSON values, non-finite floats as None."""
        data: dict[str, Any] = json.loads(self.model_dump_json())
        return data


class Worker(_Answer):
    """One live instance of a job (terminated ones are left out)."""

    instance_id: str
    offering: str = Field(description="Offering key: cloud/zone/instance_type/ACCEL:N")
    market: str = Field(description="spot | on-demand")
    state: InstanceState
    gpus: int


class JobSummary(_Answer):
    """A job as the API, the client and ``spotrain status --json`` show it."""

    job_id: str
    name: str
    state: JobState
    reason: str
    error_tail: str | None = Field(
        default=None, description="The tail of the failing rank's log (its traceback) after a user-code failure")
    cloud: str
    preemptions: int
    restarts_on_errors: int
    attempts: int
    cost_usd: float
    on_demand_cost_usd: float = Field(description="What the same instance-hours would have cost on-demand")
    cost_by_market_usd: dict[str, float]
    egress_usd: float = Field(default=0.0, description="Egress billed for moving the job's checkpoint to another "
                                                       "region or cloud (included in cost_usd)")
    region_moves: int = Field(default=0, description="How many times the job's state moved to another region or cloud")
    checkpoint_size_gb: float | None = Field(
        default=None, description="The checkpoint's size the runtime measured (GB); null until it has checkpointed")
    metric: float | None
    metric_name: str | None
    loss: float | None
    step: int
    total_steps: int | None
    last_checkpoint_step: int | None
    final_model: str | None = Field(description="Path or URI of the final weights, once the job succeeded")
    checkpoint_uri: str
    submitted_at: float = Field(description="Controller clock (unix seconds as a service)")
    finished_at: float | None
    wall_s: float
    restart_overhead_s: float | None
    batch_size: int | None = Field(
        default=None, description="The batch size the job's last gang was told to train with (the goodput "
                                  "optimizer's pick; see the job's 'batch' events); null: the spec's global_batch_size")
    workers: list[Worker]
    spot_seconds: float
    on_demand_seconds: float
    deadline_met: bool | None = Field(
        default=None,
        description="Whether the job succeeded within objective.deadline (provider clock, from submission); "
                    "false when it ended otherwise; null with no deadline, while it runs, or when not recorded",
    )


class JobList(RootModel[list[JobSummary]]):
    """Every job the controller knows, oldest first."""


class JobEvent(_Answer):
    """One row of a job's history: a state transition (``kind == "state"``) or a note."""

    ts: float = Field(description="Controller clock")
    kind: str
    from_state: str
    to_state: str
    reason: str


class JobEvents(RootModel[list[JobEvent]]):
    """A job's events, in order."""


class Health(_Answer):
    """``ok`` to anyone; the rest only to a caller with the API token (absent otherwise)."""

    ok: bool
    controller_id: str | None = None
    uptime_s: float | None = None
    last_tick_error: str | None = None
    role: str | None = None  # "leader" or "standby" (a fleet of controllers on one database)


class LoginLink(_Answer):
    """A one-time login link to the dashboard (``spotrain dashboard``; ``server/login_links.py``)."""

    path: str = Field(description="The link's path on this controller (/ui/link?t=...); it logs in once")
    expires_in_s: float = Field(description="Seconds the link stays valid unused")


class ErrorBody(_Answer):
    """The body of every refusal: ``detail`` is the one line the CLI prints, ``error`` the type of
    ``autoscaler.errors`` (or of the provider's tree) it came from."""

    detail: str
    error: str = "HTTPException"


class SubmitRequest(BaseModel):
    spec: dict[str, Any] = Field(description="The job spec (v1), as ``spotrain submit`` read it")
    workdir: str = Field(description="Absolute directory on the controller's machine holding the job's code")
