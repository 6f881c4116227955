"""Workload replay without stand-ins (issue 20, item 5): every Pollux application runs with its own
published data, and TunedJobs picks each model's batch and GPU count as Pollux's evaluation did.

The expected statistics are recomputed here from the raw CSV files of each model's own folder, so a
model simulated with another model's noise scale, batch cap or profile (as yolov3 with imagenet's and
deepspeech2 with bert's were) fails.
"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from autoscaler.policy import get_policy
from autoscaler.simulator.workload import read_workload, workload_world
from autoscaler.simulator.workload_models import (
    MODELS,
    TUNED_EFFICIENCY,
    TUNED_GPU_COUNTS,
    TUNED_MAX_JCT_S,
    model_stats,
    run_time_s,
    throughput_model,
    tuned_batches,
    tuned_config,
)
from cost_models.scaling import DATA_DIR
from research.tracegen import MULTI_ZONE, generate_trace

TRACE = generate_trace(MULTI_ZONE, hours=24 * 2, seed=4)
# One job of each of Pollux's six applications, at the configurations its workloads ask for.
ROWS = ["name,time,application,num_replicas,batch_size", "cifar10-0,0,cifar10,4,128", "bert-1,10,bert,2,12",
        "imagenet-2,20,imagenet,8,400", "ncf-3,30,ncf,1,256", "deepspeech2-4,40,deepspeech2,6,320",
        "yolov3-5,50,yolov3,4,64"]


def _raw(model: str) -> tuple[dict[int, list[dict[str, str]]], list[dict[str, str]]]:
    """The model's own validation files (by batch) and profile rows, read straight from its folder."""
    folder = DATA_DIR / model
    val = {int(re.fullmatch(r"validation-(\d+)\.csv", p.name)[1]): list(csv.DictReader(p.open()))  # type: ignore[index]
           for p in folder.glob("validation-*.csv")}
    prof = [r for f in ("scalability.csv", "placements.csv") if (folder / f).is_file()
            for r in csv.DictReader((folder / f).open())]
    return val, prof


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("w") / "w.csv"
    p.write_text("\n".join(ROWS) + "\n")
    return p


def test_deepspeech2_progress_counts_iterations_at_batch_20() -> None:
    """The one M0 not read off a file name: late in training (gain ~ M / M0) the progress of
    deepspeech2's validation-160 and -640 runs grows 160/20 and 640/20 times faster than their iterations."""
    val, _ = _raw("deepspeech2")
    assert model_stats("deepspeech2").initial_batch == 20
    for m in (160, 640):
        rows = val[m][-20:]
        progress = float(rows[-1]["progress"]) - float(rows[0]["progress"])
        gain = progress / (int(rows[-1]["iteration"]) - int(rows[0]["iteration"]))
        assert gain == pytest.approx(m / 20, rel=0.06), m  # (at M0 = 160 it would be 1 and 4)
    for model in ("cifar10", "bert", "imagenet", "ncf", "yolov3"):  # progress == iterations at the smallest batch
        m0 = min(_raw(model)[0])
        assert model_stats(model).initial_batch == m0
        last = _raw(model)[0][m0][-1]
        assert float(last["progress"]) == pytest.approx(float(last["iteration"]), rel=1e-3, abs=1.0)


def test_no_model_is_simulated_with_another_models_statistics(workload: Path) -> None:
    jobs = read_workload(workload)
    assert {j.application for j in jobs} == set(MODELS)
    for mode in ("adaptive", "tuned"):
        _, runs = workload_world(TRACE, jobs, get_policy("spotrain"), restart_overhead_s=120, batch_policy=mode)
        for r in runs:
            app = r.job.application
            val, prof = _raw(app)
            m0 = model_stats(app).initial_batch
            first = val[min(val)]
            noise = statistics.median(float(x["grad_var"]) / float(x["grad_sqr"]) * m0 for x in first)
            batch = r.spec.training.global_batch_size
            # The simulated workers' gradient noise scale (B = grad_var / grad_sqr x M at the spec's batch).
            assert r.workload.grad_stats is not None
            assert r.workload.grad_stats[1] / r.workload.grad_stats[0] * batch == pytest.approx(noise, rel=1e-9), (mode, app)
            # The adaptive cap: the model's own largest validated batch (or the batch the job runs at).
            assert r.spec.training.max_batch_size == max(max(val), batch), (mode, app)
            # The work: its own progress to the target, at its own M0, through its own profile.
            model = throughput_model(app)
            assert r.workload.profile is model
            steps = float(first[-1]["progress"]) * m0 / (batch * (noise + m0) / (noise + batch))
            assert r.workload.work_s == pytest.approx(steps * float(model.step_time(1, 1, batch)), rel=1e-9)
    # ... and each profile was fitted to its own rows: within 25 % of them (median), closer than any
    # other model's profile is.
    for app in MODELS:
        assert _profile_error(app, app) < 0.25, app
        assert _profile_error(app, app) < min(_profile_error(app, o) for o in MODELS if o != app), app


