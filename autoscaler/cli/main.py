"""Entry point of ``spotrain``: a click group whose commands are imported lazily (fast ``--help``).

Any ``SpotrainError`` (bad spec, unreachable controller, wrong token, unknown job) is printed as one
line on stderr with a non-zero exit; no traceback reaches the user.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

COMMANDS = {
    "run": ("autoscaler.cli.run", "Run a job and follow it to the end (on the started controller, else an embedded "
                                  "one on the local cloud); --detach returns at once."),
    "controller": ("autoscaler.cli.controller", "Start (--daemon: in the background), stop or check the controller service."),
    "init": ("autoscaler.cli.start", "Write a job.yaml and train.py skeleton that run as they are."),
    "validate": ("autoscaler.cli.start", "Check a job spec without running it."),
    "offerings": ("autoscaler.cli.offerings", "List offerings with on-demand and spot prices and availability."),
    "submit": ("autoscaler.cli.jobs", "Submit a job to the running controller (--dry-run: validate only)."),
    "status": ("autoscaler.cli.inspect", "Show the live and the 10 newest ended jobs (--all, --state), or one job."),
    "logs": ("autoscaler.cli.inspect", "Show a job's events and worker output."),
    "cancel": ("autoscaler.cli.jobs", "Cancel a job (--all: every live job) and release its instances."),
    "estimate": ("autoscaler.cli.estimate", "Predict a job's cost and finish time from the simulator."),
    "simulate": ("autoscaler.cli.simulate", "Replay a market trace with a policy in virtual time."),
    "tune": ("autoscaler.cli.tune",
             "Tune the policy's parameters on a market trace (Optuna); report them on its held-back part."),
    "dashboard": ("autoscaler.cli.dashboard", "Print (--open: open) a one-time login link to the controller's dashboard."),
    "report": ("autoscaler.cli.report", "Write a job's report picture (PNG): progress, workers by market, cost."),
    "attach": ("autoscaler.cli.attach", "Follow a job with live progress (Ctrl-C detaches)."),
    "resume": ("autoscaler.cli.attach", "Start a cancelled or failed job again from its last checkpoint."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        cmd = getattr(module, f"{name}_command", None) or module.command
        return cmd  # type: ignore[no-any-return]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(n, h) for n, (_, h) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option("0.1.0", prog_name="spotrain")
def cli() -> None:
    """spotrain: train on spot GPUs without losing work, missing deadlines or changing what the model learns."""


def main(argv: list[str] | None = None) -> Any:
    from ..errors import SpotrainError

    try:
        return cli.main(args=argv, prog_name="spotrain", standalone_mode=False)
    except SpotrainError as exc:
        click.echo(f"spotrain: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("spotrain: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"spotrain: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        click.echo(f"spotrain: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
        sys.exit(1)
    except Exception as exc:
        if type(exc).__module__.startswith("sqlalchemy"):
            # A bad SPOTRAIN_DB_URL or an unreadable database: one line, not a traceback.
            first = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            click.echo(f"spotrain: the state database is not usable ({type(exc).__name__}: {first}); "
                       "check SPOTRAIN_DB_URL and SPOTRAIN_HOME", err=True)
            sys.exit(1)
        raise
    except KeyboardInterrupt:
        click.echo("spotrain: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
