"""Issue 21, finding 9, the controller's side: each job gets its own checkpoint key at submit, its
workers get it as ``SPOTRAIN_CHECKPOINT_KEY``, ``spotrain resume`` carries it with the checkpoint URI,
and it appears in no event, log line or API answer. The runtime's side (signing, refusing forgeries)
is ``tests/runtime/test_checkpoint_signing.py``. Runs the controller on the simulated world (no torch).
Fails on the code before the fix (no key was issued)."""

from __future__ import annotations

import json
import logging
import stat
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from autoscaler.jobs.spec import spec_from_dict
from autoscaler.policy import CheapestPolicy
from autoscaler.server.resume import resume_job
from autoscaler.simulator.executor import SimWorkload
from autoscaler.simulator.world import World
from autoscaler.state import Job
from autoscaler.state.models import Event
from cloud_providers.local.market import HEADER, MarketTrace
from cloud_providers.protocol import ENV_CHECKPOINT_KEY
from cost_models.scaling import LinearScaling


def world() -> World:
    row = "0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,4"
    return World(MarketTrace.parse(",".join(HEADER) + "\n" + row + "\n", source="calm"), CheapestPolicy())


def spec(name: str) -> object:
    return spec_from_dict({"name": name, "run": "python train.py",
                           "resources": {"accelerators": ["V100:1"], "clouds": ["aws"]}})


def workload() -> SimWorkload:
    return SimWorkload(work_s=3600.0, scaling=LinearScaling(), restart_overhead_s=60.0, checkpoint_save_s=10.0,
                       checkpoint_interval_s=600.0)


def test_finding9_each_job_gets_its_own_key_its_workers_get_it_and_nothing_shows_it(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    w = world()
    a, b = w.submit(spec("ka"), workload()), w.submit(spec("kb"), workload())
    w.run(horizon_s=1800.0)
    with w.store.session() as s:
        keys = {j: s.get(Job, j).checkpoint_key for j in (a, b)}
        events = [f"{e.kind} {e.reason}" for e in s.scalars(select(Event))]
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys.values()), keys
    assert keys[a] != keys[b]
    for job_id in (a, b):
        gang = w.executor._jobs[job_id].gang
        assert gang is not None and gang.env[ENV_CHECKPOINT_KEY] == keys[job_id]
    shown = "\n".join(events) + caplog.text + json.dumps([w.controller.job_info(j) for j in (a, b)])
    assert events and all(k not in shown for k in keys.values())


def test_finding9_resume_carries_the_ended_jobs_key_with_its_checkpoints() -> None:
    """The resumed job continues the ended job's checkpoint URI, whose manifests are signed with the
    ended job's key: it gets that key (a new one would refuse them all)."""
    w = world()
    old = w.submit(spec("kr"), workload())
    w.run(horizon_s=600.0)
    w.controller.cancel(old)
    new = resume_job(w.controller, old)["job_id"]
    with w.store.session() as s:
        old_row, new_row = s.get(Job, old), s.get(Job, new)
        assert new_row.checkpoint_uri == old_row.checkpoint_uri
        assert new_row.checkpoint_key == old_row.checkpoint_key != ""


def test_finding9_a_job_from_before_keys_stays_unsigned() -> None:
    """A job stored by an older controller has no key (the column's default, ""): its workers get no
    SPOTRAIN_CHECKPOINT_KEY, so its unsigned checkpoints keep resuming."""
    w = world()
    job_id = w.submit(spec("ko"), workload())
    with w.store.session() as s:
        s.get(Job, job_id).checkpoint_key = ""
        s.commit()
    w.run(horizon_s=1800.0)
    gang = w.executor._jobs[job_id].gang
    assert gang is not None and ENV_CHECKPOINT_KEY not in gang.env


def test_finding9_the_local_executors_agent_config_holding_the_key_is_private(tmp_path: Path) -> None:
    """``--executor local`` writes each attempt's environment (the key included) to ``agent.json``:
    mode 0600, as the rest of SPOTRAIN_HOME's secrets (it was 0644 by the umask)."""
    from cloud_providers.executor import WorkerLaunch
    from cloud_providers.local.executor import LocalExecutor

    executor = LocalExecutor(tmp_path / "cloud")
    executor.start(WorkerLaunch(
        instance_id="i-1", job_id="kl-1", attempt=1, run="true", setup=None, cwd=str(tmp_path), ranks=[0],
        world_size=1, master_addr="127.0.0.1", master_port=29500, env={ENV_CHECKPOINT_KEY: "ab" * 32},
        log_dir=str(tmp_path / "logs")))
    try:
        configs = list((tmp_path / "cloud").rglob("agent.json"))
        assert len(configs) == 1 and "ab" * 32 in configs[0].read_text()
        assert stat.S_IMODE(configs[0].stat().st_mode) == 0o600
        deadline = time.monotonic() + 30
        while executor.status("i-1", 1).state.value == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        executor.stop("i-1")
