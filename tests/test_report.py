"""``spotrain report JOB``: the picture's data from a real job on the local cloud, and the PNG itself."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoscaler.client.report import cumulative_cost, gather, gpus_by_market, render_png
from autoscaler.controller import Controller
from autoscaler.errors import JobNotFound
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.state import Store
from cloud_providers.local.scenario import parse_scenario
from support import run_cli, write_pw_spec

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET"}


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def run_preempted_job(tmp_path: Path) -> str:
    scenario = parse_scenario("events:\n  - {at_step: 10, preempt: 1}\n", base_dir=tmp_path)
    setup = local_cloud("t-report", scenario=scenario)
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                     controller_id="t-report", tick_s=0.1, clock_rate=setup.clock_rate)
    spec, workdir = load_spec(write_pw_spec(tmp_path, extra="objective: {deadline: 2h, budget_usd: 5}\n"))
    job_id = ctl.submit(spec, workdir)["job_id"]
    deadline = time.time() + 60
    while time.time() < deadline:
        ctl.tick()
        if ctl.job_info(job_id)["state"] in TERMINAL:
            break
        time.sleep(0.1)
    assert ctl.job_info(job_id)["state"] == "SUCCEEDED", ctl.job_info(job_id)
    return job_id


@pytest.mark.e2e
def test_report_of_a_preempted_job(spotrain_home: Path, tmp_path: Path, pw_env: None) -> None:
    job_id = run_preempted_job(tmp_path)
    store = Store(db_url())
    data = gather(store, job_id)
    # Progress: from 0, never backwards, up to the planned 40 steps, with checkpoints in between.
    steps = [st for _, st in data.progress]
    times = [t for t, _ in data.progress]
    assert steps[0] == 0 and steps[-1] == 40 and len(steps) > 5
    assert steps == sorted(steps) and times == sorted(times)
    assert data.deadline_s == 7200 and data.budget_usd == 5
    # The preemption is marked, and the job held spot GPUs, two instances at least (a replacement).
    assert len(data.preemptions_s) >= 1 and len(data.restarts_s) >= 1
    assert all(0 <= t <= data.end_s + 1e-6 for t in data.preemptions_s)
    assert len(data.spans) >= 2
    gpus = gpus_by_market(data, [sp.start_s + 1e-6 for sp in data.spans])
    assert max(gpus["spot"]) >= 1
    # The cumulative cost ends at what was billed, below the on-demand counterfactual.
    billed, od = cumulative_cost(data, [0.0, data.end_s])
    with store.session() as s:
        job = store.job(s, job_id)
        assert job is not None
        assert billed[0] == 0.0 and billed[-1] == pytest.approx(job.cost_usd, rel=1e-6)
        assert od[-1] == pytest.approx(job.on_demand_cost_usd, rel=1e-6) and billed[-1] < od[-1]
    assert png_size(render_png(data)) == (900, 800)
    # The command, with no controller running: drawn from the database.
    out = tmp_path / "r.png"
    r = run_cli("report", job_id, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert png_size(out.read_bytes()) == (900, 800) and "wrote" in r.stdout
    with pytest.raises(JobNotFound):
        gather(store, "no-such-job")


def test_status_logs_cancel_do_not_import_matplotlib(spotrain_home: Path) -> None:
    """Nor the progress renderer (rich itself comes with httpx, which imports it when installed)."""
    code = ("import sys\nfrom autoscaler.cli.main import main\n"
            "for argv in (['status'], ['logs', 'nope'], ['cancel', 'nope']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('matplotlib', 'autoscaler.cli.progress', 'torch') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr
