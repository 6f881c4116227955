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


def parse_states(text: str | None) -> list[str] | None:
    """``--state RUNNING,failed``: the job states named (upper case, sorted); None without the
    option. A name that is no job state is a one-line usage error naming it and the states."""
    if text is None:
        return None
    from autoscaler.jobs.domain import JobState

    names = [n.strip().upper() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in JobState.__members__]
    if bad or not names:
        what = f"{', '.join(bad)} is not a job state" if bad else "no state named"
        raise click.BadParameter(f"{what} (one of {', '.join(s.value for s in JobState)}, comma-separated)",
                                 param_hint="'--state'")
    return sorted(set(names))


def _offline_jobs(job_ref: str | None, *, all_jobs: bool = False, states: list[str] | None = None) -> Any:
    """The API's JSON from the database: a SQLite file read with ``sqlite3`` (fast), any other URL
    through the Store. A list: the live jobs and the ``RECENT_ENDED`` newest ended ones, or every
    job with ``all_jobs``; only those in ``states`` when given."""
    from ..home import db_url
    from .offline import offline_summaries
    from .render import RECENT_ENDED

    recent = None if all_jobs else RECENT_ENDED
    found = offline_summaries(db_url(), job_ref, recent_ended=recent, states=states)
    if found is not None:
        return found
    from autoscaler.jobs.summary import job_summary
    from autoscaler.server.listing import MAX_LIMIT, job_page

    from ..errors import JobNotFound
    from ..state import Store

    store = Store(db_url())
    with store.session() as s:
        if job_ref is None:
            from autoscaler.client.http import live_and_ended_selectors

            live_sel, ended_sel = live_and_ended_selectors(states)
            pages = []
            if recent is None:
                picked = "all" if states is None else ",".join(states)
                pages = [job_page(store, s, state=picked, limit=MAX_LIMIT)]
                while pages[-1].next_offset is not None:
                    pages.append(job_page(store, s, state=picked, limit=MAX_LIMIT, offset=pages[-1].next_offset))
            else:
                if live_sel is not None:
                    pages.append(job_page(store, s, state=live_sel, limit=MAX_LIMIT))
                    while pages[-1].next_offset is not None:
                        pages.append(job_page(store, s, state=live_sel, limit=MAX_LIMIT, offset=pages[-1].next_offset))
                if ended_sel is not None and recent > 0:
                    pages.append(job_page(store, s, state=ended_sel, limit=recent, order="newest"))
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
              help="List every job; without it, the live jobs and the 10 newest ended ones.")
@click.option("--state", "state_text", metavar="STATE[,STATE...]",
              help="Only jobs in these states (e.g. RUNNING,FAILED); with --all every such job.")
def status_command(job_ref: str | None, as_json: bool, watch: bool, all_jobs: bool, state_text: str | None) -> None:
    """Show the live and recently ended jobs as a table (--all: every job), or one JOB (id or name) in detail."""
    states = parse_states(state_text)
    if job_ref is not None and (states is not None or all_jobs):
        raise click.UsageError("--state and --all choose jobs to list; not with JOB")
    if watch and _controller_running():
        from .follow import watch_status

        return watch_status(job_ref, states=states, all_jobs=all_jobs)
    from . import render

    # The CLI renders, and --json prints, exactly the JSON the API sends.
    data: Any = None
    if _controller_running():
        from autoscaler.client.http import Client

        try:
            c = Client()  # the *_json reads: no pydantic to import (issue 24)
            data = (c.job_json(job_ref) if job_ref
                    else c.jobs_json("all" if states is None else ",".join(states)) if all_jobs
                    else c.recent_jobs_json(render.RECENT_ENDED, states))
        except ControllerUnreachable:
            data = None
    if data is None:
        data = _offline_jobs(job_ref, all_jobs=all_jobs, states=states)
    if as_json:
        click.echo(render.as_json(data))
    elif job_ref is None:
        click.echo(render.table(data, render.terminal_width()) if data else _no_jobs(states))
    else:
        click.echo(render.table([data], render.terminal_width()))
        click.echo("")
        click.echo(render.summary(data))


def _no_jobs(states: list[str] | None) -> str:
    return "no jobs" if states is None else f"no jobs in state {', '.join(states)}"


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
