"""The six Pollux applications of a workload replay, each from its own published data, and the
TunedJobs baseline's offline choice of batch and GPU count.

Every statistic of a model comes from its own folder ``cost_models/data/pollux/<model>/`` (Pollux's
artifact, petuum/adaptdl branch ``osdi21-artifact``, ``simulator/traces/``; Apache-2.0): no model is
simulated with another model's throughput, noise scale, work or batch cap (issue 20: the replay used
to run yolov3 as imagenet and deepspeech2 as bert, and the yolov3 jobs alone made adaptive look 32 %
faster). A model without such data cannot be replayed (``read_workload`` rejects it).

- ``M0``: the initial batch whose iterations Pollux's ``progress`` column counts: the smallest
  validated batch, except deepspeech2, whose smallest validation file is ``validation-160.csv`` but
  whose progress counts iterations at 20 (AdaptDL's deepspeech2 initial batch: late in training the
  file's progress grows 8 = 160 / 20 times faster than its iterations; ``tests/policy/
  test_workload_models.py`` checks it).
- Work ``P``: the progress of the last row of the smallest validation file (the target Pollux's
  simulator ends the job at: its last epoch).
- Noise scale ``B``: the median over the rows of that file of ``grad_var / grad_sqr x M0`` (AdaptDL
  normalises ``grad_var`` to ``M0``), constant over a run (in truth it grows as training goes on).
- Cap: the largest validated batch (its largest ``validation-<M>.csv``).
- Throughput: fitted to the model's ``scalability.csv`` and ``placements.csv``, or to the one of them
  the artifact has (deepspeech2: ``scalability.csv`` only, yolov3: ``placements.csv`` only).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
import statistics
from functools import lru_cache

from cost_models.goodput import ThroughputModel
from cost_models.scaling import DATA_DIR, POLLUX_MODELS, pollux_model, read_profile_csv

# Pollux's six applications (its workloads name no other).
MODELS = ("cifar10", "bert", "imagenet", "ncf", "deepspeech2", "yolov3")
# M0 where it is not the smallest validated batch (see the module doc).
INITIAL_BATCH = {"deepspeech2": 20}
# TunedJobs (Pollux section 5.1, simulator/applications.py ``get_configurations``): the GPU counts
# tried, and the band of scaling efficiency (JCT on 1 GPU / JCT on n / n) a tuned configuration must
# fall in, and the longest JCT it may have.
TUNED_GPU_COUNTS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
TUNED_EFFICIENCY = (0.5, 0.8)
TUNED_MAX_JCT_S = 12 * 3600.0

_VALIDATION = re.compile(r"validation-(\d+)\.csv")


@dataclasses.dataclass(frozen=True)
class ModelStats:
    """One model's statistics, all read from ``folder`` (its own data)."""

    name: str
    folder: str
    initial_batch: int  # M0
    target_progress: float  # P: scale-invariant iterations at M0 to the validation target
    noise_scale: float  # B, in examples
    max_batch_size: int  # the largest validated batch
    validated_batches: tuple[int, ...]
    max_profile_replicas: int  # the most GPUs its profile rows measured
    max_local_bsz: int  # the largest per-GPU batch its profile rows measured

    def efficiency(self, batch_size: float) -> float:
        """Statistical efficiency at ``batch_size`` relative to M0: (B + M0) / (B + M)."""
        return (self.noise_scale + self.initial_batch) / (self.noise_scale + batch_size)

    def steps(self, batch_size: float) -> float:
        """Optimizer steps at ``batch_size`` to the target: P x M0 / (M x E(M))."""
        return self.target_progress * self.initial_batch / (batch_size * self.efficiency(batch_size))


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _profile_files(name: str) -> list[str]:
    return [str(DATA_DIR / name / f) for f in ("scalability.csv", "placements.csv") if (DATA_DIR / name / f).is_file()]


