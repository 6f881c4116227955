"""Chaos on the GCP fake: SIGKILL the controller at random moments of a run and check that nothing leaks.

The mirror of ``tests/aws/test_aws_chaos.py``, bounded to well under a minute. The real product runs
(`spotrain controller start --cloud gcp --executor local` against the loopback Compute fake) with two
jobs of the torch-free protocol worker, submitted over the run. The controller is killed with SIGKILL
at ``KILLS`` seeded random moments, from its start-up (recovery included) to the middle of a tick, and
started again each time. On top of that:

- the start that takes each job, and a seeded share of the others, run with
  ``SPOTRAIN_FAULT_CRASH_AFTER_LAUNCH=1``: that controller dies right after ``instances.insert``
  (and its zone operation) returned, before it recorded the instance, the window recovery must get
  right (adopt by label, never launch that decision again);
- one Spot VM of a training job is preempted (STOPPING with a preempted status, then deleted by
  Compute); if none was by the time the jobs are done, one more job is submitted to take it;
- one orphan is planted: a VM labelled with this controller for a job its database does not know,
  which the next start must delete.

Compute forgets a deleted VM, so the fake here also keeps the list of every VM an insert created
(``RecordingCompute``): afterwards no VM of the controller is left, every ``spotrain-decision`` label is
on at most one VM ever created (no decision launched twice), the created VMs are exactly the decisions
the database records as launched, no decision is left pending, every job succeeded, and every gang the
executor started is consistent (one rendezvous port and world size per attempt, each rank once).
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from autoscaler.controller import FAULT_CRASH_AFTER_LAUNCH_ENV, FAULT_EXIT_CODE
from cloud_providers.base import SPOT, TAG_CONTROLLER, TAG_DECISION, TAG_JOB, TAG_MARKET, LaunchRequest
from cloud_providers.gcp.labels import decode_labels
from cloud_providers.protocol import ENV_JOB_ID
from support import PROTOCOL_WORKER, assert_no_workers, run_cli, write_pw_spec

from .fake_compute import FakeCompute

pytestmark = [pytest.mark.gcp, pytest.mark.e2e, pytest.mark.slow]

KILLS = 8
SEED = int(os.environ.get("SPOTRAIN_CHAOS_SEED", "0"))  # other seeds: other kill moments
SUBMIT_AT_KILL = {0: "chaos-a", 3: "chaos-b"}
ORPHAN_AT_KILL = 2
PREEMPT_AT_KILL = 4
FAULT_PROBABILITY = 0.25  # share of other starts that crash right after their first launch
PW_STEPS, PW_STEP_S = 100, 0.05  # 5 s of "training" per job
NOTICE_S = 1.0  # Compute gives 30 s; the protocol worker stops at its next step
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
RECOVERY_LINE = re.compile(r"spotrain\.recovery INFO recovery: (\{.*\})")
# A controller that runs long enough after the orphan is planted terminates it in a periodic sweep
# rather than at its next start: both count.
SWEEP_LINE = re.compile(r"spotrain\.recovery INFO sweep: (\{.*\})")


class RecordingCompute(FakeCompute):
    """The Compute fake, remembering every VM an insert created (Compute forgets deleted ones)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.created: list[dict[str, Any]] = []

    def _insert(self, zone: str, q: Any, body: Any) -> tuple[int, Any]:
        before = set(self._instances)
        answer = super()._insert(zone, q, body)
        for key in set(self._instances) - before:  # under the fake's lock (its dispatcher holds it)
            self.created.append({"zone": key[0], "name": key[1],
                                 "tags": decode_labels(self._instances[key].get("labels", {}))})
        return answer


class ControllerRunner:
    """Starts `spotrain controller start --cloud gcp` processes the way an operator (or systemd) would."""

    def __init__(self, home: Path, controller_id: str, env: dict[str, str]) -> None:
        self.home, self.controller_id, self.env = home, controller_id, env
        self.starts = 0

    def spawn(self, *, fault: bool) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env, "SPOTRAIN_HOME": str(self.home)}
        if fault:
            env[FAULT_CRASH_AFTER_LAUNCH_ENV] = "1"
        self.starts += 1
        with open(self.home / "controller.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--cloud", "gcp",
                 "--executor", "local", "--id", self.controller_id, "--port", "0", "--tick", "0.2"],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> bool:
        """True once ``proc`` serves its API; False if it died first."""
        info = self.home / "controller.json"
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if proc.poll() is not None:
                return False
            try:
                if json.loads(info.read_text())["pid"] == proc.pid:
                    return True
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        raise AssertionError("controller did not become ready")


def ours(compute: FakeCompute, controller_id: str) -> list[dict[str, Any]]:
    return [i for i in compute.instances() if decode_labels(i.get("labels", {})).get(TAG_CONTROLLER) == controller_id]


