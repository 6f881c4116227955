"""The runtime's side of the worker protocol (see ``cloud_providers/protocol.py`` for the contract).

Duplicated here on purpose (names, notice reasons and the progress record's fields): ``runtime`` may
import only ``cost_models``. ``tests/test_layout.py`` checks that both copies agree.
"""

from __future__ import annotations

from typing import Any, TypedDict

EXIT_DONE = 0
EXIT_RESCHEDULE = 85

ENV_JOB_ID = "SPOTRAIN_JOB_ID"
ENV_ATTEMPT = "SPOTRAIN_ATTEMPT"
ENV_CHECKPOINT_URI = "SPOTRAIN_CHECKPOINT_URI"
ENV_CHECKPOINT_INTERVAL_S = "SPOTRAIN_CHECKPOINT_INTERVAL_S"
ENV_CHECKPOINT_KEEP = "SPOTRAIN_CHECKPOINT_KEEP"
ENV_TRAINING_JSON = "SPOTRAIN_TRAINING_JSON"
ENV_NOTICE_FILE = "SPOTRAIN_NOTICE_FILE"
ENV_PROGRESS_FILE = "SPOTRAIN_PROGRESS_FILE"
ENV_BATCH_JSON = "SPOTRAIN_BATCH_JSON"
ENV_CHECKPOINT_KEY = "SPOTRAIN_CHECKPOINT_KEY"

NOTICE_PREEMPTION = "preemption"
NOTICE_REBALANCE = "rebalance"
NOTICE_RESCALE = "rescale"
NOTICE_CANCEL = "cancel"

# The progress record's fields and their JSON kinds ("int": an integer, "number": an integer or a
# float, "str", "bool", "list": a list of objects). The runtime's copy must be equal (tests/test_layout.py).
PROGRESS_FIELDS = {
    "step": "int", "total_steps": "int", "epoch": "int", "loss": "number", "metric": "number",
    "metric_name": "str", "step_time_s": "number", "samples_per_s": "number", "world_size": "int",
    "last_checkpoint_step": "int", "last_checkpoint_unix_s": "number", "checkpoint_size_gb": "number",
    "final_model": "str",
    "grad_sqr": "number", "grad_var": "number", "stall_s": "number", "updated_unix_s": "number",
    "completed": "bool", "stopped_at_notice": "bool", "batch_size": "int", "local_bsz": "int",
    "accum_steps": "int", "batch_source": "str", "progress_iterations": "number", "lr_factor": "number",
    "profile": "list",
}


class ProgressRecord(TypedDict, total=False):
    """Rank 0's progress file, typed (the module docstring says what each field means)."""

    step: int | None
    total_steps: int | None
    epoch: int | None
    loss: float | None
    metric: float | None
    metric_name: str | None
    step_time_s: float | None
    samples_per_s: float | None
    world_size: int | None
    last_checkpoint_step: int | None
    last_checkpoint_unix_s: float | None
    checkpoint_size_gb: float | None
    final_model: str | None
    grad_sqr: float | None
    grad_var: float | None
    stall_s: float | None
    updated_unix_s: float | None
    completed: bool | None
    stopped_at_notice: bool | None
    batch_size: int | None
    local_bsz: int | None
    accum_steps: int | None
    batch_source: str | None
    progress_iterations: float | None
    lr_factor: float | None
    profile: list[dict[str, Any]] | None
