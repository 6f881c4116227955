"""The simulate / estimate CLI contract (on a generated trace; the generator's own statistics:
tests/research/test_tracegen.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoscaler.cli.estimate import command as estimate
from autoscaler.cli.simulate import command as simulate
from autoscaler.errors import SpecError
from research.tracegen import SINGLE_ZONE, generate_trace_text

KEYS = {"policy", "cost_usd", "finish_hours", "deadline_met", "preemptions", "spot_hours", "on_demand_hours"}


@pytest.fixture()
def files(tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / "trace.csv").write_text(generate_trace_text(SINGLE_ZONE, hours=24 * 5, seed=5))
    (tmp_path / "job.yaml").write_text(
        "name: sim\nrun: python train.py\nresources: {accelerators: [V100:1], clouds: [aws]}\n"
        "objective: {deadline: 20h}\nsimulate: {work_gpu_hours: 12}\n")
    return tmp_path


@pytest.mark.parametrize("policy", ["on-demand", "greedy-spot", "uniform-progress", "omniscient", "spotrain"])
def test_simulate_json_contract(files, policy: str) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(simulate, ["--trace", str(files / "trace.csv"), "--job", str(files / "job.yaml"),
                                      "--policy", policy, "--start-hours", "3", "--restart-overhead-hours", "0.1", "--json"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output.strip().splitlines()[-1])
    assert KEYS <= set(obj) and obj["policy"] == policy and obj["deadline_met"] is True


def test_simulate_starts_gives_one_line_per_run(files) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(simulate, ["--trace", str(files / "trace.csv"), "--job", str(files / "job.yaml"), "--starts", "4",
                                      "--seed", "2", "--json"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.strip().splitlines()]
    assert len(lines) == 4 and len({x["start_hours"] for x in lines}) > 1


def test_bad_inputs_raise_spec_errors(files) -> None:  # type: ignore[no-untyped-def]
    bad = files / "bad.csv"
    bad.write_text("nope\n")
    r = CliRunner().invoke(simulate, ["--trace", str(bad), "--job", str(files / "job.yaml")])
    assert isinstance(r.exception, SpecError) and "line 1" in str(r.exception)
    r = CliRunner().invoke(simulate, ["--job", str(files / "missing.yaml")])
    assert isinstance(r.exception, SpecError)


def test_estimate_prints_a_range(files) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(estimate, [str(files / "job.yaml"), "--trace", str(files / "trace.csv"), "--runs", "8", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    c = out["cost_usd"]
    assert c["p10"] <= c["median"] <= c["p90"] and out["finish_hours"]["median"] > 0
    assert out["deadline_hours"] == 20 and 0 <= out["deadline_met_share"] <= 1
    human = CliRunner().invoke(estimate, [str(files / "job.yaml"), "--trace", str(files / "trace.csv"), "--runs", "8"])
    assert human.exit_code == 0 and "deadline 20 h: met in" in human.output, human.output


@pytest.mark.parametrize("args, expected", [
    (["--start-hours", "nan"], "not a finite number"),
    (["--restart-overhead-hours", "inf"], "not a finite number"),
    (["--starts", "2", "--seed", "-1"], "--seed"),
    (["--starts", "99999999999"], "--starts"),
])
def test_simulate_rejects_non_finite_and_out_of_range_options(files, args: list[str], expected: str) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(simulate, ["--trace", str(files / "trace.csv"), "--job", str(files / "job.yaml"), *args])
    assert r.exit_code == 2 and expected in r.output, r.output


def test_trace_and_workload_input_errors_are_spec_errors(files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    r = CliRunner().invoke(simulate, ["--trace", str(binary), "--job", str(files / "job.yaml")])
    assert isinstance(r.exception, SpecError) and "not UTF-8" in str(r.exception)
    r = CliRunner().invoke(simulate, ["--workload", str(binary), "--trace", str(files / "trace.csv")])
    assert isinstance(r.exception, SpecError) and "not UTF-8" in str(r.exception)
    # No offering of the trace matches the job: say so instead of simulating nothing.
    other = files / "job.yaml"
    r = CliRunner().invoke(simulate, ["--trace", str(files / "trace.csv"), "--job", str(other), "--set",
                                      "resources.accelerators=[A100:1]"])
    assert isinstance(r.exception, SpecError) and "no offering in the trace matches" in str(r.exception)
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\njob!,10,cifar10,1,128\n")
    r = CliRunner().invoke(simulate, ["--workload", str(wl), "--trace", str(files / "trace.csv"), "--json"])
    assert r.exit_code == 0, r.output  # any job name will do
    wl.write_text("name,time,application,num_replicas,batch_size\na,nan,cifar10,1,128\n")
    r = CliRunner().invoke(simulate, ["--workload", str(wl), "--trace", str(files / "trace.csv")])
    assert isinstance(r.exception, SpecError) and "line 2" in str(r.exception)
    r = CliRunner().invoke(simulate, ["--workload", str(wl), "--trace", str(files / "trace.csv"), "--starts", "3"])
    assert r.exit_code == 2 and "--workload" in r.output


@pytest.mark.parametrize(("deadline", "shown"), [("", "no deadline"), ("objective: {deadline: 20h}\n", "deadline met")])
def test_simulate_text_says_no_deadline_without_one(files, deadline: str, shown: str) -> None:  # type: ignore[no-untyped-def]
    """Issue 24, item 8: a job without a deadline read "deadline met" (a promise never made)."""
    (files / "plain.yaml").write_text(
        "name: sim\nrun: python train.py\nresources: {accelerators: [V100:1], clouds: [aws]}\n"
        + deadline + "simulate: {work_gpu_hours: 12}\n")
    r = CliRunner().invoke(simulate, ["--trace", str(files / "trace.csv"), "--job", str(files / "plain.yaml"),
                                      "--policy", "on-demand", "--start-hours", "3"])
    assert r.exit_code == 0, r.output
    assert shown in r.output and ("deadline met" in r.output) == bool(deadline), r.output
