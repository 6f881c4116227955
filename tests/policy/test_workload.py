"""Multi-job mode: a Pollux job-arrival workload replayed against a market trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoscaler.cli.simulate import command as simulate
from autoscaler.errors import SpecError
from autoscaler.policy import get_policy
from autoscaler.simulator.workload import (
    WorkloadError,
    read_workload,
    simulate_workload,
    work_gpu_seconds,
)
from autoscaler.simulator.workload_models import MODELS
from cost_models.scaling import DATA_DIR
from research.tracegen import MULTI_ZONE, generate_trace, generate_trace_text

WORKLOAD = DATA_DIR / "workloads" / "workload-1.csv"


def _small(tmp_path: Path) -> Path:
    rows = ["name,time,application,num_replicas,batch_size", "ncf-0,0,ncf,1,256", "cifar10-1,60,cifar10,2,256",
            "deepspeech2-2,300,deepspeech2,1,20", "ncf-3,900,ncf,1,512", "yolov3-4,1200,yolov3,4,64"]
    p = tmp_path / "w.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_reads_pollux_workloads_every_model_with_its_own_profile() -> None:
    jobs = read_workload(WORKLOAD)
    assert len(jobs) == 160 and jobs == sorted(jobs, key=lambda j: (j.submit_s, j.name))
    assert {j.application for j in jobs} == set(MODELS)
    assert all(j.profile == j.application for j in jobs)  # no stand-in profiles (issue 20)


def test_work_comes_from_the_validation_target() -> None:
    # cifar10: the last row of validation-128.csv (scale-invariant iterations at batch 128).
    last = (DATA_DIR / "cifar10" / "validation-128.csv").read_text().strip().splitlines()[-1]
    assert float(last.split(",")[0]) == 39063.0
    small, big = work_gpu_seconds("cifar10"), work_gpu_seconds("imagenet")
    assert 0.5 * 3600 < small < 4 * 3600  # Pollux's "small" jobs: about a GPU-hour
    assert 100 * 3600 < big < 1000 * 3600  # ImageNet: Pollux's "extra large" class
    # yolov3 (Pollux: 10-100 GPU-hours) and deepspeech2, each from its own validation target.
    assert 10 * 3600 < work_gpu_seconds("yolov3") < 100 * 3600 and 1 * 3600 < work_gpu_seconds("deepspeech2") < 100 * 3600
    assert len({work_gpu_seconds(m) for m in MODELS}) == len(MODELS)


def test_bad_workload_lines_name_the_problem(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("name,time,application,num_replicas,batch_size\nx,0,gpt5,1,8\n")
    with pytest.raises(WorkloadError, match="line 2: application 'gpt5' has no profile of its own"):
        read_workload(p)
    p.write_text("name,time,application,num_replicas,batch_size\nx,zero,ncf,1,8\n")
    with pytest.raises(WorkloadError, match="line 2"):
        read_workload(p)


def test_all_jobs_finish_and_on_demand_meets_every_deadline(tmp_path: Path) -> None:
    trace = generate_trace(MULTI_ZONE, hours=24 * 4, seed=4)
    jobs = read_workload(_small(tmp_path))
    res = {p: simulate_workload(trace, jobs, get_policy(p), restart_overhead_s=120)
           for p in ("on-demand", "greedy-spot", "spotrain")}
    for p, r in res.items():
        assert r["finished"] == r["jobs"] == 5, p
        assert r["avg_jct_hours"] > 0 and r["cost_usd"] <= r["on_demand_cost_usd"] + 1e-6
    assert res["on-demand"]["deadline_misses"] == 0 and res["on-demand"]["preemptions"] == 0
    assert res["spotrain"]["deadline_misses"] == 0
    # Spot is a third of the price: with 4x deadlines the spot policies pay well under on demand.
    assert res["spotrain"]["cost_usd"] < 0.7 * res["on-demand"]["cost_usd"]
    # No job finishes faster than on demand allows (the same gang, no restarts).
    for a, b in zip(res["on-demand"]["per_job"], res["spotrain"]["per_job"]):
        assert b["jct_hours"] >= a["jct_hours"] - 1e-6


def test_jobs_share_spot_room(tmp_path: Path) -> None:
    """At every decision, the spot instances all jobs hold on an offering fit its room."""
    trace = generate_trace(MULTI_ZONE, hours=24 * 4, seed=4)
    jobs = read_workload(_small(tmp_path))
    inner = get_policy("greedy-spot")
    seen = {"decisions": 0, "max_share": 0.0}

    class Watching:
        name = "watching"

        def decide(self, inp):  # type: ignore[no-untyped-def]
            # The room the cloud enforces (the trace's; the policy is not shown it without the oracle).
            room = {o.key: trace.offering_at(o.key, inp.now_s).spot_available or 0 for o in inp.offerings}
            held: dict[str, int] = {}
            for j in inp.jobs:
                for h in j.held:
                    if h.market == "spot":
                        held[h.offering_key] = held.get(h.offering_key, 0) + h.instances
            for k, n in held.items():
                assert n <= room[k], (inp.now_s, k, n, room[k])
                seen["max_share"] = max(seen["max_share"], n / max(room[k], 1))
            seen["decisions"] += 1
            return inner.decide(inp)

    r = simulate_workload(trace, jobs, Watching(), restart_overhead_s=120)
    assert r["finished"] == r["jobs"] and seen["decisions"] > 10
    assert seen["max_share"] == 1.0  # some offering was filled to its room at some point


def test_cli_workload_json(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text(generate_trace_text(MULTI_ZONE, hours=24 * 3, seed=6))
    w = _small(tmp_path)
    r = CliRunner().invoke(simulate, ["--workload", str(w), "--trace", str(tmp_path / "trace.csv"), "--policy", "spotrain",
                                      "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert {"avg_jct_hours", "cost_usd", "deadline_misses", "jobs", "per_job"} <= set(out)
    assert all(j["profile"] == j["application"] for j in out["per_job"])
    r = CliRunner().invoke(simulate, ["--workload", str(w), "--policy", "omniscient"])
    assert r.exit_code != 0 and "omniscient" in r.output
    r = CliRunner().invoke(simulate, ["--trace", str(tmp_path / "trace.csv")])
    assert r.exit_code != 0 and "exactly one of" in r.output
    (tmp_path / "bad.csv").write_text("nope\n")
    r = CliRunner().invoke(simulate, ["--workload", str(tmp_path / "bad.csv")])
    assert isinstance(r.exception, SpecError)
