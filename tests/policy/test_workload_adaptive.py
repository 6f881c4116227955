"""Workload replay with co-adaptation (issue 11, item 6): jobs whose simulated workers train at their
Pollux profile and report it; with ``batch_policy: adaptive`` the controller picks each gang's batch.

A small workload on a generated market: adaptive jobs get batch events, and the batch each gang is
told follows its allocation (GPUs x per-GPU batch x (accumulation + 1), a larger batch on more GPUs);
the replay is deterministic.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autoscaler.policy import get_policy
from autoscaler.simulator.workload import (
    adaptive_work_gpu_seconds,
    read_workload,
    simulate_workload,
    work_gpu_seconds,
    workload_world,
)
from cost_models.scaling import pollux_model
from research.tracegen import MULTI_ZONE, generate_trace

ROWS = ["name,time,application,num_replicas,batch_size", "cifar10-0,0,cifar10,4,128", "ncf-1,60,ncf,2,256",
        "bert-2,300,bert,2,12"]
BATCH = re.compile(r"batch (\d+) \((\d+) per GPU x (\d+) GPU\(s\)(?:, (\d+) accumulation step\(s\))?")


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("w") / "w.csv"
    p.write_text("\n".join(ROWS) + "\n")
    return p


TRACE = generate_trace(MULTI_ZONE, hours=24 * 3, seed=4)


def test_adaptive_jobs_get_batches_that_follow_their_allocation(workload: Path) -> None:
    jobs = read_workload(workload)
    world, runs = workload_world(TRACE, jobs, get_policy("spotrain"), restart_overhead_s=120, batch_policy="adaptive")
    ids = world.run(horizon_s=7 * 86400.0, arrivals=[(r.job.submit_s, r.spec, r.workload) for r in runs])
    assert len(ids) == len(jobs)
    told = 0
    for job_id in ids.values():
        assert world.outcome(job_id).state == "SUCCEEDED"
        gangs = {}
        for _, kind, _, reason in world.events(job_id):
            if kind != "batch" or not (m := BATCH.match(reason)):
                continue
            size, local, gpus, accum = int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0)
            # The batch is the allocation's: every GPU trains local_bsz per micro-step.
            assert size == gpus * local * (accum + 1), reason
            gangs[gpus] = size
            told += 1
        assert gangs, f"{job_id}: no batch event"
        # More GPUs, a batch at least as large (the optimizer's pick grows with the allocation).
        sizes = [gangs[k] for k in sorted(gangs)]
        assert sizes == sorted(sizes), gangs
    assert told >= len(jobs)


def test_the_replay_is_deterministic_and_fixed_keeps_the_users_batch(workload: Path) -> None:
    jobs = read_workload(workload)
    policy = get_policy("spotrain")
    a = simulate_workload(TRACE, jobs, policy, restart_overhead_s=120, batch_policy="adaptive")
    b = simulate_workload(TRACE, jobs, get_policy("spotrain"), restart_overhead_s=120, batch_policy="adaptive")
    assert a == b
    assert a["finished"] == a["jobs"] == 3 and a["batch_events"] >= 3 and a["gpu_hours"] > 0
    world, runs = workload_world(TRACE, jobs, get_policy("spotrain"), restart_overhead_s=120, batch_policy="fixed")
    ids = world.run(horizon_s=7 * 86400.0, arrivals=[(r.job.submit_s, r.spec, r.workload) for r in runs])
    for k, job_id in ids.items():
        assert world.outcome(job_id).state == "SUCCEEDED"
        spec_batch = runs[int(k)].spec.training.global_batch_size
        for _, kind, _, reason in world.events(job_id):
            m = BATCH.match(reason) if kind == "batch" else None
            assert m is None or int(m[1]) == spec_batch, reason  # split over the GPUs, never resized
    # At the model's own initial batch the work is the unprofiled replay's; a larger user batch pays
    # its statistical efficiency (more examples to the same target).
    assert adaptive_work_gpu_seconds("cifar10", 128) == pytest.approx(work_gpu_seconds("cifar10"))
    steps = {m: adaptive_work_gpu_seconds("ncf", m) / float(pollux_model("ncf").step_time(1, 1, m)) for m in (256, 1024)}
    assert steps[1024] * 1024 > steps[256] * 256
