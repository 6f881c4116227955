"""The job spec (v1, a contract: see DESIGN.md), validated at the edge.

Every field of DESIGN.md's spec is accepted and checked here, including those a later part of the
product brings to life. Unknown fields are errors. Validation failures become one ``SpecError`` line
naming the field, e.g. ``spec error: workers: min (4) is greater than max (2)``.

Durations are written ``36h``, ``10m``, ``90s``, ``1h30m``, ``2d`` (``cloud_providers.durations``,
the one grammar); a bare number is an error, as DESIGN.md asks. ``to_dict`` writes them back as
``<seconds>s``, which reads back to the same float.

Hostile input (issue 14, finding 8) is refused in one line before it can cost much: the YAML reader
(``cloud_providers.safe_files.BoundedLoader``, shared by every YAML the product reads) refuses anchors
and aliases (an alias bomb expands to gigabytes), nesting deeper than ``MAX_DEPTH``, integers longer
than ``MAX_INT_DIGITS`` digits and duplicate keys, and reads at most ``MAX_SPEC_BYTES`` of a regular file
(a FIFO or device is refused without waiting on it, issue 21 finding 11); a dict from the API gets
the same depth and integer bounds (``_check_plain``).
Messages never show a whole input (``_show``) and are one line (``_one_line``): a key holding a newline
is escaped, not printed. ``run`` and ``setup`` must fit one command line (finding 9).
"""

from __future__ import annotations

import copy
import re
import reprlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator, model_validator

from autoscaler.errors import SpecError
from cloud_providers import catalog, safe_files
from cloud_providers.durations import format_duration_s, parse_duration_s
from cloud_providers.safe_files import REFUSED_CONTEXT, FileRefused, load_yaml_raw, read_regular_file, yaml_problem
from cost_models import batching
from cost_models.store_uri import parse_store_uri

# Bounds on a spec (issue 14): a real spec is a few kB, a few levels deep, with small numbers.
MAX_SPEC_BYTES = 1024 * 1024
MAX_DEPTH = safe_files.MAX_DEPTH
MAX_INT_DIGITS = safe_files.MAX_INT_DIGITS
MAX_INT = 2**63 - 1
# One command line (``bash -c RUN``) must fit the OS's limit on one argument (Linux: 128 KiB).
MAX_COMMAND_BYTES = 64 * 1024
_MAX_MESSAGE = 400


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, allow_inf_nan=False)


# A job name is a DNS label: it names cloud instances and directories.
_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_ACCEL_RE = re.compile(r"^([A-Za-z0-9]+)(?::(\d+))?$")


class AcceleratorRequest(_Strict):
    name: str
    count: int

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


CloudName = Literal["aws", "gcp", "local"]


def _local_only() -> list[CloudName]:
    return ["local"]


class Resources(_Strict):
    accelerators: list[AcceleratorRequest] = Field(default_factory=list)
    instance_types: list[str] = Field(default_factory=list)
    clouds: list[CloudName] = Field(default_factory=_local_only)
    regions: list[str] = Field(default_factory=list)
    spot: Literal["auto", "always", "never"] = "auto"

    @field_validator("accelerators", mode="before")
    @classmethod
    def _parse_accelerators(cls, v: Any) -> Any:
        if v is None:
            return []
        if not isinstance(v, list):
            raise ValueError("must be a list such as [V100:1, A10G:1]")
        out = []
        for i, item in enumerate(v):
            if isinstance(item, dict):
                out.append(item)
                continue
            m = _ACCEL_RE.match(str(item).strip())
            if not m:
                raise ValueError(f"[{i}] {item!r} is not NAME:COUNT (e.g. V100:1)")
            name, count = m.group(1), int(m.group(2) or 1)
            canon = {a.upper(): a for a in catalog.ACCELERATORS}.get(name.upper())
            if canon is None:
                known = ", ".join(sorted(catalog.ACCELERATORS))
                raise ValueError(f"[{i}] unknown accelerator {name!r} (known: {known})")
            if count < 1:
                raise ValueError(f"[{i}] accelerator count must be at least 1, got {count}")
            out.append({"name": canon, "count": count})
        return out

    @field_validator("instance_types")
    @classmethod
    def _known_types(cls, v: list[str]) -> list[str]:
        known = catalog.known_instance_types()
        for i, t in enumerate(v):
            if t not in known:
                raise ValueError(f"[{i}] unknown instance type {t!r}")
        return v

    @model_validator(mode="after")
    def _something_to_run_on(self) -> "Resources":
        if not self.accelerators and not self.instance_types:
            raise ValueError("give accelerators (e.g. [V100:1]) or instance_types")
        if not self.clouds:
            raise ValueError("clouds must name at least one of aws, gcp, local")
        return self


