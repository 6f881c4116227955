"""How fast a job progresses on an allocation: its scaling curve and the accelerator's speed.

Work is measured in *reference GPU-seconds*: seconds on one reference GPU (a V100) at the job's
initial batch size, the unit of the spec's ``simulate.work_gpu_hours``. An allocation of ``workers``
GPUs of one accelerator type progresses at

    rate = ACCELERATOR_SPEED[accelerator] * speedup(workers)      reference GPU-seconds per second

with ``speedup(1) == 1``. Three scaling models, as in the spec:

- ``LinearScaling``: speedup(n) = n.
- ``AmdahlScaling(s)``: speedup(n) = 1 / (s + (1 - s) / n) (Amdahl's law with serial fraction s).
- ``ProfileScaling``: from a fitted Pollux ``ThroughputModel`` at a fixed global batch (the
  accuracy-consistent ``batch_policy: fixed``): speedup(n) = T_step(1 GPU, B) / T_step(n GPUs, B / n).
  A measured profile (Pollux's, or the runtime's own step times) gives the real, sublinear curve.

The relative accelerator speeds are rough public training-throughput ratios (mixed-precision CNN and
transformer training, MLPerf-style results and vendor figures), normalised to V100 = 1. They only
matter when one job may run on different GPU types; a measured profile replaces them when known.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from .goodput import ThroughputModel

REFERENCE_ACCELERATOR = "V100"

ACCELERATOR_SPEED: dict[str, float] = {
    "T4": 0.4,
    "L4": 0.9,
    "A10G": 1.1,
    "V100": 1.0,
    "A100": 2.2,
    "H100": 4.0,
}

DATA_DIR = Path(__file__).resolve().parent / "data" / "pollux"
POLLUX_MODELS = ("cifar10", "bert", "imagenet", "ncf")


def accelerator_speed(accelerator: str) -> float:
    """Speed of one GPU relative to the reference; unknown accelerators count as the reference."""
    return ACCELERATOR_SPEED.get(accelerator, 1.0)


class Scaling(Protocol):
    def speedup(self, workers: int, gpus_per_node: int = 1) -> float:
        """Throughput of ``workers`` GPUs (``gpus_per_node`` per instance) relative to one GPU."""
        ...


@dataclasses.dataclass(frozen=True)
class LinearScaling:
    def speedup(self, workers: int, gpus_per_node: int = 1) -> float:
        return float(max(workers, 0))


@dataclasses.dataclass(frozen=True)
class AmdahlScaling:
    serial_fraction: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.serial_fraction < 1.0:
            raise ValueError(f"serial_fraction must be in [0, 1), got {self.serial_fraction}")

    def speedup(self, workers: int, gpus_per_node: int = 1) -> float:
        if workers <= 0:
            return 0.0
        return 1.0 / (self.serial_fraction + (1.0 - self.serial_fraction) / workers)


@dataclasses.dataclass(frozen=True)
class ProfileScaling:
    """Speedup at a fixed global batch from a Pollux throughput model."""

    model: ThroughputModel
    global_batch_size: int

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {self.global_batch_size}")

    def speedup(self, workers: int, gpus_per_node: int = 1) -> float:
        if workers <= 0:
            return 0.0
        per_node = max(1, gpus_per_node)
        nodes = math.ceil(workers / per_node)
        one = self.model.step_time(1, 1, self.global_batch_size)
        many = self.model.step_time(nodes, workers, self.global_batch_size / workers)
        return float(one / many)


def read_profile_csv(path: str | Path) -> ThroughputModel:
    """Fit a throughput model to a profile CSV: Pollux's ``scalability.csv`` columns
    (``num_nodes,num_replicas,local_bsz,step_time[,sync_time]``) or ``placements.csv`` columns
    (``placement,local_bsz,step_time[,sync_time]``). Raises ValueError naming the problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"profile {path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    return parse_profile_csv(text, source=str(path))


# A profile is a few dozen rows; past these it is not one (issue 21, finding 12).
MAX_PROFILE_ROWS = 10_000
MAX_PROFILE_BYTES = 1024 * 1024


def parse_profile_csv(text: str, *, source: str = "profile") -> ThroughputModel:
    """:func:`read_profile_csv` over text already read (the controller reads the file with its bounded
    reader); a CSV error or more than ``MAX_PROFILE_ROWS`` rows is a one-line ValueError."""
    if len(text) > MAX_PROFILE_BYTES:
        raise ValueError(f"profile {source}: larger than {MAX_PROFILE_BYTES} bytes")
    try:
        rows = tuple(csv.DictReader(text.splitlines()))
    except csv.Error as exc:
        raise ValueError(f"profile {source}: not a CSV file ({exc})") from None
    if len(rows) > MAX_PROFILE_ROWS:
        raise ValueError(f"profile {source}: more than {MAX_PROFILE_ROWS} rows")
    return _fit_rows(rows, source)


def _fit_rows(rows: tuple[dict[str, str], ...], source: str) -> ThroughputModel:
    nodes, replicas, bsz, step, sync = [], [], [], [], []
    for i, r in enumerate(rows, start=2):
        try:
            if "placement" in r and r["placement"]:
                digits = [int(c) for c in r["placement"].strip()]
                nodes.append(len(digits))
                replicas.append(sum(digits))
            else:
                nodes.append(int(r["num_nodes"]))
                replicas.append(int(r["num_replicas"]))
            bsz.append(float(r["local_bsz"]))
            step.append(float(r["step_time"]))
            sync.append(float(r.get("sync_time") or 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"profile {source}: line {i}: bad or missing column ({exc})") from None
    if len(step) < 3:
        raise ValueError(f"profile {source}: needs at least 3 rows, got {len(step)}")
    return ThroughputModel.fit(np.array(nodes), np.array(replicas), np.array(bsz), np.array(step), np.array(sync))


@lru_cache(maxsize=16)
def pollux_model(name: str) -> ThroughputModel:
    """The throughput model fitted to a bundled Pollux profile (scalability + placements rows)."""
    if name not in POLLUX_MODELS:
        raise ValueError(f"unknown Pollux profile {name!r} (known: {', '.join(POLLUX_MODELS)})")
    rows: list[dict[str, str]] = []
    for f in ("scalability.csv", "placements.csv"):
        rows.extend(csv.DictReader((DATA_DIR / name / f).read_text().splitlines()))
    return _fit_rows(tuple(rows), name)
