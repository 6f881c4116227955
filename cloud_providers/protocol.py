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

Progress file body (all optional but ``step``): step, total_steps, epoch, loss, metric (float),
metric_name, step_time_s, samples_per_s, world_size, last_checkpoint_step, final_model (URI),
grad_sqr, grad_var, stall_s, updated_unix_s, completed (true once the final weights are durable and
the planned work is done: with ``final_model``, the record the controller needs to call a job
SUCCEEDED; workers that exit 0 without it fail the job as a user error), stopped_at_notice (true once
the workers checkpointed at a stop notice: they must now exit EXIT_RESCHEDULE); and (issue 11)
batch_size, local_bsz, accum_steps (the batch configuration training at now), batch_source (issue 20:
"controller" when the gang follows SPOTRAIN_BATCH_JSON, "runtime" when it chose on its own) and profile: a list with
one object per configuration trained at, {nodes, replicas, local_bsz, accum_steps, step_time_s
(seconds per optimizer step), sync_time_s (optional: the wait for gradient synchronisation after the
backward pass)}, which the controller fits its goodput model to. grad_sqr and grad_var are measured
at, and normalised to, the spec's global_batch_size.
"""

from __future__ import annotations

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