class Workers(_Strict):
    min: int = Field(default=1, ge=1)
    max: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _order(self) -> "Workers":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


class Training(_Strict):
    logical_workers: int = Field(default=1, ge=1)
    global_batch_size: int = Field(default=32, ge=1)
    batch_policy: Literal["fixed", "adaptive"] = "fixed"
    lr_scaling: Literal["adascale", "sqrt", "linear", "none"] = "none"
    max_batch_size: int | None = Field(default=None, ge=1)
    # Per-GPU micro-batch limit (memory) for batch_policy: adaptive; the runtime splits a logical
    # worker's micro-batch into chunks to stay within it (issue 11).
    max_local_batch_size: int | None = Field(default=None, ge=1)
    determinism: Literal["bitwise", "fast"] = "bitwise"
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> "Training":
        problem = batching.check_layout(self.global_batch_size, self.logical_workers, self.max_batch_size)
        if problem is not None:
            raise ValueError(problem)
        return self


class Objective(_Strict):
    deadline_s: float | None = Field(default=None, alias="deadline")
    budget_usd: float | None = Field(default=None, gt=0)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("deadline_s", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return None if v is None else parse_duration_s(v)

    @field_serializer("deadline_s", when_used="json")
    def _dur_out(self, v: float | None) -> str | None:
        return None if v is None else format_duration_s(v)


class Checkpoint(_Strict):
    store: str | None = None
    interval_s: float = Field(default=600.0, alias="interval")
    keep: int = Field(default=3, ge=1)
    # The checkpoint's size in GB, before the runtime has measured it (issue 23): what a move of the
    # job's state to another region or cloud carries (egress, transfer time). None: 0 until measured.
    size_gb: float | None = Field(default=None, ge=0, le=1_000_000)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("interval_s", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration_s(v)

    @field_serializer("interval_s", when_used="json")
    def _dur_out(self, v: float) -> str:
        return format_duration_s(v)

    @field_validator("store")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is None:
            return v
        # The rule the runtime's make_store applies (issue 21, finding 13): refused here, at submit,
        # rather than in every rank at the job's first start.
        parse_store_uri(v)
        return v.rstrip("/")


class Retries(_Strict):
    max_restarts_on_errors: int = Field(default=2, ge=0)


class SerialFraction(_Strict):
    serial_fraction: float = Field(ge=0, lt=1)


class ProfileScaling(_Strict):
    profile: str


class Simulate(_Strict):
    work_gpu_hours: float = Field(default=1.0, gt=0)
    scaling: Union[Literal["linear"], SerialFraction, ProfileScaling] = "linear"


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by the controller and the runtime's protocol: a spec's ``envs`` may not set them.
_RESERVED_ENV = ("SPOTRAIN_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MAX_ENVS_BYTES = 32 * 1024


def _env_value(name: str, v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (str, int, float)):
        return str(v)
    raise ValueError(f"{name}: {_show(v)} is not a string or number")


class JobSpec(_Strict):
    name: str
    workdir: str = "."
    setup: str | None = None
    run: str
    # Environment variables for every worker (and ``setup``), e.g. ``{EPOCHS: 3}``.
    envs: dict[str, str] = Field(default_factory=dict)
    resources: Resources
    workers: Workers = Field(default_factory=Workers)
    training: Training = Field(default_factory=Training)
    objective: Objective = Field(default_factory=Objective)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    retries: Retries = Field(default_factory=Retries)
    simulate: Simulate = Field(default_factory=Simulate)

    @field_validator("name")
    @classmethod
    def _name_rule(cls, v: str) -> str:
        # The rule in words, not the regex (issue 24, item 8): a user should not have to read a pattern.
        if not _NAME_RE.fullmatch(v):
            raise ValueError(f"{_show(v)} is not a valid job name: use 1 to 63 lowercase letters, digits and '-', "
                             "starting and ending with a letter or digit (e.g. digits-cnn)")
        return v

    @field_validator("run")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return _fits_command_line(v)

    @field_validator("setup")
    @classmethod
    def _setup_fits(cls, v: str | None) -> str | None:
        return None if v is None else _fits_command_line(v)

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError("must be a mapping of NAME: value, e.g. {EPOCHS: 3}")
        out: dict[str, str] = {}
        for name, value in v.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise ValueError(f"{_show(name)} is not an environment variable name (letters, digits, _)")
            if name.upper().startswith(_RESERVED_ENV[0]) or name in _RESERVED_ENV[1:]:
                raise ValueError(f"{name} is set by spotrain itself")
            out[name] = _env_value(name, value)
        if sum(len(k) + len(x) + 2 for k, x in out.items()) > MAX_ENVS_BYTES:
            raise ValueError(f"larger than {MAX_ENVS_BYTES} bytes")
        return out

    @model_validator(mode="after")
    def _workers_fit_logical(self) -> "JobSpec":
        if self.workers.max > self.training.logical_workers:
            raise ValueError(
                f"workers.max ({self.workers.max}) exceeds training.logical_workers "
                f"({self.training.logical_workers}): each physical worker runs at least one logical worker"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """A plain, re-validatable dict of the spec (durations as ``<seconds>s``)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


def _fits_command_line(v: str) -> str:
    size = len(v.encode())
    if size > MAX_COMMAND_BYTES:
        raise ValueError(f"{size} bytes is longer than the limit of {MAX_COMMAND_BYTES} bytes "
                         "(a command must fit the OS's limit on one argument; put a long script in a file)")
    return v


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 60, 60, 4, 4


def _show(value: Any) -> str:
    """A short repr of a user's value: never the whole input (an alias bomb's repr is gigabytes)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        return _REPR.repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"


def _one_line(text: str) -> str:
    """``text`` on one line, control characters escaped, at most ``_MAX_MESSAGE`` characters."""
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return out if len(out) <= _MAX_MESSAGE else out[: _MAX_MESSAGE - 3] + "..."


def _loc_part(p: Any) -> str:
    text = str(p)
    return text if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text) else _show(p)


def _format_error(err: ValidationError) -> str:
    errors = err.errors()
    # In a union (``simulate.scaling``) pydantic reports every branch; the most telling error is the
    # deepest one that is about a value rather than about the branch's shape.
    shape = {"literal_error", "missing", "extra_forbidden", "model_type", "dict_type"}
    e = min(errors, key=lambda x: (x["type"] in shape if len(errors) > 1 else False, -len(x["loc"]))) if len(
        {x["loc"][0] if x["loc"] else "" for x in errors}) == 1 else errors[0]
    loc = ".".join(_loc_part(p) for p in e["loc"] if not str(p).startswith(("function-after", "function-before")))
    # Pydantic puts union branch names in the location; drop them for a readable path.
    loc = re.sub(r"\.(literal\[[^\]]*\]|SerialFraction|ProfileScaling|str|int|float|list\[.*?\])(?=\.|$)", "", loc)
    msg = e["msg"]
    msg = re.sub(r"^(Value error|Assertion failed), ", "", msg)
    if e["type"] == "extra_forbidden":
        msg = "unknown field" + _did_you_mean([str(p) for p in e["loc"]])
    elif e["type"] == "missing":
        msg = "required field is missing"
    elif "input" in e and e["type"] not in ("value_error",):
        msg = f"{msg} (got {_show(e['input'])})"
    return _one_line(f"spec error: {loc}: {msg}" if loc else f"spec error: {msg}")


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _did_you_mean(loc: list[str]) -> str:
    """`` (did you mean X?)`` for an unknown field close to a known one of the same section."""
    import difflib

    model: Any = JobSpec
    for part in loc[:-1]:
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        sub = getattr(field, "annotation", None) if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return ""
        model = sub
    close = difflib.get_close_matches(loc[-1] if loc else "", _field_names(model), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def set_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``--set key.path=value`` (value read as YAML) to ``data`` in place."""
    if "=" not in assignment:
        raise SpecError(_one_line(f"spec error: --set {_show(assignment)}: expected key.path=value"))
    path, raw = assignment.split("=", 1)
    keys = [k for k in path.strip().split(".")]
    if not all(keys):
        raise SpecError(_one_line(f"spec error: --set {_show(assignment)}: empty key in {_show(path)}"))
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise SpecError(_one_line(f"spec error: --set {path}: value is not valid YAML ({_yaml_problem(exc)})")) from None
    node: Any = data
    for k in keys[:-1]:
        if not isinstance(node, dict):
            raise SpecError(_one_line(f"spec error: --set {path}: {_show(k)} is not inside a mapping"))
        node = node.setdefault(k, {})
    if not isinstance(node, dict):
        raise SpecError(_one_line(f"spec error: --set {path}: parent is not a mapping"))
    node[keys[-1]] = value


# The spec's YAML reader is the product's one bounded reader (``cloud_providers.safe_files``): aliases,
# deep nesting, huge integers and duplicate keys are refused there, with ``context == _REFUSED``.
_REFUSED = REFUSED_CONTEXT
_load_yaml = load_yaml_raw
_yaml_problem = yaml_problem


def parse_spec_text(text: str, *, overrides: Iterable[str] = (), source: str = "spec") -> JobSpec:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(_one_line(f"spec error: {source}: larger than {MAX_SPEC_BYTES} bytes"))
    try:
        data = _load_yaml(text)
    except yaml.YAMLError as exc:
        if getattr(exc, "context", None) == _REFUSED:
            raise SpecError(_one_line(f"spec error: {source}: {_yaml_problem(exc)}")) from None
        raise SpecError(_one_line(f"spec error: {source}: YAML syntax error: {_yaml_problem(exc)}")) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"spec error: {source}: the spec must be a YAML mapping, got {type(data).__name__}")
    data = copy.deepcopy(data)
    for o in overrides:
        set_override(data, o)
    return spec_from_dict(data)


def _check_plain(data: Any) -> None:
    """The bounds the YAML reader keeps, for a spec that came as JSON (the API): depth and integers.
    Iterative, so that a deep input cannot exhaust the stack here."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise SpecError(_one_line(f"spec error: {where or 'spec'}: nested deeper than {MAX_DEPTH} levels"))
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
            raise SpecError(_one_line(f"spec error: {where or 'spec'}: {_show(value)} is too large"))
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1, f"{where}.{_loc_part(k)}" if where else _loc_part(k)) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1, f"{where}.{i}" if where else str(i)) for i, v in enumerate(value))


