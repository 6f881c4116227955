"""``cancel`` and ``status`` with no controller, for the jobs of a ``spotrain run`` (issue 24).

A ``spotrain run`` that was killed leaves its job live in the database while its machines stop at a
checkpoint on their own (``cloud_providers/local/owner.py``). With no controller to ask, ``cancel``
settles such a job in the database itself (``fleet/runs.py``: under a claim on the dead run, its
leftover workers stopped, its bill ended when its machines stopped) and a run that still lives is
asked over the API it serves (the URL in its owner file), never a port the user did not choose.
``status`` says what became of such a job instead of showing it RUNNING as if nothing happened
(``fleet/runs.note_abandoned``).
"""

from __future__ import annotations

import click

from ..errors import Conflict, ControllerUnreachable, JobNotFound


def cancel_without_controller(job_ref: str) -> None:
    """``spotrain cancel JOB`` when no controller is recorded for this home: one line, exit 0 once JOB
    is cancelled (or had ended already); exit 3 for a job only its own controller can cancel. The job
    is looked up as ``status`` does (nothing heavy imported unless there is a run to settle)."""
    from autoscaler.fleet import runs

    from ..home import no_controller_message

    job_id, cid, state, submitted_at = _find(job_ref)
    if state in _ENDED:
        click.echo(f"{job_id}: {state} (it had already ended)")
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
    from ..home import db_url
    from ..state import Store

    done = runs.cancel_abandoned(Store(db_url()), job_id, cid)
    if done is None:
        raise Conflict(f"{job_id} is being settled by another spotrain command right now; try again")
    click.echo(f"{job_id}: {done['state']} (in the database: its spotrain run is gone, no controller runs; "
               "its workers are stopped and its instances released)")


def _find(job_ref: str) -> tuple[str, str, str, float]:
    """JOB's id, controller, state and submission time, from the database (``JobNotFound`` if none)."""
    from ..home import db_url
    from .offline import OfflineDb, sqlite_path

    path = sqlite_path(db_url())
    if path is not None:
        row = OfflineDb(path).job(job_ref)
        return row.job_id, row.controller_id, row.state, row.submitted_at
    from ..state import Store

    store = Store(db_url())
    with store.session() as s:
        job = store.job(s, job_ref)
        if job is None:
            raise JobNotFound(f"no job {job_ref!r}")
        return job.job_id, job.controller_id, job.state, job.submitted_at


_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET")
