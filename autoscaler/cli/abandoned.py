"""``cancel`` and ``status`` with no controller, for the jobs of a ``spotrain run`` (issue 24).

A ``spotrain run`` that was killed leaves its job live in the database while its machines stop at a
checkpoint on their own (``cloud_providers/local/owner.py``). With no controller to ask, ``cancel``
settles such a job in the database itself (``fleet/runs.py``: under a claim on the dead run, its
leftover workers stopped, its bill ended when its machines stopped) and a run that still lives is
asked over the API it serves (the URL in its owner file), never a port the user did not choose.
``status`` says what became of such a job instead of showing it RUNNING as if nothing happened.
"""

from __future__ import annotations

from typing import Any

import click

from ..errors import Conflict, ControllerUnreachable, JobNotFound


def cancel_without_controller(job_ref: str) -> None:
    """``spotrain cancel JOB`` when no controller is recorded for this home (one line, exit 0 once
    JOB is cancelled or had ended; exit 3 for a job only its own controller can cancel)."""
    from autoscaler.fleet import runs

    from ..home import db_url, no_controller_message
    from ..state import JobState, Store

    store = Store(db_url())
    with store.session() as s:
        job = store.job(s, job_ref)
        if job is None:
            raise JobNotFound(f"no job {job_ref!r}")
        job_id, cid, state, submitted_at = job.job_id, job.controller_id, JobState(job.state), job.submitted_at
    if state.terminal:
        click.echo(f"{job_id}: {state.value} (it had already ended)")
        return
    if not runs.is_run(cid):
        raise ControllerUnreachable(f"{no_controller_message()}; {job_id} belongs to controller {cid}, "
                                    "which carries on with it once it runs")
    if not runs.owner_gone(cid, submitted_at):
        url = (runs.owner_info(cid) or {}).get("url")
        if not isinstance(url, str) or not url.startswith("http://127.0.0.1:"):
            raise ControllerUnreachable(f"{job_id} belongs to a `spotrain run` that is still starting; try again")
        from autoscaler.client.http import Client

        click.echo(f"{job_id}: {Client(url).cancel(job_id).state.value}")
        return
    done = runs.cancel_abandoned(store, job_id, cid)
    if done is None:
        raise Conflict(f"{job_id} is being settled by another spotrain command right now; try again")
    click.echo(f"{job_id}: {done['state']} (in the database: its spotrain run is gone, no controller runs; "
               "its workers are stopped and its instances released)")


def note_abandoned(summary: dict[str, Any], controller_id: str, submitted_at: float) -> None:
    """Say in ``summary`` (``status`` from the database) that a live job's ``spotrain run`` is gone."""
    from autoscaler.fleet import runs
    from cloud_providers.local.owner import CHECK_EVERY_S, STOP_GRACE_S

    if summary.get("state") in _ENDED or not runs.is_run(controller_id) or not runs.owner_gone(controller_id, submitted_at):
        return
    job_id = summary.get("job_id")
    summary["reason"] = (f"its spotrain run was killed: its workers stop at a checkpoint on their own (within "
                         f"{CHECK_EVERY_S + STOP_GRACE_S:g} s) and their bill ends then; continue it with "
                         f"`spotrain resume {job_id}`, or end it with `spotrain cancel {job_id}`")


_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET")
