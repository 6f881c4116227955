"""``spotrain tune`` (issue 15): Optuna over the policy's parameters on a trace's first part, reported on
its held-back later part first; the parameters file it writes is what ``--policy-params`` reads.

Kept fast (a 72-hour generated trace, 4-5 starts, 3-4 trials): the commands run in this process."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from autoscaler.cli.main import main
from autoscaler.jobs.spec import load_spec
from autoscaler.policy.params import DEFAULT_PARAMS, TUNING_RANGES, PolicyParams, load_params_file
from autoscaler.policy.spotrain import SpotrainPolicy
from autoscaler.simulator import Simulation, make_sim_job
from research.tracegen import MULTI_ZONE, generate_trace_text

pytest.importorskip("optuna")

JOB = """\
name: tiny
run: x
resources: {accelerators: [V100:1], clouds: [aws, gcp]}
workers: {min: 1, max: 1}
training: {logical_workers: 4, global_batch_size: 256}
objective: {deadline: 6h}
simulate: {work_gpu_hours: 4.8}
"""


@pytest.fixture()
def files(tmp_path: Path, spotrain_home: Path) -> tuple[Path, Path]:
    trace, job = tmp_path / "trace.csv", tmp_path / "job.yaml"
    trace.write_text(generate_trace_text(MULTI_ZONE, hours=72, seed=5))
    job.write_text(JOB)
    return trace, job


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        rc = 0
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def tune(capsys: pytest.CaptureFixture[str], files: tuple[Path, Path], tmp: Path, *extra: str,
         out: str = "p.json") -> tuple[int, str, str]:
    trace, job = files
    return cli(capsys, "tune", "--trace", str(trace), "--job", str(job), "--trials", "3", "--starts", "4", "--seed", "7",
               "--study", str(tmp / "study.db"), "--out", str(tmp / out), *extra)


def test_every_field_has_a_tuning_entry_within_its_range() -> None:
    fields = {f.name: f for f in dataclasses.fields(PolicyParams)}
    assert set(TUNING_RANGES) == set(fields)
    for name, r in TUNING_RANGES.items():
        if r is not None:
            m = fields[name].metadata
            assert m["min"] <= r.lo <= getattr(DEFAULT_PARAMS, name) <= r.hi <= m["max"], name


def test_tune_writes_a_params_file_that_simulate_accepts(files: tuple[Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = tune(capsys, files, tmp_path, "--json", out="tuned.yaml")
    assert rc == 0, err
    report = json.loads(out)
    assert list(report)[0] == "held_back"
    params = load_params_file(tmp_path / "tuned.yaml")
    assert params.to_dict() == report["params"] and report["trials"] == 3
    lo, hi = report["held_back"]["window_hours"]
    assert lo == report["training"]["window_hours"][1] and all(lo <= s <= hi for s in report["held_back"]["starts_hours"])
    trace, job = files
    rc, out, err = cli(capsys, "simulate", "--trace", str(trace), "--job", str(job),
                       "--policy-params", str(tmp_path / "tuned.yaml"), "--start-hours", "50", "--json")
    assert rc == 0, err
    assert json.loads(out)["state"] == "SUCCEEDED"
    # Resumed: the same command again adds its trials to the study in the file.
    rc, out, _ = tune(capsys, files, tmp_path, "--json", out="tuned.yaml")
    assert rc == 0 and json.loads(out)["trials"] == 6


def _mean_ratio(sim: Simulation, job: object, params: PolicyParams, starts: list[float]) -> float:
    runs = [sim.run(job, SpotrainPolicy(params), s) for s in starts]  # type: ignore[arg-type]
    return float(np.mean([r.cost_usd / r.on_demand_cost_usd for r in runs]))


def test_the_held_back_figure_is_printed_first_and_is_the_held_back_one(files: tuple[Path, Path], tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = tune(capsys, files, tmp_path, "--train-fraction", "0.5")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("held-back") and lines[1].startswith("training")
    # Independently: the documented split (the first half of the trace trains; each start leaves its
    # 6-hour deadline inside its window) and seeds (seed + 1 for the held-back starts), run here.
    trace_path, job_path = files
    spec, _ = load_spec(str(job_path))
    from cloud_providers.local.market import MarketTrace

    trace = MarketTrace.load(str(trace_path))
    split, span = trace.duration_s * 0.5, 6 * 3600.0
    held = sorted(float(x) for x in np.random.default_rng(8).uniform(split, trace.duration_s - span, 4))
    train = sorted(float(x) for x in np.random.default_rng(7).uniform(0.0, split - span, 4))
    sim, job = Simulation(trace, spec), make_sim_job(spec)
    tuned = load_params_file(tmp_path / "p.json")
    expect = {"held-back": (_mean_ratio(sim, job, tuned, held), _mean_ratio(sim, job, DEFAULT_PARAMS, held)),
              "training": (_mean_ratio(sim, job, tuned, train), _mean_ratio(sim, job, DEFAULT_PARAMS, train))}
    assert f"{expect['held-back'][0]:.3f}" != f"{expect['training'][0]:.3f}"  # the two windows are told apart
    for line, (leg, (t, d)) in zip(lines[:2], expect.items(), strict=True):
        assert f"tuned {t:.3f} vs default {d:.3f}" in line, (leg, line)


def test_same_seed_same_result(files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    results = []
    for d in (a, b):
        rc, out, err = tune(capsys, files, d, "--json")
        assert rc == 0, err
        results.append(json.loads(out))
    assert (a / "p.json").read_text() == (b / "p.json").read_text()
    for r in results:
        r.pop("study")
        r.pop("params_file")
    assert results[0] == results[1]


BAD = {
    "unknown.json": ('{"colour": 1}', "'colour' is unknown"),
    "range.json": ('{"switch_margin": -1}', "'switch_margin' must be in [0, 1000]"),
    "type.json": ('{"spot_candidates": 2.5}', "'spot_candidates' must be an integer"),
    "text.yaml": ("switch_margin: lots\n", "'switch_margin' must be a number"),
    "syntax.json": ('{"switch_margin": ', "not valid JSON"),
    "list.yaml": ("- 1\n- 2\n", "expected a mapping"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_params_file_is_one_line_naming_the_field(name: str, files: tuple[Path, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    text, message = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    trace, job = files
    for argv in (("simulate", "--trace", str(trace), "--job", str(job)),
                 ("estimate", str(job), "--trace", str(trace), "--runs", "1")):
        rc, out, err = cli(capsys, *argv, "--policy-params", str(path))
        assert rc != 0 and out == ""
        assert len(err.strip().splitlines()) == 1 and message in err and name in err, err


def test_tune_with_several_markets_combines_them_and_a_miss_anywhere_is_infeasible() -> None:
    """The shipped defaults' study (``benchmarks/tune_defaults.py``): the mean over markets of each
    one's mean, every miss among them; the defaults are trial 0 and an in-memory study needs no file."""
    from autoscaler.policy.tuning import INFEASIBLE, Score, combine, objective_value, tune_with

    a, b = Score(0.3, 0.4, 0, 5), Score(0.5, 0.8, 0, 7)
    both = combine([a, b])
    assert (both.mean_cost_ratio, both.p90_cost_ratio, both.misses, both.runs) == (pytest.approx(0.4), pytest.approx(0.6), 0, 12)
    assert objective_value(combine([a, Score(0.2, 0.2, 2, 5)])) == INFEASIBLE + 2
    seen: list[PolicyParams] = []

    def evaluate(p: PolicyParams) -> Score:
        seen.append(p)
        return combine([a, b]) if p == DEFAULT_PARAMS else Score(0.9, 0.9, 1, 12)

    res = tune_with(evaluate, trials=3, seed=0, storage=None, study_name="t")
    assert seen[0] == DEFAULT_PARAMS and len(seen) == 3
    assert res.best == DEFAULT_PARAMS and res.best_value == pytest.approx(0.4) and res.infeasible_trials == 2


