"""``spotrain submit`` and ``spotrain cancel``: talk to the running controller over HTTP.

Only to this home's live controller (or ``SPOTRAIN_CONTROLLER_URL``): without one ``submit`` exits 3
with "no controller is running for SPOTRAIN_HOME=..." and contacts nothing; ``cancel`` then settles a
job of a ``spotrain run`` that is gone in the database (``abandoned.py``).
"""

from __future__ import annotations

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
@click.argument("job_ref", metavar="JOB")
def cancel_command(job_ref: str) -> None:
    """Cancel JOB (id or name) and release its instances. With no controller running, a job of a
    `spotrain run` that is gone is cancelled in the database (its leftover workers stopped)."""
    try:
        _require_controller()
    except ControllerUnreachable:
        from .abandoned import cancel_without_controller

        return cancel_without_controller(job_ref)
    from autoscaler.client.http import Client

    job = Client().cancel(job_ref)
    click.echo(f"{job.job_id}: {job.state.value}")


def _require_controller() -> None:
    """With no live controller recorded (and no SPOTRAIN_CONTROLLER_URL) say so at once, before the
    HTTP client is even imported: ``cancel`` answers in a fraction of a second either way, and no
    default port is ever contacted (``client/http.py``'s ``controller_url``)."""
    import os

    from ..home import live_controller_info, no_controller_message

    if not os.environ.get("SPOTRAIN_CONTROLLER_URL") and live_controller_info() is None:
        raise ControllerUnreachable(no_controller_message())
