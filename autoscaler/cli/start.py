"""Getting started: ``spotrain init [DIR]`` and ``spotrain validate SPEC`` (``submit --dry-run`` too).

``init`` writes a job spec and a training script (``templates.py``) that run as they are on the
local cloud; ``validate`` checks a spec as ``submit`` and ``run`` would, without a controller, and
says what the job asks for.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from autoscaler.jobs.spec import JobSpec


def _job_name(directory: Path) -> str:
    """A spec name (lower-case letters, digits, dashes) from the directory's name."""
    name = re.sub(r"[^a-z0-9-]+", "-", directory.resolve().name.lower()).strip("-")[:63].strip("-")
    return name or "my-job"


@click.command("init")
@click.argument("directory", metavar="[DIR]", default=".", type=click.Path(file_okay=False))
@click.option("--name", default=None, help="Job name (default: from DIR's name).")
@click.option("--force", is_flag=True, help="Overwrite job.yaml and train.py if they exist.")
def init_command(directory: str, name: str | None, force: bool) -> None:
    """Write a job.yaml and a train.py skeleton into DIR (default: here) that run as they are."""
    from autoscaler.jobs.spec import parse_spec_text

    from .templates import FILES

    target = Path(directory)
    name = name or _job_name(target)
    files = {fname: text.format(name=name) if fname.endswith(".yaml") else text for fname, text in FILES.items()}
    parse_spec_text(files["job.yaml"], source="--name")  # a bad --name is a spec error, before any write
    existing = [f for f in files if (target / f).exists()]
    if existing and not force:
        raise click.UsageError(f"{target / existing[0]} exists: not overwritten (use --force, or another DIR)")
    target.mkdir(parents=True, exist_ok=True)
    for fname, text in files.items():
        (target / fname).write_text(text)
    spec = target / "job.yaml"
    click.echo(f"wrote {spec} and {target / 'train.py'} (job {name!r}); next:\n"
               f"  spotrain validate {spec}\n  spotrain run {spec}        # on the local cloud\n"
               f"  spotrain estimate {spec}   # cost and finish time on the spot market")


def human_duration(seconds: float) -> str:
    """``2h``, ``90m``, ``45s``: the largest unit that divides the duration, else seconds."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def describe(spec: JobSpec, workdir: Path) -> list[str]:
    """What a valid spec asks for, a few lines for a person."""
    format_duration_s = human_duration
    o, r = spec.objective, spec.resources
    wants = ", ".join(str(a) for a in r.accelerators) or ", ".join(r.instance_types)
    return [
        f"job         {spec.name}: {spec.run}" + (f" (setup: {spec.setup})" if spec.setup else ""),
        f"workdir     {workdir}",
        f"resources   {wants} on {', '.join(r.clouds)}, spot {r.spot}; workers {spec.workers.min}-{spec.workers.max}",
        f"training    {spec.training.logical_workers} logical workers, global batch {spec.training.global_batch_size}, "
        f"{spec.training.determinism}",
        "objective   " + (f"deadline {format_duration_s(o.deadline_s)}" if o.deadline_s else "no deadline")
        + (f", budget ${o.budget_usd:g}" if o.budget_usd is not None else ", no budget"),
        f"checkpoint  every {format_duration_s(spec.checkpoint.interval_s)} to "
        + (spec.checkpoint.store or "SPOTRAIN_HOME/checkpoints (the default store)")
        + (f", {spec.checkpoint.size_gb:g} GB until measured (priced in every move between regions)"
           if spec.checkpoint.size_gb else ""),
        "envs        " + (", ".join(f"{k}={v}" for k, v in spec.envs.items()) or "-"),
    ]


def check_and_describe(spec_path: str, overrides: tuple[str, ...], as_json: bool, headline: str) -> None:
    from autoscaler.jobs.spec import load_spec

    from . import render

    spec, workdir = load_spec(spec_path, overrides=overrides)
    if as_json:
        click.echo(render.as_json({"valid": True, "spec": spec.to_dict(), "workdir": str(workdir)}))
        return
    click.echo(f"{spec_path}: {headline}")
    for line in describe(spec, workdir):
        click.echo(f"  {line}")


@click.command("validate")
@click.argument("spec_path", metavar="SPEC")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a spec field (value read as YAML).")
@click.option("--json", "as_json", is_flag=True, help="Print {valid, spec (normalised), workdir} as JSON.")
def validate_command(spec_path: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Check SPEC as submit and run would (exit 2 with the field on an error); contact nothing."""
    check_and_describe(spec_path, overrides, as_json, "valid")
