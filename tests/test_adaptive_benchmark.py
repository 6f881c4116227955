"""``benchmarks/adaptive.py``'s own logic, without processes: the batch x LR sweep's grid (the usual LR
rules from the user's base), the choice of the best fixed configuration on the sweep seed, the
interleaved evaluation order, the ratios and the last line's keys. The runs themselves are
``spotrain run`` on the local cloud; ``python benchmarks/adaptive.py --quick`` is their smoke test."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import adaptive as bench  # noqa: E402


def test_the_sweep_grid_scales_the_users_lr_by_each_rule() -> None:
    grid = bench.sweep_grid(64, 0.1, (128, 256, 512, 1024), ("none", "sqrt", "linear"))
    assert grid[0] == bench.FixedConfig(64, 0.1, "user")
    assert len(grid) == 13  # the user's configuration and 4 batches x 3 LRs
    lrs = {(c.batch, c.rule): c.lr for c in grid}
    assert lrs[(256, "none")] == 0.1 and lrs[(256, "sqrt")] == pytest.approx(0.2) and lrs[(256, "linear")] == pytest.approx(0.4)
    assert lrs[(1024, "sqrt")] == pytest.approx(0.4) and lrs[(1024, "linear")] == pytest.approx(1.6)
    # At the user's batch every rule gives the user's LR: one run, not three.
    assert len(bench.sweep_grid(64, 0.1, (64, 128), ("none", "sqrt", "linear"))) == 4
    with pytest.raises(ValueError, match="cubic"):
        bench.scaled_lr(0.1, 64, 128, "cubic")


def _run(batch: int, lr: float, gpu_s: float, reached: bool, metric: float = 0.8, seed: int = 3) -> dict[str, Any]:
    return {"batch": batch, "lr": lr, "gpu_seconds": gpu_s, "reached_target": reached, "metric": metric, "seed": seed}


def test_the_best_is_the_cheapest_run_that_reached_the_target() -> None:
    runs = [_run(64, 0.1, 900.0, True), _run(512, 0.8, 300.0, False, 0.5), _run(256, 0.2, 500.0, True),
            _run(128, 0.1, 400.0, True)]
    assert bench.select_best(runs)["batch"] == 128
    # none reached: the most accurate, however dear
    runs = [_run(64, 0.1, 900.0, False, 0.79), _run(512, 0.8, 300.0, False, 0.5)]
    assert bench.select_best(runs)["batch"] == 64
    with pytest.raises(ValueError):
        bench.select_best([])


def test_the_evaluation_sweeps_on_its_own_seed_then_interleaves_the_three_per_seed(capsys: pytest.CaptureFixture[str]) -> None:
    a = bench.parse_args(["--seeds", "0", "1", "2", "--sweep-seed", "7"])
    calls: list[tuple[str, int | None, float | None, int]] = []
    # GPU-seconds of a made-up job: batch 512 at the sqrt rule's LR is the sweep's best; adaptive
    # needs 0.6 of the user's GPU-seconds; seed 2 of the user's run misses the target.
    gpu_s = {(64, 0.1): 1000.0, (512, round(0.1 * 8 ** 0.5, 6)): 500.0}

    def fake(policy: str, config: bench.FixedConfig | None, seed: int, args: argparse.Namespace) -> dict[str, Any]:
        calls.append((policy, config.batch if config else None, config.lr if config else None, seed))
        key = (config.batch, config.lr) if config else None
        g = 600.0 + seed if key is None else gpu_s.get(key, 800.0) + seed
        return {"policy": policy, "seed": seed, "batch": config.batch if config else 64, "lr": config.lr if config else 0.1,
                "rule": config.rule if config else "adascale", "state": "SUCCEEDED", "metric": 0.81,
                "reached_target": not (policy == "fixed_user" and seed == 2), "gpu_seconds": g, "usd": g / 10000,
                "wall_s": 1.0, "steps": 10, "preemptions": 1, "attempt_workers": [2, 1], "max_workers": 2,
                "batches_trained": [64], "batch_events": [], "batch_event_count": 0, "load_before": [1.0, 1.0, 1.0],
                "load_after": [1.0, 1.0, 1.0]}

    res = bench.evaluate(a, fake, log=lambda _: None)
    out = bench.report(a, res, log=lambda _: None)
    sweep = [c for c in calls if c[0] == "sweep"]
    assert len(sweep) == 13 and {c[3] for c in sweep} == {7} and calls[:13] == sweep
    best = (512, round(0.1 * 8 ** 0.5, 6))
    assert [(c[0], c[3]) for c in calls[13:]] == [(p, s) for s in (0, 1, 2) for p in bench.POLICIES]
    assert {(c[1], c[2]) for c in calls[13:] if c[0] == "fixed_best"} == {best}
    assert {(c[1], c[2]) for c in calls[13:] if c[0] == "fixed_user"} == {(64, 0.1)}
    line = json.loads(json.dumps(out))  # the last line is plain JSON
    for p in ("fixed_user", "fixed_best", "adaptive"):
        for k in ("gpu_seconds", "usd", "reached_target", "steps"):
            assert len(line[p][k]) == 3, (p, k)
    assert line["fixed_user"]["reached_target"] == [True, True, False]
    assert line["fixed_best"]["gpu_seconds"] == [500.0, 501.0, 502.0]
    assert line["sweep_gpu_seconds"] == pytest.approx(1000 + 500 + 11 * 800 + 13 * 7)
    r = line["ratios"]
    assert r["adaptive_over_user"] == pytest.approx(round(1803 / 3003, 4))
    assert r["adaptive_over_best"] == pytest.approx(round(1803 / 1503, 4))
    assert r["adaptive_over_best_per_seed"] == [pytest.approx(round(600 / 500, 4)), pytest.approx(round(601 / 501, 4)),
                                                pytest.approx(round(602 / 502, 4))]
    assert r["adaptive_over_best_plus_sweep"] == pytest.approx(round(1803 / (1503 + line["sweep_gpu_seconds"]), 4))


def test_arguments_refuse_an_evaluation_seed_as_the_sweep_seed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "0", "3", "--sweep-seed", "3"])
    assert "--sweep-seed 3: must not be an evaluation seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--sweep-rules", "cubic"])
    q = bench.parse_args(["--quick"])
    assert q.seeds == [0] and len(bench.sweep_grid(64, 0.1, q.sweep_batches, q.sweep_rules)) == 5


def test_workers_and_batch_events_are_read_from_the_jobs_log() -> None:
    logs = """== events of adaptive-mlp-914b54
05:16:22  PROVISIONING -> RUNNING      attempt 1: 2 worker(s) on i-ab aws/us-east-1a/g4dn.xlarge/T4:1 spot, i-6c aws/...
05:16:29  batch                        the workers changed to batch 264 (33 per GPU, 3 accumulation step(s)), LR x2.31
05:16:32  RESCALING -> RUNNING         attempt 2: 1 worker(s) on i-ab aws/us-east-1a/g4dn.xlarge/T4:1 spot
05:16:32  lr                           learning-rate factor x4.78 at batch 504 (adascale)
[spotrain] batch 64 -> 264 on 2 worker(s) at step 100, from the goodput optimizer (more than 5 % goodput)
"""
    assert bench._attempt_workers(logs) == [2, 1]
    assert bench._batch_events(logs) == ["batch the workers changed to batch 264 (33 per GPU, 3 accumulation step(s)), LR x2.31"]