def plant_orphan(compute: FakeCompute, controller_id: str) -> str:
    """A VM of this controller for a job its database has never heard of: recovery must delete it."""
    from cloud_providers.gcp import make_provider

    provider = make_provider(controller_id=controller_id, endpoint=compute.endpoint, project=compute.project,
                             zones=list(compute.zones))
    offering = next(o for o in provider.offerings() if o.accelerator == "T4" and o.gpus == 1)
    tags = {TAG_CONTROLLER: controller_id, TAG_JOB: "ghost-job-000000", TAG_MARKET: SPOT, TAG_DECISION: "d-ghost"}
    return provider.launch(LaunchRequest(offering=offering, market=SPOT, decision_id="d-ghost", tags=tags)).instance_id


def preempt_one(compute: FakeCompute) -> str | None:
    """Preempt the VM of a job that is training, while a controller is up to see the notice (a VM that
    Compute preempts and deletes while no controller runs is test_gcp_controller.py's case), then end
    the preemption as Compute does, by deleting it."""
    training = [j for j in all_jobs() if j["state"] == "RUNNING" and j["workers"] and (j.get("step") or 0) > 0]
    if not training:
        return None
    # The job furthest from its end: one that finished during the notice would have its VM released first.
    name = str(min(training, key=lambda j: j["step"])["workers"][0]["instance_id"])
    vm = compute.instance(name)
    if vm is None or vm["status"] != "RUNNING":  # released or replaced since the status was read
        return None
    try:
        compute.preempt(name)
    except KeyError:  # released in between
        return None
    time.sleep(NOTICE_S)
    return name if compute.complete_preemption(name) else None  # None: released during the notice


def submit(name: str, tmp_path: Path, proc: subprocess.Popen[bytes]) -> str | None:
    """Submit job ``name``; None if the controller died around it (tried again on the next start). A job
    the controller committed before it died is found by name rather than submitted twice."""
    known = [j["job_id"] for j in all_jobs() if j["name"] == name]
    if known:
        return str(known[0])
    r = run_cli("submit", str(write_pw_spec(tmp_path, name=name, workers="{min: 1, max: 1}")), "--json")
    if r.returncode == 0:
        return str(json.loads(r.stdout.strip().splitlines()[-1])["job_id"])
    proc.wait(timeout=10)  # only a controller that crashed (the fault hook) may fail a submission
    assert proc.returncode == FAULT_EXIT_CODE, r.stderr
    return None


def all_jobs() -> list[dict[str, Any]]:
    r = run_cli("status", "--all", "--json")
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(jobs, list)
    return jobs


def api_jobs() -> list[dict[str, Any]]:
    """``all_jobs`` from the running controller's API in this process, for polling (no CLI start)."""
    from autoscaler.client.http import Client

    return [j.to_json_dict() for j in Client(timeout_s=30).jobs()]