def _profile_error(rows_of: str, model: str) -> float:
    """Median relative error of ``model``'s throughput model on ``rows_of``'s measured step times."""
    _, prof = _raw(rows_of)
    digits = [[int(c) for c in x["placement"]] if x.get("placement") else None for x in prof]
    nodes = np.array([len(d) if d else int(x["num_nodes"]) for d, x in zip(digits, prof)], dtype=float)
    k = np.array([sum(d) if d else int(x["num_replicas"]) for d, x in zip(digits, prof)], dtype=float)
    local = np.array([float(x["local_bsz"]) for x in prof])
    step = np.array([float(x["step_time"]) for x in prof])
    return float(np.median(np.abs(np.asarray(throughput_model(model).step_time(nodes, k, local)) / step - 1)))


def test_tuned_jobs_pick_the_fastest_configuration_in_pollux_band() -> None:
    for app in MODELS:
        s = model_stats(app)
        c = tuned_config(app)
        grid = {(n, m): run_time_s(app, n, m) for n in TUNED_GPU_COUNTS if n <= s.max_profile_replicas
                for m in tuned_batches(app) if 1 <= m / n <= s.max_local_bsz}
        base = min(t for (n, _), t in grid.items() if n == 1)
        best_per_n = {n: min(t for (k, _), t in grid.items() if k == n) for n, _ in grid}
        ok = {n: t for n, t in best_per_n.items()
              if n > 1 and t < TUNED_MAX_JCT_S and TUNED_EFFICIENCY[0] <= base / t / n <= TUNED_EFFICIENCY[1]}
        if ok:  # the fastest qualifying GPU count, at its fastest batch
            assert c.gpus == min(ok, key=lambda n: ok[n]) and c.jct_s == pytest.approx(ok[c.gpus]), app
            assert TUNED_EFFICIENCY[0] <= c.scaling_efficiency <= TUNED_EFFICIENCY[1]
        else:  # nothing scales within the band: one GPU at its fastest batch
            assert c.gpus == 1 and c.jct_s == pytest.approx(base), app
        assert grid[(c.gpus, c.batch_size)] == pytest.approx(c.jct_s)
        assert s.initial_batch <= c.batch_size <= s.max_batch_size and c.batch_size / c.gpus <= s.max_local_bsz
    # ncf steps take milliseconds: more GPUs only add synchronisation, so it stays on one GPU at its
    # largest batch. Pollux's own workloads give yolov3 4 GPUs at batch 64; the rule agrees.
    assert (tuned_config("ncf").gpus, tuned_config("ncf").batch_size) == (1, model_stats("ncf").max_batch_size)
    assert (tuned_config("yolov3").gpus, tuned_config("yolov3").batch_size) == (4, 64)
    assert tuned_config("imagenet", max_gpus=8).gpus <= 8 < tuned_config("imagenet").gpus


def test_tuned_runs_keep_the_users_deadline(workload: Path) -> None:
    jobs = read_workload(workload)
    _, fixed = workload_world(TRACE, jobs, get_policy("spotrain"), restart_overhead_s=120, batch_policy="fixed")
    _, tuned = workload_world(TRACE, jobs, get_policy("spotrain"), restart_overhead_s=120, batch_policy="tuned")
    for f, t in zip(fixed, tuned):
        c = tuned_config(t.job.application, user_batch=t.job.batch_size)
        assert t.deadline_s == f.deadline_s and t.deadline_s is not None
        assert (t.ran.replicas, t.ran.batch_size) == (c.gpus, c.batch_size)
        assert t.spec.workers.max == c.gpus and t.spec.workers.min == 1
        assert t.spec.training.batch_policy == "fixed"
        assert t.spec.training.global_batch_size == c.batch_size - c.batch_size % c.gpus
        assert (f.ran.replicas, f.ran.batch_size) == (f.job.replicas, f.job.batch_size)