def test_the_defaults_study_guards_every_cell_within_its_tolerance() -> None:
    """``benchmarks/tune_defaults.py``: ``--guard`` refuses a trial worse than the hand defaults in a
    3-minute cell at all, ``--guard-all-cells TOL`` one worse by more than TOL in any cell."""
    import sys
    from pathlib import Path

    from autoscaler.policy.tuning import Score

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from tune_defaults import CELLS, GUARDED, HAND_DEFAULTS, guard_excess

    assert HAND_DEFAULTS == DEFAULT_PARAMS  # the study confirmed them: docs/policy.md

    hand = [Score(0.4, 0.5, 0, 20) for _ in CELLS]
    worse = [i for i in range(len(CELLS)) if i not in GUARDED][0]
    s = list(hand)
    s[worse] = Score(0.4 * 1.004, 0.5, 0, 20)  # 0.4 % dearer in a 12-minute cell
    assert guard_excess(s, hand, guard=True, all_cells=None) == 0.0
    assert guard_excess(s, hand, guard=True, all_cells=0.005) == 0.0  # feasible
    assert guard_excess(s, hand, guard=False, all_cells=0.003) == pytest.approx(0.001)
    s[GUARDED[0]] = Score(0.4 * 1.001, 0.5, 0, 20)  # a 3-minute cell 0.1 % dearer
    assert guard_excess(s, hand, guard=True, all_cells=None) == pytest.approx(0.001)
    assert guard_excess(s, hand, guard=False, all_cells=0.005) == 0.0
