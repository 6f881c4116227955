"""The worker protocol: how an instance starts the runtime, and how the runtime answers.

This is the contract between the controller (through a provider's executor) and ``runtime/``. The
runtime keeps its own copy of these names in ``runtime/protocol.py`` (the dependency rule forbids it to
import this package); a test checks the two agree.

Environment given to every worker process (torchrun-compatible, so the runtime also runs under plain
``torchrun`` where only the first six are set):

    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    SPOTRAIN_JOB_ID                job id (checkpoints live under <store>/<job_id>/)
    SPOTRAIN_ATTEMPT               launch attempt number of this gang (1, 2, ...)
    SPOTRAIN_CHECKPOINT_URI        <store>/<job_id>  (file://, s3:// or gs://)
    SPOTRAIN_CHECKPOINT_INTERVAL_S periodic checkpoint interval, seconds of wall time
    SPOTRAIN_CHECKPOINT_KEEP       how many checkpoints to keep
    SPOTRAIN_TRAINING_JSON         the spec's ``training`` section, as JSON
    SPOTRAIN_NOTICE_FILE           a file whose appearance is a notice (JSON body, see below)
    SPOTRAIN_PROGRESS_FILE         rank 0 atomically rewrites this JSON file with its progress
    SPOTRAIN_BATCH_JSON            optional: the batch configuration the controller chose for this gang,
                                   {"batch_size", "local_bsz", "accum_steps"}; every gang of a
                                   batch_policy: adaptive job gets one (the runtime then never changes
                                   the batch on its own); absent: the spec's batch
    SPOTRAIN_CHECKPOINT_KEY        optional: the job's checkpoint key (64 hex digits), issued by the
                                   controller (issue 21, finding 9): the runtime signs every manifest
                                   with HMAC-SHA256 under it and refuses, as corrupt, a checkpoint whose
                                   signature is missing or wrong (docs/formats.md). A secret: never
                                   logged, never in events, API answers or user data.

Notice file body: {"reason": "preemption"|"rebalance"|"rescale"|"cancel", "deadline_unix_s": float}.
On a notice every rank stops at the same next minibatch boundary, a checkpoint is written and the
process exits with EXIT_RESCHEDULE.

Progress file body: one JSON object, the :class:`ProgressRecord` below (every field optional; a
field may be null: not measured yet). What each field is:

    step, total_steps, epoch (int)      where training is; total_steps is the planned work
    loss, metric (float), metric_name   the last minibatch's loss; the spec's metric, once evaluated
    step_time_s, samples_per_s          seconds per optimizer step (moving average), its throughput
    world_size (int)                    ranks training now
    last_checkpoint_step (int), last_checkpoint_unix_s (float)
                                        the newest durable checkpoint, and when it became durable
    checkpoint_size_gb (float)          (issue 23) the newest checkpoint's size in GB (all its files),
                                        measured once written: what a move of the job's state to
                                        another region or cloud carries
    final_model (URI)                   where the final weights are
    grad_sqr, grad_var                  the gradient noise estimates, measured at and normalised to the
                                        spec's global_batch_size
    stall_s                             seconds training stood still for checkpoints, in total
    updated_unix_s                      when the file was written
    completed (bool)                    true once the final weights are durable and the planned work is
                                        done: with ``final_model``, the record the controller needs to
                                        call a job SUCCEEDED; workers that exit 0 without it fail the
                                        job as a user error
    stopped_at_notice (bool)            true once the workers checkpointed at a stop notice: they must
                                        now exit EXIT_RESCHEDULE
    batch_size, local_bsz, accum_steps  (issue 11) the batch configuration training at now
    batch_source                        (issue 20) "controller" when the gang follows
                                        SPOTRAIN_BATCH_JSON, "runtime" when it chose on its own
    progress_iterations (float)         scale-invariant progress (AdaScale): steps counted at the
                                        initial batch size
    lr_factor (float)                   the factor the learning rate is multiplied by at this batch
    profile                             a list with one object per configuration trained at, {nodes,
                                        replicas, local_bsz, accum_steps, step_time_s (seconds per
                                        optimizer step), sync_time_s (optional: the wait for gradient
                                        synchronisation after the backward pass)}, which the controller
                                        fits its goodput model to

``PROGRESS_FIELDS`` names each field's JSON kind; :func:`parse_progress` checks a body against it
where the executor reads the file (a wrong kind makes the whole record invalid: the executor logs one
line and reads it as absent, as it does a missing file). Fields it does not know are kept, so that a newer runtime can
report more than this controller reads.
"""

from __future__ import annotations

from typing import Any, TypedDict

from .errors import ProviderError

# Exit status of a worker that finished training: final weights are written.
EXIT_DONE = 0
# Exit status of a worker that checkpointed on a notice or directive: "reschedule me".
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


class ProgressError(ProviderError, ValueError):
    """A progress file's body is not a progress record (names the field and what it holds)."""


def _kind_ok(kind: str, value: object) -> bool:
    if value is None:
        return True
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):  # JSON true is no number
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, (int, float))
    if kind == "str":
        return isinstance(value, str)
    return isinstance(value, list) and all(isinstance(row, dict) for row in value)


def parse_progress(body: object) -> ProgressRecord:
    """``body`` (a decoded progress file) as a :class:`ProgressRecord`; raises :class:`ProgressError`
    naming the first field whose value is not of its kind."""
    if not isinstance(body, dict):
        raise ProgressError(f"progress: expected an object, got {type(body).__name__}")
    for name, kind in PROGRESS_FIELDS.items():
        if name in body and not _kind_ok(kind, body[name]):
            raise ProgressError(f"progress field {name}: expected {kind}, got {body[name]!r:.60}")
    record: ProgressRecord = body  # type: ignore[assignment]  # checked field by field above
    return record