def spec_from_dict(data: Mapping[str, Any]) -> JobSpec:
    _check_plain(data)
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as err:
        raise SpecError(_format_error(err)) from None


def spec_from_stored(data: Mapping[str, Any]) -> JobSpec:
    """A spec this controller stored (``to_dict``). Rows written before durations needed a unit hold
    bare seconds (``{"deadline": 129600.0}``); they are read as seconds here, never in a user's input."""
    upgraded = copy.deepcopy(dict(data))
    for section, key in (("objective", "deadline"), ("checkpoint", "interval")):
        part = upgraded.get(section)
        if isinstance(part, dict) and isinstance(part.get(key), (int, float)) and not isinstance(part[key], bool):
            part[key] = format_duration_s(part[key])
    return spec_from_dict(upgraded)


def load_spec(path: str | Path, *, overrides: Iterable[str] = ()) -> tuple[JobSpec, Path]:
    """Load and validate a spec file. Returns the spec and the absolute workdir it refers to."""
    p = Path(path)
    try:  # a regular file only: a FIFO or /dev/zero named as the spec is refused, never waited on
        raw = read_regular_file(p, max_bytes=MAX_SPEC_BYTES, what="spec")
        text = raw.decode()
    except FileRefused as exc:
        raise SpecError(_one_line(f"spec error: {str(exc).removeprefix('spec ')}")) from None
    except UnicodeDecodeError as exc:
        raise SpecError(_one_line(f"spec error: {path}: cannot read ({exc.__class__.__name__})")) from None
    spec = parse_spec_text(text, overrides=overrides, source=str(path))
    workdir = (p.parent / spec.workdir).resolve()
    if not workdir.is_dir():
        raise SpecError(f"spec error: workdir: {spec.workdir!r} is not a directory (relative to {p.parent})")
    return spec, workdir
