"""``spotrain status`` and ``spotrain logs``: from the controller, or from SPOTRAIN_HOME when none runs.

After ``spotrain run`` (an embedded controller that has exited) or while the service is down, the
database under SPOTRAIN_HOME still holds every job, so both commands read it directly. A controller
that answers but refuses our token is an error, not a reason to fall back.
"""

from __future__ import annotations

from typing import Any

import click

from ..errors import ControllerUnreachable


def _controller_running() -> bool:
    """A live controller is recorded (a stale record of a killed one is not asked: its port may be
    someone else's now)."""
    from ..home import live_controller_info

    return live_controller_info() is not None


def _offline_jobs(job_ref: str | None, *, all_jobs: bool = False) -> Any:
    """The API's JSON from the database: a SQLite file read with ``sqlite3`` (fast), any other URL
    through the Store. A list: the live jobs and the ``RECENT_ENDED`` newest ended ones, or every
    job with ``all_jobs``."""
    from ..home import db_url
    from .offline import offline_summaries
    from .render import RECENT_ENDED

    recent = None if all_jobs else RECENT_ENDED
    found = offline_summaries(db_url(), job_ref, recent_ended=recent)
    if found is not None:
        return found
    from autoscaler.jobs.summary import job_summary
    from autoscaler.server.listing import MAX_LIMIT, job_page

    from ..errors import JobNotFound
    from ..state import Store

    store = Store(db_url())
    with store.session() as s:
        if job_ref is None:
            pages = [job_page(store, s, state="live", limit=MAX_LIMIT)]
            if recent is None:
                pages = [job_page(store, s, state="all", limit=MAX_LIMIT)]
                while pages[-1].next_offset is not None:
                    pages.append(job_page(store, s, state="all", limit=MAX_LIMIT, offset=pages[-1].next_offset))
            else:
                pages.append(job_page(store, s, state="ended", limit=recent, order="newest"))
            jobs = sorted((j for p in pages for j in p.jobs), key=lambda j: (j.submitted_at, j.job_id))
            return [j.to_json_dict() for j in jobs]
        j = store.job(s, job_ref)
        if j is None:
            raise JobNotFound(f"no job {job_ref!r}")
        return job_summary(j, store.instances(s, j.job_id)).to_json_dict()


@click.command("status")
@click.argument("job_ref", metavar="[JOB]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on the last line (a list without JOB).")
@click.option("--watch", is_flag=True, help="Redraw every 2 s (until JOB ends, or Ctrl-C); needs a running controller.")
@click.option("--all", "all_jobs", is_flag=True,
              help="List every job; without it, the live jobs and the 20 newest ended ones.")
def status_command(job_ref: str | None, as_json: bool, watch: bool, all_jobs: bool) -> None:
    """Show the live and recently ended jobs as a table (--all: every job), or one JOB (id or name) in detail."""
    if watch and _controller_running():
        from .follow import watch_status

        return watch_status(job_ref)
    from . import render

    # The CLI renders, and --json prints, exactly the JSON the API sends.
    data: Any = None
    if _controller_running():
        from autoscaler.client.http import Client

        try:
            c = Client()  # the *_json reads: no pydantic to import (issue 24)
            data = (c.job_json(job_ref) if job_ref else c.jobs_json("all") if all_jobs
                    else c.recent_jobs_json(render.RECENT_ENDED))
        except ControllerUnreachable:
            data = None
    if data is None:
        data = _offline_jobs(job_ref, all_jobs=all_jobs)
    if as_json:
        click.echo(render.as_json(data))
    elif job_ref is None:
        click.echo(render.table(data) if data else "no jobs")
    else:
        click.echo(render.table([data]))
        click.echo("")
        click.echo(render.summary(data))


@click.command("logs")
@click.argument("job_ref", metavar="JOB")
@click.option("--rank", type=int, default=None, help="Worker rank whose output to show (default 0).")
@click.option("-f", "--follow", "follow", is_flag=True, help="Stream events and worker output until JOB ends.")
def logs_command(job_ref: str, rank: int | None, follow: bool) -> None:
    """Show JOB's event history and its workers' output."""
    if follow and _controller_running():
        from .follow import follow_logs

        return follow_logs(job_ref, rank)
    text = None
    if _controller_running():
        from autoscaler.client.http import Client

        try:
            text = Client().logs(job_ref, rank=rank)
        except ControllerUnreachable:
            text = None
    if text is None:
        from ..home import db_url
        from .offline import offline_logs

        text = offline_logs(db_url(), job_ref, rank)
    if text is None:
        from autoscaler.client.logs import job_logs

        from ..home import db_url
        from ..state import Store

        text = job_logs(Store(db_url()), job_ref, rank=rank)
    click.echo(text, nl=False)
