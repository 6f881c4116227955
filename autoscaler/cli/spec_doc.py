"""``docs/spec.md``, the job spec reference, generated from the pydantic model (``spec.JobSpec``).

    python -m autoscaler.cli.spec_doc > docs/spec.md

Every field of the model needs an entry in ``DESCRIPTIONS`` (the generator refuses to run without
one), and ``tests/test_cli_getting_started.py`` checks that docs/spec.md is what this writes: a field
added to the model without its documentation fails the tests.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from autoscaler.jobs.spec import MAX_COMMAND_BYTES, MAX_DEPTH, MAX_SPEC_BYTES, JobSpec

from .start import human_duration
from .templates import JOB_YAML

DESCRIPTIONS: dict[str, str] = {
    "name": "Job name: lower-case letters, digits and dashes, at most 63; unique among live jobs.",
    "workdir": "Directory the commands run in, relative to the spec file (shipped to the instances).",
    "setup": "Shell command run once per worker start before `run` (e.g. `pip install -r requirements.txt`).",
    "run": "Shell command of every worker; the runtime reads its settings from the environment.",
    "envs": "Environment variables for every worker and for `setup` (`{EPOCHS: 3}`; values are read as "
            "strings, `true`/`false` as `true`/`false`). Names the controller sets (`SPOTRAIN_*`, `RANK`, "
            "`WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) are refused.",
    "resources": "What each physical worker runs on.",
    "resources.accelerators": "Acceptable per-worker accelerators as `NAME:COUNT` (`[V100:1, A10G:1]`); "
                              "names are case-insensitive, from the catalog.",
    "resources.instance_types": "Acceptable instance types instead of (or besides) accelerators.",
    "resources.clouds": "Clouds the job may use: `aws`, `gcp`, `local`.",
    "resources.regions": "Regions the job may use (empty: any).",
    "resources.spot": "`auto`: spot when it pays and the deadline allows; `always`; `never`.",
    "workers": "How many physical workers (instances x GPUs) the job may hold at once.",
    "workers.min": "At least this many, or the job waits.",
    "workers.max": "At most this many; at most `training.logical_workers`.",
    "training": "What the model learns: fixed however many physical workers run it.",
    "training.logical_workers": "Logical workers; each physical worker runs a share of them.",
    "training.global_batch_size": "Samples per optimizer step, a multiple of `logical_workers`.",
    "training.batch_policy": "`fixed` (accuracy-consistent) or `adaptive` (Pollux goodput).",
    "training.lr_scaling": "Learning-rate rule when the batch size changes: `adascale`, `sqrt`, `linear`, `none`.",
    "training.max_batch_size": ("Largest global batch `adaptive` may use (at least `global_batch_size`); default "
                                "`global_batch_size` x `logical_workers`, for the controller and the runtime alike."),
    "training.max_local_batch_size": "Most samples one GPU processes at once (its memory limit); optional. "
                                      "`adaptive` picks per-GPU batches within it, and a larger per-GPU share "
                                      "is split into accumulated chunks.",
    "training.determinism": "`bitwise`: the same weights whatever the workers and preemptions; `fast`.",
    "training.seed": "Seed of every generator (data order, augmentation, initialisation).",
    "objective": "What the policy plans for.",
    "objective.deadline": "Finish within this long of submission (a duration: `36h`); `deadline_met` says "
                          "whether it did.",
    "objective.budget_usd": "Hard cap in US dollars, never exceeded (the job ends FAILED_BUDGET first).",
    "checkpoint": "Where and how often the runtime checkpoints (besides on every notice).",
    "checkpoint.store": "`file:///absolute/path`, `s3://bucket/prefix` or `gs://bucket/prefix` (default: "
                        "`SPOTRAIN_HOME/checkpoints`); a job's checkpoints live under `<store>/<job_id>/`. Checked at "
                        "submit with the rule the workers apply (no `?`, `#`, `%`, `.`/`..`/empty segments; S3/GCS "
                        "bucket naming rules): [formats.md](formats.md#checkpoints).",
    "checkpoint.interval": "Periodic checkpoint interval (a duration).",
    "checkpoint.keep": "How many checkpoints to keep.",
    "checkpoint.size_gb": "The checkpoint's size in GB until the runtime has measured it (it reports "
                          "`checkpoint_size_gb` once it has checkpointed, which then replaces this). A move of the job "
                          "to another region or cloud carries it: egress at the cloud's list price (AWS $0.02/GB between "
                          "regions, GCP $0.02/GB within a continent, $0.09-0.12/GB between clouds: "
                          "`cloud_providers/catalog.py`) and about an hour of transfer per 4 TB, which the policy weighs "
                          "against the move's saving and the controller bills into the job's cost (`egress_usd`).",
    "retries": "Restarts after user-code failures (infrastructure failures are always recovered).",
    "retries.max_restarts_on_errors": "Restarts after a worker exits with an error; a failure before the "
                                      "first step that repeats with the same exit code is not retried again.",
    "simulate": "Used only by `spotrain estimate` and `spotrain simulate`.",
    "simulate.work_gpu_hours": "Hours of work on one reference GPU at the initial batch size "
                               "(`estimate` says when it uses the default).",
    "simulate.scaling": "Throughput over workers: `linear`, `{serial_fraction: 0.05}` or `{profile: PATH}`.",
}

# Types as a person writes them, where the annotation would mislead (durations are floats inside).
TYPES = {
    "objective.deadline": "duration", "checkpoint.interval": "duration",
    "resources.accelerators": "list of NAME:COUNT",
    "simulate.scaling": "`linear` or mapping",
}

RULES = [
    "Unknown fields are errors, with the closest known field suggested "
    "(`training.global_batchsize: unknown field (did you mean global_batch_size?)`).",
    "Duplicate keys are errors; so are YAML anchors and aliases.",
    "A duration needs a unit: `90s`, `10m`, `36h`, `2d`, `1h30m`, `250ms`; a bare number (`deadline: 36`) is an error.",
    "`workers.min` <= `workers.max` <= `training.logical_workers`.",
    "`training.global_batch_size` is a multiple of `training.logical_workers`.",
    "`resources` names at least one of `accelerators` and `instance_types`.",
    f"`run` and `setup` fit one command line ({MAX_COMMAND_BYTES // 1024} KiB); a spec is at most "
    f"{MAX_SPEC_BYTES // 1024} KiB and {MAX_DEPTH} levels deep.",
    "Every error is one line naming the field (`spec error: workers: min (4) is greater than max (2)`), "
    "exit status 2.",
]


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo, type[BaseModel] | None]]:
    for name, f in model.model_fields.items():
        path = prefix + (f.alias or name)
        sub = f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) else None
        yield path, f, sub
        if sub is not None:
            yield from _fields(sub, path + ".")


def _type(path: str, f: FieldInfo) -> str:
    if path in TYPES:
        return TYPES[path]
    a = f.annotation
    if typing.get_origin(a) is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(a))
    text = str(a).replace("typing.", "")
    for t in ("str", "int", "float", "bool"):
        text = text.replace(f"<class '{t}'>", t)
    if text.startswith("list[Literal["):
        return "list of " + ", ".join(f"`{v}`" for v in typing.get_args(typing.get_args(a)[0]))
    return text.replace(" | None", " (optional)")


def _default(path: str, f: FieldInfo, sub: type[BaseModel] | None) -> str:
    if f.is_required():
        return "**required**"
    if sub is not None:
        return "(section)"
    value: Any = f.get_default(call_default_factory=True)
    if value is None or value is PydanticUndefined:
        return "-"
    if TYPES.get(path) == "duration":
        return f"`{human_duration(float(value))}`"
    return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value}`"


def _constraints(f: FieldInfo) -> str:
    out = []
    for m in f.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                out.append(f"{sym} {getattr(m, attr)}")
        if getattr(m, "pattern", None):
            out.append(f"matches `{m.pattern}`")
    return ", ".join(out) or "-"


def render() -> str:
    missing = [p for p, _, _ in _fields(JobSpec) if p not in DESCRIPTIONS]
    if missing:
        raise SystemExit(f"spec_doc: no description for {', '.join(missing)} (add it to DESCRIPTIONS)")

    lines = [
        "# Job spec reference (v1)",
        "",
        "<!-- Generated from autoscaler/jobs/spec.py by `python -m autoscaler.cli.spec_doc > docs/spec.md`; do not edit. -->",
        "",
        "A job is a YAML file (`spotrain validate SPEC` checks one without running it; `--set key.path=value` "
        "on any command overrides a field, the value read as YAML). `spotrain init` writes this one:",
        "",
        "```yaml",
        JOB_YAML.format(name="my-job").rstrip(),
        "```",
        "",
        "## Fields",
        "",
        "| field | type | default | constraints | meaning |",
        "|---|---|---|---|---|",
    ]
    for path, f, sub in _fields(JobSpec):
        name = f"**{path}**" if sub is not None else f"`{path}`"
        lines.append(f"| {name} | {_type(path, f) if sub is None else 'mapping'} | {_default(path, f, sub)} | "
                     f"{_constraints(f)} | {DESCRIPTIONS[path]} |")
    lines += ["", "## Rules", ""] + [f"- {r}" for r in RULES] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