def gang_records(executor_root: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    gangs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for path in executor_root.glob("instances/*/attempt-*/agent.json"):
        cfg = json.loads(path.read_text())
        gangs.setdefault((cfg["env"][ENV_JOB_ID], cfg["attempt"]), []).append(
            {k: cfg[k] for k in ("instance_id", "master_port", "world_size", "ranks")})
    return gangs


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(180)
def test_sigkill_chaos_on_the_gcp_fake(spotrain_home: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    controller_id = f"chaos-{uuid.uuid4().hex[:8]}"
    began = time.time()
    with RecordingCompute() as compute:
        env = {**compute.env(), "PW_STEPS": str(PW_STEPS), "PW_STEP_S": str(PW_STEP_S)}
        runner = ControllerRunner(spotrain_home, controller_id, env)
        kills = fault_crashes = 0
        job_ids: list[str] = []
        orphan: str | None = None
        preempted: str | None = None
        extra: str | None = None  # a job submitted at the end only to be preempted (see below)
        proc: subprocess.Popen[bytes] | None = None
        try:
            while kills < KILLS:
                name = SUBMIT_AT_KILL.get(kills)
                if name in {j.rsplit("-", 1)[0] for j in job_ids}:
                    name = None
                # A new job's first launch is a crash window that is sure to come: aim the fault at it.
                fault = name is not None or rng.random() < FAULT_PROBABILITY
                proc = runner.spawn(fault=fault)
                kill_at = time.time() + rng.uniform(0.3, 2.5)  # from spawn: start-up and recovery included
                if name is not None and runner.wait_ready(proc):
                    job_id = submit(name, tmp_path, proc)
                    if job_id is not None:
                        job_ids.append(job_id)
                        kill_at = time.time() + rng.uniform(0.1, 2.0)
                if kills >= ORPHAN_AT_KILL and orphan is None:
                    orphan = plant_orphan(compute, controller_id)
                if kills >= PREEMPT_AT_KILL and preempted is None and not fault and runner.wait_ready(proc):
                    preempted = preempt_one(compute)
                    if preempted is not None:
                        kill_at = time.time() + rng.uniform(0.3, 2.0)
                while time.time() < kill_at and proc.poll() is None:
                    time.sleep(0.02)
                if proc.poll() is not None:
                    # Only the fault hook makes a controller exit on its own here.
                    assert fault and proc.returncode == FAULT_EXIT_CODE, (proc.returncode, fault)
                    fault_crashes += 1
                    continue
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1

            # Let a last controller, without faults, finish the work.
            proc = runner.spawn(fault=False)
            assert runner.wait_ready(proc)
            deadline = time.time() + 90
            while time.time() < deadline:
                jobs = api_jobs()
                live = any(j["state"] not in TERMINAL for j in jobs)
                if not live and (preempted is not None or extra is not None):
                    break
                if preempted is None:
                    # The kills left no training job to preempt (a slow machine): preempt one now, and
                    # if every job finished first, submit one more for it, so that timing never decides.
                    if live:
                        preempted = preempt_one(compute)
                    elif extra is None:
                        extra = submit("chaos-extra", tmp_path, proc)
                        assert extra is not None
                        job_ids.append(extra)
                time.sleep(0.2)
            jobs = all_jobs()  # what the CLI says
        finally:
            stop(proc)
        wall_s = time.time() - began

        # Every job finished, with its final weights.
        assert len(job_ids) == len(SUBMIT_AT_KILL) + (extra is not None)
        assert {j["job_id"] for j in jobs} == set(job_ids)
        for job in jobs:
            assert job["state"] == "SUCCEEDED", job
            assert job["step"] == PW_STEPS and Path(job["final_model"].removeprefix("file://")).is_file(), job
        assert preempted is not None, "no running VM to preempt"
        assert sum(j["preemptions"] for j in jobs) >= 1 and sum(j["attempts"] for j in jobs) >= 3  # resumed

        # No VM left; no decision launched twice; what was created matches the database.
        still_up = [i["name"] for i in ours(compute, controller_id)]
        assert still_up == [], still_up
        created = [c for c in compute.created if c["tags"].get(TAG_CONTROLLER) == controller_id]
        per_decision = Counter(c["tags"].get(TAG_DECISION) for c in created)
        assert None not in per_decision
        twice = {d: n for d, n in per_decision.items() if n > 1}
        assert twice == {}, f"decisions launched more than once: {twice}"
        db = sqlite3.connect(spotrain_home / "spotrain.db")
        try:
            statuses = dict(db.execute("SELECT status, COUNT(*) FROM decisions GROUP BY status").fetchall())
            launched = dict(db.execute(
                "SELECT decision_id, instance_id FROM decisions WHERE status = 'launched'").fetchall())
            adopted_unrecorded = db.execute(
                "SELECT COUNT(*) FROM events WHERE kind = 'adopted' AND reason LIKE '%unrecorded launch%'"
            ).fetchone()[0]
        finally:
            db.close()
        assert statuses.get("pending", 0) == 0, statuses
        mine = {c["tags"][TAG_DECISION]: c["name"] for c in created if c["name"] != orphan}
        assert mine == launched, "every VM created is a decision the database records as launched, and vice versa"
        assert orphan is not None and orphan not in still_up

        # The crash window between insert and recording it was hit, and recovered by adoption.
        log_text = (spotrain_home / "controller.log").read_text(errors="replace")
        recoveries = [ast.literal_eval(m.group(1)) for m in RECOVERY_LINE.finditer(log_text)]
        assert fault_crashes >= 1 and adopted_unrecorded >= 1, (fault_crashes, adopted_unrecorded)
        sweeps = [ast.literal_eval(m.group(1)) for m in SWEEP_LINE.finditer(log_text)]
        # The orphan was deleted by a controller's DELETE call (recovery or a sweep). Its log line is
        # not asserted: a SIGKILL can land between the call and the line.
        assert compute.count("DELETE", rf"/instances/{orphan}$") >= 1, "the orphan was never deleted"
        gangs = gang_records(spotrain_home / "localcloud" / controller_id / "executor")
        for (job_id, attempt), members in gangs.items():
            ports = {m["master_port"] for m in members}
            worlds = {m["world_size"] for m in members}
            ranks = sorted(r for m in members for r in m["ranks"])
            assert len(ports) == 1 and len(worlds) == 1, (job_id, attempt, members)
            assert ranks == list(range(worlds.pop())), (job_id, attempt, members)
        assert_no_workers(str(PROTOCOL_WORKER), str(spotrain_home))

    figures = {
        "sigkills": kills, "fault_crashes_after_insert": fault_crashes, "controller_starts": runner.starts,
        "recoveries_completed": len(recoveries), "jobs_succeeded": sum(j["state"] == "SUCCEEDED" for j in jobs),
        "gangs_started": len(gangs), "vms_created": len(created), "decisions": sum(statuses.values()),
        "decisions_failed": statuses.get("failed", 0), "adopted_unrecorded_launches": adopted_unrecorded,
        "orphans_terminated": sum(r["orphans_terminated"] for r in [*recoveries, *sweeps]),
        "preemptions": sum(j["preemptions"] for j in jobs), "vms_left": len(still_up),
        "decisions_launched_twice": len(twice), "wall_s": round(wall_s, 1),
    }
    print("\nchaos on the GCP fake: closing figures")
    for key, value in figures.items():
        print(f"  {key:<28}  {value}")
    print(json.dumps(figures))
