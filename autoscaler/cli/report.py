"""``spotrain report JOB``: the job's picture as a PNG (``autoscaler/client/report.py``).

From the running controller when one answers (``GET /v1/jobs/JOB/report.png``), else drawn here from
the database under SPOTRAIN_HOME (after ``spotrain run``). matplotlib is imported by this command
alone, and only when it draws.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("report")
@click.argument("job_ref", metavar="JOB")
@click.option("-o", "--output", "output", default=None, metavar="FILE.png",
              help="Where to write the picture (default: JOB_ID-report.png in the current directory).")
def report_command(job_ref: str, output: str | None) -> None:
    """Write JOB's report picture: progress against the deadline, workers by market, preemptions and
    restarts, cumulative cost against on-demand."""
    from ..errors import ControllerUnreachable
    from ..home import live_controller_info

    png: bytes | None = None
    job_id = job_ref
    if live_controller_info() is not None:
        from autoscaler.client.http import Client

        try:
            c = Client()
            job_id = c.job(job_ref).job_id
            png = c.report_png(job_id)
        except ControllerUnreachable:
            png = None
    if png is None:
        from autoscaler.client.report import gather, render_png

        from ..home import db_url
        from ..state import Store

        data = gather(Store(db_url()), job_ref)
        job_id = data.job_id
        png = render_png(data)
    path = Path(output or f"{job_id}-report.png")
    path.write_bytes(png)
    click.echo(f"wrote {path} ({len(png) // 1024} KiB)")


command = report_command
