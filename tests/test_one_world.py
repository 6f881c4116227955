"""One world: ``spotrain simulate`` is the controller on a virtual clock, so it decides as ``spotrain
run`` does on the local cloud — the same budget failures, the same minimum-bill refusals and the same
allocations, from the same spec and market trace."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import REPO, run_cli, write_pw_spec

QUICKSTART = REPO / "examples" / "quickstart" / "job.yaml"
MARKET = Path(__file__).parent / "data" / "one_world_market.csv"


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def simulate(*args: str) -> dict:
    r = run_cli("simulate", *args, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    return last_json(r.stdout)


def run(spec: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> tuple[dict, str]:
    r = run_cli("run", str(spec), *args, "--json", env=env, timeout=timeout)
    return last_json(r.stdout), r.stderr


@pytest.mark.e2e
def test_a_budget_that_cannot_finish_fails_at_the_same_point_in_simulate_and_run(spotrain_home: Path) -> None:
    sim = simulate("--job", str(QUICKSTART), "--set", "objective.budget_usd=0.3")
    job, _ = run(QUICKSTART, "--set", "objective.budget_usd=0.3")
    assert sim["state"] == job["state"] == "FAILED_BUDGET"
    assert sim["cost_usd"] == job["cost_usd"] == 0.0
    # The same decision from the same numbers: the policy's reason, word for word.
    assert sim["reason"] == job["reason"] and "budget: finishing needs at least" in sim["reason"]


@pytest.mark.e2e
def test_a_minimum_bill_that_would_cross_the_budget_blocks_the_launch_in_both(spotrain_home: Path, tmp_path: Path) -> None:
    scenario = tmp_path / "minbill.yaml"
    scenario.write_text("min_billed: 10h\n")
    sim = simulate("--job", str(QUICKSTART), "--set", "objective.budget_usd=1.0", "--min-billed-seconds", "36000")
    job, _ = run(QUICKSTART, "--scenario", str(scenario), "--set", "objective.budget_usd=1.0")
    assert sim["state"] == job["state"] == "FAILED_BUDGET"
    assert sim["cost_usd"] == job["cost_usd"] == 0.0 and job["workers"] == []
    assert sim["reason"] == job["reason"] and "36000 s each at least" in job["reason"]
    # Without the minimum the same budget runs the job (two workers: about $0.52 to finish).
    free = simulate("--job", str(QUICKSTART), "--set", "objective.budget_usd=1.0")
    assert free["state"] == "SUCCEEDED" and free["cost_usd"] <= 1.0


def launches(reasons: list[str]) -> list[tuple[str, str]]:
    out = []
    for r in reasons:
        m = re.search(r"i-[0-9a-f]+ on (\S+) \((spot|on-demand)\)", r)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def simulated_launches(spec_path: Path, *, tick_s: float, restart_overhead_s: float) -> tuple[list[tuple[str, str]], float, int]:
    """The controller on a virtual clock over the same trace: its launches, cost and preemptions."""
    from autoscaler.jobs.spec import load_spec
    from autoscaler.policy import get_policy
    from autoscaler.simulator import make_sim_job
    from autoscaler.simulator.executor import SimWorkload
    from autoscaler.simulator.world import World
    from cloud_providers.local.market import MarketTrace

    spec, _ = load_spec(spec_path)
    job = make_sim_job(spec, restart_overhead_s=restart_overhead_s)
    world = World(MarketTrace.load(MARKET), get_policy(), grid_s=tick_s)
    job_id = world.submit(spec, SimWorkload(job.work, job.scaling, restart_overhead_s))
    world.run(horizon_s=86400.0)
    out = world.outcome(job_id)
    assert out.state == "SUCCEEDED", world.events(job_id)
    return launches([r for _, kind, _, r in world.events(job_id) if kind == "launched"]), out.cost_usd, out.preemptions


@pytest.mark.e2e
@pytest.mark.slow
def test_run_and_simulate_make_the_same_allocations_and_agree_on_cost(spotrain_home: Path, tmp_path: Path) -> None:
    """A one-worker job on a two-zone market whose cheaper zone runs out of spot 300 market-seconds
    in: both take the cheap zone, are preempted, and move to the other zone; costs within 5 %."""
    scale = 30.0
    steps, step_s = 400, 0.1  # 40 real seconds = 1200 market seconds of training
    work_gpu_h = steps * step_s * scale * 0.4 / 3600.0  # T4 runs at 0.4 reference GPU-seconds a second
    spec = write_pw_spec(tmp_path, workers="{min: 1, max: 1}",
                         extra=f"simulate: {{work_gpu_hours: {work_gpu_h}}}\n")
    scenario = tmp_path / "market.yaml"
    scenario.write_text(f"market: {MARKET}\ntime_scale: {scale}\n")
    job, stderr = run(spec, "--scenario", str(scenario), env={"PW_STEPS": str(steps), "PW_STEP_S": str(step_s)}, timeout=240)
    assert job["state"] == "SUCCEEDED", stderr[-3000:]
    real = launches(re.findall(r"launched\s+(i-[0-9a-f]+ on \S+ \((?:spot|on-demand)\))", run_cli("logs", job["job_id"]).stdout))
    # The embedded controller ticks every 0.25 s of wall time: the simulated one decides as often,
    # with the restart overhead the real one measured (process start and restore on this machine).
    d = job["restart_overhead_s"]
    assert d is not None and 0 < d < 600, job
    sim, sim_cost, sim_preemptions = simulated_launches(spec, tick_s=0.25 * scale, restart_overhead_s=d)
    assert real == sim == [("aws/us-east-1a/g4dn.xlarge/T4:1", "spot"), ("aws/us-east-1b/g4dn.xlarge/T4:1", "spot")]
    assert job["preemptions"] == sim_preemptions == 1
    assert abs(sim_cost - job["cost_usd"]) <= 0.05 * job["cost_usd"], (sim_cost, job["cost_usd"])
