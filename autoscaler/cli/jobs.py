"""``spotrain submit`` and ``spotrain cancel``: talk to the running controller over HTTP.

Only to this home's live controller (or ``SPOTRAIN_CONTROLLER_URL``): without one ``submit`` exits 3
with "no controller is running for SPOTRAIN_HOME=..." and contacts nothing; ``cancel`` then settles a
job of a ``spotrain run`` that is gone in the database (``abandoned.py``).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import ControllerUnreachable


@click.command("submit")
@click.argument("spec_path", metavar="SPEC")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a spec field (value read as YAML).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON on the last line.")
@click.option("--dry-run", is_flag=True, help="Validate SPEC and show what would be submitted; contact no controller.")
def submit_command(spec_path: str, overrides: tuple[str, ...], as_json: bool, dry_run: bool) -> None:
    """Validate SPEC and submit it to the controller."""
    if dry_run:
        from .start import check_and_describe

        check_and_describe(spec_path, overrides, as_json, "valid; dry run, nothing submitted")
        return
    from autoscaler.client.http import Client
    from autoscaler.jobs.spec import load_spec

    from . import render

    spec, workdir = load_spec(spec_path, overrides=overrides)  # a bad spec is said first, controller or not
    job = Client().submit(spec.to_dict(), str(workdir))
    if as_json:
        click.echo(render.as_json(job.to_json_dict()))
    else:
        click.echo(f"submitted {job.job_id} ({job.state.value}); follow it with: spotrain status {job.job_id}")


@click.command("cancel")
@click.argument("job_ref", metavar="[JOB]", required=False)
@click.option("--all", "all_jobs", is_flag=True,
              help="Cancel every live job of this home's controller (asks nothing; prints each).")
def cancel_command(job_ref: str | None, all_jobs: bool) -> None:
    """Cancel JOB (id or name), or every live job with --all, and release its instances. With no
    controller running, a job of a `spotrain run` that is gone is cancelled in the database (its
    leftover workers stopped)."""
    if (job_ref is None) == (not all_jobs):
        raise click.UsageError("name one JOB to cancel, or --all for every live job" if job_ref is None
                               else "name one JOB or --all, not both")
    try:
        _require_controller()
    except ControllerUnreachable:
        if job_ref is None:
            raise
        from .abandoned import cancel_without_controller

        return cancel_without_controller(job_ref)
    from autoscaler.client.http import Client

    client = Client()
    if job_ref is not None:
        job = client.cancel(job_ref)
        click.echo(f"{job.job_id}: {job.state.value}")
        return
    cancel_all(client)


def cancel_all(client: Any) -> None:
    """``cancel --all``: each live job cancelled in turn, one line each; a job another controller
    owns (or one that ended meanwhile) is said and skipped, and makes the exit status 1."""
    from ..errors import SpotrainError

    live = client.jobs_json("live")
    if not live:
        click.echo("no live jobs to cancel")
        return
    refused = 0
    for j in live:
        try:
            job = client.cancel(j["job_id"])
        except SpotrainError as exc:
            refused += 1
            click.echo(f"{j['job_id']}: not cancelled: {exc}")
            continue
        if job.state.value == "CANCELLED":
            click.echo(f"{job.job_id}: CANCELLED")
        elif job.state.terminal:
            click.echo(f"{job.job_id}: {job.state.value} (it had ended before the cancel)")
        else:  # a standby controller records the request; the leader ends the job
            click.echo(f"{job.job_id}: {job.state.value} (cancel requested)")
    if refused:
        sys.exit(1)


def _require_controller() -> None:
    """With no live controller recorded (and no SPOTRAIN_CONTROLLER_URL) say so at once, before the
    HTTP client is even imported: ``cancel`` answers in a fraction of a second either way, and no
    default port is ever contacted (``client/http.py``'s ``controller_url``)."""
    import os

    from ..home import live_controller_info, no_controller_message

    if not os.environ.get("SPOTRAIN_CONTROLLER_URL") and live_controller_info() is None:
        raise ControllerUnreachable(no_controller_message())