@lru_cache(maxsize=None)
def model_stats(name: str) -> ModelStats:
    """The statistics of ``name`` from its own folder; ValueError for a model without data."""
    folder = DATA_DIR / name
    batches = sorted(int(m[1]) for p in folder.glob("validation-*.csv") if (m := _VALIDATION.fullmatch(p.name)))
    profiles = _profile_files(name)
    if not batches or not profiles:
        raise ValueError(f"model {name!r}: no validation-<batch>.csv or no profile in {folder}")
    m0 = INITIAL_BATCH.get(name, batches[0])
    rows = _rows(str(folder / f"validation-{batches[0]}.csv"))
    ratios = [float(r["grad_var"]) / float(r["grad_sqr"]) for r in rows if float(r["grad_sqr"]) > 0]
    replicas, local = 0, 0
    for p in profiles:
        for r in _rows(p):
            n = sum(int(c) for c in r["placement"]) if r.get("placement") else int(r["num_replicas"])
            replicas, local = max(replicas, n), max(local, math.floor(float(r["local_bsz"])))
    return ModelStats(name=name, folder=str(folder), initial_batch=m0, target_progress=float(rows[-1]["progress"]),
                      noise_scale=statistics.median(ratios) * m0, max_batch_size=batches[-1],
                      validated_batches=tuple(batches), max_profile_replicas=replicas, max_local_bsz=local)


@lru_cache(maxsize=None)
def throughput_model(name: str) -> ThroughputModel:
    """The model's own throughput model (both profile files, or the one the artifact has)."""
    if name in POLLUX_MODELS:
        return pollux_model(name)
    files = _profile_files(name)
    if len(files) != 1:
        raise ValueError(f"model {name!r}: expected one profile file, found {len(files)}")
    return read_profile_csv(files[0])


@dataclasses.dataclass(frozen=True)
class TunedConfig:
    gpus: int
    batch_size: int
    jct_s: float  # on reference GPUs, no restarts
    scaling_efficiency: float  # JCT on 1 GPU (at its best batch) / JCT here / gpus


def run_time_s(name: str, gpus: int, batch_size: int, gpus_per_node: int = 1) -> float:
    """Seconds to the target on ``gpus`` reference GPUs at ``batch_size`` (split evenly, no
    accumulation: as the simulator's truth trains a fixed batch)."""
    stats, model = model_stats(name), throughput_model(name)
    nodes = math.ceil(gpus / max(1, gpus_per_node))
    return stats.steps(batch_size) * float(model.step_time(nodes, gpus, batch_size / gpus))


def tuned_batches(name: str, user_batch: int | None = None) -> list[int]:
    """Batches TunedJobs tries: M0 x 2^k up to the cap, the validated ones, the user's (if within)."""
    s = model_stats(name)
    out = {s.initial_batch, s.max_batch_size, *s.validated_batches}
    m = s.initial_batch
    while m * 2 <= s.max_batch_size:
        m *= 2
        out.add(m)
    if user_batch is not None and s.initial_batch <= user_batch <= s.max_batch_size:
        out.add(user_batch)
    return sorted(out)


@lru_cache(maxsize=None)
def tuned_config(name: str, *, user_batch: int | None = None, gpus_per_node: int = 1,
                 max_gpus: int | None = None) -> TunedConfig:
    """TunedJobs' configuration for one job, chosen offline with the truth (Pollux's rule for the
    ideal configurations it gave its baselines): for each GPU count the batch with the shortest JCT
    among ``tuned_batches`` whose per-GPU batch the profile measured; a count qualifies if its JCT is
    under 12 h and its scaling efficiency within 50-80 %; the fastest qualifying one wins (Pollux
    drew one at random), else 1 GPU at its best batch. GPU counts stop at the most GPUs the model's
    profile measured (no extrapolation) and at ``max_gpus``."""
    s = model_stats(name)
    top = min(s.max_profile_replicas, max_gpus or s.max_profile_replicas)
    best: dict[int, tuple[float, int]] = {}
    for n in TUNED_GPU_COUNTS:
        if n > top:
            break
        cands = [(run_time_s(name, n, m, gpus_per_node), m) for m in tuned_batches(name, user_batch)
                 if 1 <= m / n <= s.max_local_bsz]
        if cands:
            best[n] = min(cands)
    if 1 not in best:
        raise ValueError(f"model {name!r}: no batch fits one GPU (per-GPU batch up to {s.max_local_bsz})")
    base = best[1][0]
    ok = [(jct, n, m) for n, (jct, m) in best.items()
          if n > 1 and jct < TUNED_MAX_JCT_S and TUNED_EFFICIENCY[0] <= base / jct / n <= TUNED_EFFICIENCY[1]]
    jct, n, m = min(ok) if ok else (base, 1, best[1][1])
    return TunedConfig(gpus=n, batch_size=m, jct_s=jct, scaling_efficiency=base / jct / n)
