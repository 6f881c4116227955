"""``spotrain resume JOB``: start a cancelled or failed job again from its last checkpoint.

An ended job stays ended (a terminal state is final, ``jobs/domain.py``); resuming submits a new job with
the same spec, work directory and name, whose checkpoint URI is the old job's: its workers restore
the newest durable checkpoint there, as after a preemption. Both jobs get an event naming the other.
The new job starts at the old one's checkpoint step, so its progress never reads as lost work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoscaler.controller import Controller
from autoscaler.errors import Conflict, JobNotFound
from autoscaler.fleet.runs import settle_if_abandoned
from autoscaler.jobs.domain import JobState
from autoscaler.jobs.spec import spec_from_stored
from autoscaler.state import Job

RESUMABLE = frozenset({JobState.CANCELLED, JobState.FAILED, JobState.FAILED_BUDGET, JobState.FAILED_NO_RESOURCE})


class NotResumable(Conflict):
    """The job is live (nothing to resume) or succeeded (nothing left to do)."""


def resume_job(ctl: Controller, ref: str) -> dict[str, Any]:
    """Submit the continuation of ended job ``ref`` to ``ctl``; the new job's summary."""
    store = ctl.store
    settle_if_abandoned(store, ref)  # a live job of a killed `spotrain run` ends first (FAILED), then resumes
    with store.session() as s:
        old = store.job(s, ref)
        if old is None:
            raise JobNotFound(f"no job {ref!r}")
        state = JobState(old.state)
        if state not in RESUMABLE:
            why = "it is still running" if not state.terminal else "it succeeded"
            raise NotResumable(f"{old.job_id} cannot be resumed: {why} ({state.value})")
        spec = spec_from_stored(json.loads(old.spec_json))
        old_id, workdir, uri, key = old.job_id, Path(old.workdir), old.checkpoint_uri, old.checkpoint_key
        ckpt, total = old.last_checkpoint_step, old.total_steps
    # Under the controller's lock: no tick may start the new job's workers before they are told
    # where the checkpoints are.
    with ctl.exclusive():
        new = ctl.submit(spec, workdir)
        with store.session() as s:
            job = s.get(Job, new["job_id"])
            old_row = s.get(Job, old_id)
            assert job is not None and old_row is not None
            job.checkpoint_uri = uri
            job.checkpoint_key = key  # the checkpoints there are signed with it (or unsigned: "")
            job.step = ckpt or 0
            job.last_checkpoint_step = ckpt
            job.total_steps = total
            where = f"its checkpoint at step {ckpt}" if ckpt else "the start (it had no durable checkpoint)"
            ctl.ctx.note(s, job, "resumed", f"continues {old_id} from {where}")
            ctl.ctx.note(s, old_row, "resumed", f"continued as {job.job_id}")
        return ctl.job_info(new["job_id"])
