"""``spotrain attach JOB`` and ``spotrain resume JOB``: come back to a job, or start an ended one again.

``attach`` follows a job on whatever controller runs it (a service, or another terminal's
``spotrain run``) with the same live progress line as ``run``; Ctrl-C detaches and leaves the job
running. With no controller it contacts nothing (no default port): a job that has ended is shown
from the database, as ``status`` shows it. ``resume`` asks the controller service to continue a
cancelled or failed job from its last checkpoint (``autoscaler/server/resume.py``), starting one in
the background on the local cloud if none runs.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

import click

from ..errors import ControllerUnreachable

if TYPE_CHECKING:
    from autoscaler.client.http import Client


@click.command("attach")
@click.argument("job_ref", metavar="JOB")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON on the last line when it ends.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def attach_command(job_ref: str, as_json: bool, quiet: bool) -> None:
    """Follow JOB to its end with live progress; Ctrl-C detaches (the job keeps running). A job that
    has ended is shown from the database when no controller runs."""
    from . import render
    from .follow import Follower, HttpSource, follow
    from .progress import make_view

    out = sys.stderr if as_json else sys.stdout
    try:
        client = _client()
        job = client.job(job_ref)
    except ControllerUnreachable as exc:
        return _ended_from_database(job_ref, exc, out, as_json=as_json)
    view = make_view(out, t0=job.submitted_at, quiet=quiet)
    view.line_of(job.job_id, _batch_size(client, job.job_id))
    view.say(f"spotrain: attached to {job.job_id} on {client.url} (Ctrl-C detaches; the job keeps running)")
    try:
        final = follow(Follower(HttpSource(client, job.job_id), view))
    except KeyboardInterrupt:
        view.close()
        click.echo(f"spotrain: detached from {job.job_id}; it keeps running (spotrain attach {job.job_id})", err=True)
        sys.exit(130)
    view.close()
    click.echo("", file=out)
    click.echo(render.summary(final), file=out)
    if as_json:
        click.echo(render.as_json(final))
    if final["state"] != "SUCCEEDED":
        sys.exit(1)


def _client() -> Client:
    """A client of this home's controller; ``ControllerUnreachable`` when there is none, said before
    the HTTP client is even imported (``jobs._require_controller``)."""
    from .jobs import _require_controller

    _require_controller()
    from autoscaler.client.http import Client

    return Client()


def _ended_from_database(job_ref: str, unreachable: ControllerUnreachable, out: TextIO, *, as_json: bool) -> None:
    """``attach`` with no controller to follow: an ended job's outcome from the database (as
    ``status`` and ``logs`` read it), with attach's exit status; a job still live there cannot be
    followed, and ``unreachable`` says why (exit 3)."""
    from . import render
    from .follow import TERMINAL
    from .inspect import _offline_jobs

    job = _offline_jobs(job_ref)
    if job["state"] not in TERMINAL:
        raise ControllerUnreachable(f"{unreachable}; {job['job_id']} is {job['state']} and carries on once one runs")
    click.echo(f"spotrain: {job['job_id']} has ended (from the database: no controller runs for this home)", file=out)
    click.echo("", file=out)
    click.echo(render.summary(job), file=out)
    if as_json:
        click.echo(render.as_json(job))
    if job["state"] != "SUCCEEDED":
        sys.exit(1)


def _batch_size(client: object, job_id: str) -> int | None:
    from ..errors import SpotrainError

    try:
        size = client.spec(job_id).get("training", {}).get("global_batch_size")  # type: ignore[attr-defined]
    except SpotrainError:
        return None
    return size if isinstance(size, int) and size > 0 else None


@click.command("resume")
@click.argument("job_ref", metavar="JOB")
@click.option("--attach", "then_attach", is_flag=True, help="Follow the resumed job (as spotrain attach).")
@click.option("--json", "as_json", is_flag=True, help="Print the new job as JSON on the last line.")
def resume_command(job_ref: str, then_attach: bool, as_json: bool) -> None:
    """Start cancelled or failed JOB again from its last checkpoint, as a new job of the same name."""
    from . import render
    from .follow import service_client

    client = service_client()
    if client is None:
        from autoscaler.client.http import Client

        from .controller import start_daemon

        url, log = start_daemon(["--cloud", "local", "--port", "0"])
        click.echo(f"spotrain: started a controller in the background on {url} (log: {log})", err=True)
        client = Client(url)
    job = client.resume(job_ref)
    if as_json:
        click.echo(render.as_json(job.to_json_dict()))
    else:
        ckpt = job.last_checkpoint_step
        start = f"from its checkpoint at step {ckpt}" if ckpt else "from the start (no durable checkpoint)"
        click.echo(f"resumed {job_ref} as {job.job_id} {start}; follow it with: spotrain attach {job.job_id}")
    if then_attach:
        time.sleep(0.2)
        attach_command.main(args=[job.job_id], standalone_mode=False)


command = attach_command
