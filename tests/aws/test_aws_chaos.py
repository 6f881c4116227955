"""Chaos on moto: SIGKILL the controller at 20 random moments of a run and check that nothing leaks.

The real product runs (`spotrain controller start --cloud aws --executor local` against moto's
server) with three jobs of the torch-free protocol worker, submitted over the run. The controller is
killed with SIGKILL at 20 seeded random moments, anywhere from its start-up (recovery included) to
the middle of a tick, and started again each time. On top of that:

- the start that takes each job, and a seeded share of the others, run with
  ``SPOTRAIN_FAULT_CRASH_AFTER_LAUNCH=1``, so that controller dies right after ``RunInstances``
  returned and before it recorded the instance: the window a random kill almost never hits, and the
  one recovery must get right (adopt by tag, never launch that decision again);
- one spot interruption is delivered to the instance of a training job (notice, then termination);
  if none was counted by the time the jobs are done, one more job is submitted to take it;
- one orphan is planted: an instance tagged with this controller for a job its database does not
  know, which the next start must terminate.

Afterwards every job has succeeded, no instance of the controller is left pending or running, every
``spotrain-decision`` tag is on at most one instance (no decision launched twice), the instances are
exactly the decisions the database records as launched, no decision is left pending, and every gang
the executor started is consistent (one rendezvous port and world size per attempt, each rank once),
which a crash in the middle of starting a gang used to break. The closing figures are printed as a
table and a JSON line (docs/aws.md records them).
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
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from autoscaler.controller import FAULT_CRASH_AFTER_LAUNCH_ENV, FAULT_EXIT_CODE
from cloud_providers.aws.instances import SPOT_TERMINATION
from cloud_providers.base import TAG_CONTROLLER, TAG_DECISION, TAG_JOB
from cloud_providers.protocol import ENV_JOB_ID
from support import PROTOCOL_WORKER, assert_no_workers, run_cli, write_pw_spec

from .harness import TEST_SPOT_PRICES, MotoServer, any_image_id, deliver_spot_interruption, ec2_client

pytestmark = [pytest.mark.aws, pytest.mark.e2e, pytest.mark.slow]

KILLS = 20
SEED = int(os.environ.get("SPOTRAIN_CHAOS_SEED", "0"))  # other seeds: other kill moments
# Kill round at which each job is submitted, so that jobs are live across the whole run.
SUBMIT_AT_KILL = {0: "chaos-a", 5: "chaos-b", 10: "chaos-c"}
INTERRUPT_AT_KILL = 7
ORPHAN_AT_KILL = 3
FAULT_PROBABILITY = 0.25  # share of other starts that crash right after their first launch
PW_STEPS, PW_STEP_S = 150, 0.1  # 15 s of "training" per job
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
RECOVERY_LINE = re.compile(r"spotrain\.recovery INFO recovery: (\{.*\})")
# A controller that runs long enough after the orphan is planted terminates it in a periodic sweep
# rather than at its next start: both count.
SWEEP_LINE = re.compile(r"spotrain\.recovery INFO sweep: (\{.*\})")


class ControllerRunner:
    """Starts `spotrain controller start --cloud aws` processes the way an operator (or systemd) would."""

    def __init__(self, home: Path, controller_id: str, env: dict[str, str]) -> None:
        self.home = home
        self.controller_id = controller_id
        self.env = env
        self.starts = 0

    def spawn(self, *, fault: bool) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env, "SPOTRAIN_HOME": str(self.home)}
        if fault:
            env[FAULT_CRASH_AFTER_LAUNCH_ENV] = "1"
        self.starts += 1
        with open(self.home / "controller.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--cloud", "aws",
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


def all_instances(controller_id: str) -> list[dict[str, Any]]:
    pages = ec2_client().describe_instances(Filters=[{"Name": f"tag:{TAG_CONTROLLER}", "Values": [controller_id]}])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def plant_orphan(controller_id: str) -> str:
    """An instance of this controller for a job its database has never heard of (say, a database
    restored from an older backup): recovery must terminate it."""
    made = ec2_client().run_instances(
        ImageId=any_image_id(), InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": TAG_CONTROLLER, "Value": controller_id},
            {"Key": TAG_JOB, "Value": "ghost-job-000000"},
            {"Key": TAG_DECISION, "Value": "d-ghost"},
        ]}],
    )
    return str(made["Instances"][0]["InstanceId"])


def submit(name: str, tmp_path: Path, proc: subprocess.Popen[bytes]) -> str | None:
    """Submit job ``name``; None if the controller died around it (the caller tries again on the next
    start). A job the controller committed before it died is found by name rather than submitted twice."""
    known = [j["job_id"] for j in all_jobs() if j["name"] == name]
    if known:
        return str(known[0])
    r = run_cli("submit", str(write_pw_spec(tmp_path, name=name)), "--json")
    if r.returncode == 0:
        return str(json.loads(r.stdout.strip().splitlines()[-1])["job_id"])
    proc.wait(timeout=10)  # only a controller that crashed (the fault hook) may fail a submission
    assert proc.returncode == FAULT_EXIT_CODE, r.stderr
    return None


def interrupt_training(jobs: list[dict[str, Any]], controller_id: str) -> threading.Thread | None:
    """Deliver a spot interruption (notice, then termination, in the background) to the instance of
    the job that is training furthest from its end; None if no job is training now."""
    training = [j for j in jobs if j["state"] == "RUNNING" and j["workers"] and (j.get("step") or 0) > 0]
    if not training:
        return None
    instance_id = str(min(training, key=lambda j: j["step"])["workers"][0]["instance_id"])
    running = {i["InstanceId"] for i in all_instances(controller_id) if i["State"]["Name"] == "running"}
    if instance_id not in running:  # released or replaced since the status was read
        return None
    return deliver_spot_interruption(instance_id, notice_s=2.0, background=True)


def all_jobs() -> list[dict[str, Any]]:
    r = run_cli("status", "--all", "--json")
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(jobs, list)
    return jobs


def recovery_counts(log_text: str) -> list[dict[str, int]]:
    return [ast.literal_eval(m.group(1)) for m in RECOVERY_LINE.finditer(log_text)]


def gang_records(executor_root: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """What the local executor started, per (job, attempt): each member's rendezvous settings."""
    gangs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for path in executor_root.glob("instances/*/attempt-*/agent.json"):
        cfg = json.loads(path.read_text())
        gangs.setdefault((cfg["env"][ENV_JOB_ID], cfg["attempt"]), []).append(
            {k: cfg[k] for k in ("instance_id", "master_port", "world_size", "ranks")})
    return gangs


def print_figures(figures: dict[str, Any]) -> None:
    width = max(len(k) for k in figures)
    print("\nchaos on moto: closing figures")
    for key, value in figures.items():
        print(f"  {key:<{width}}  {value}")
    print(json.dumps(figures))


@pytest.mark.timeout(300)
def test_sigkill_chaos_on_moto(spotrain_home: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    controller_id = f"chaos-{uuid.uuid4().hex[:8]}"
    began = time.time()
    with MotoServer() as server:
        env = {**server.env(), "SPOTRAIN_AWS_SPOT_PRICES": json.dumps(dict(TEST_SPOT_PRICES)),
               "PW_STEPS": str(PW_STEPS), "PW_STEP_S": str(PW_STEP_S)}
        runner = ControllerRunner(spotrain_home, controller_id, env)
        kills = fault_crashes = 0
        job_ids: list[str] = []
        orphan: str | None = None
        interruptions: list[threading.Thread] = []  # each delivers one, named after its instance
        extra: str | None = None  # a job submitted at the end only to be interrupted (see below)
        proc: subprocess.Popen[bytes] | None = None
        try:
            while kills < KILLS:
                name = SUBMIT_AT_KILL.get(kills)
                if name in {j.rsplit("-", 1)[0] for j in job_ids}:
                    name = None
                # A new job's first launch is a crash window that is sure to come: aim the fault at it.
                fault = name is not None or rng.random() < FAULT_PROBABILITY
                proc = runner.spawn(fault=fault)
                kill_at = time.time() + rng.uniform(0.3, 4.0)  # from spawn: start-up and recovery included
                if name is not None and runner.wait_ready(proc):
                    job_id = submit(name, tmp_path, proc)
                    if job_id is not None:
                        job_ids.append(job_id)
                        kill_at = time.time() + rng.uniform(0.1, 3.0)
                if kills >= ORPHAN_AT_KILL and orphan is None:
                    orphan = plant_orphan(controller_id)
                if kills >= INTERRUPT_AT_KILL and not interruptions and not fault and runner.wait_ready(proc):
                    thread = interrupt_training(all_jobs(), controller_id)
                    if thread is not None:
                        interruptions.append(thread)
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

            # Let a last controller, without faults, finish the work. If the kills' interruption was
            # not counted (on a loaded machine it can reach an instance whose job had not started
            # training, or one released since), interrupt a training job under this controller; if
            # every job finished first, submit one more job for it, so the test never depends on timing.
            proc = runner.spawn(fault=False)
            assert runner.wait_ready(proc)
            deadline = time.time() + 150
            while time.time() < deadline:
                jobs = all_jobs()
                counted = sum(j["preemptions"] for j in jobs) > 0
                live = any(j["state"] not in TERMINAL for j in jobs)
                if not live and (counted or extra is not None):
                    break
                if not counted and not any(t.is_alive() for t in interruptions):
                    if live:
                        thread = interrupt_training(jobs, controller_id)
                        if thread is not None:
                            interruptions.append(thread)
                    elif extra is None:
                        extra = submit("chaos-extra", tmp_path, proc)
                        assert extra is not None
                        job_ids.append(extra)
                time.sleep(0.5)
            jobs = all_jobs()
        finally:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        wall_s = time.time() - began

        # Every job finished, with its final weights.
        assert len(job_ids) == len(SUBMIT_AT_KILL) + (extra is not None)
        assert {j["job_id"] for j in jobs} == set(job_ids)
        for job in jobs:
            assert job["state"] == "SUCCEEDED", job
            assert job["step"] == PW_STEPS and Path(job["final_model"].removeprefix("file://")).is_file(), job
        assert interruptions, "no training job to interrupt"
        for thread in interruptions:
            thread.join(timeout=10)
        assert sum(j["preemptions"] for j in jobs) >= 1

        # No instance left running; no decision launched twice; the cloud matches the database.
        instances = all_instances(controller_id)
        still_up = [i["InstanceId"] for i in instances if i["State"]["Name"] in ("pending", "running")]
        assert still_up == [], still_up
        per_decision = Counter(tags_of(i).get(TAG_DECISION) for i in instances)
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
        ours = {tags_of(i)[TAG_DECISION]: i["InstanceId"] for i in instances if i["InstanceId"] != orphan}
        assert ours == launched, "every instance is a decision the database records as launched, and vice versa"
        assert orphan is not None and orphan not in still_up
        for thread in interruptions:
            taken = next(i for i in instances if i["InstanceId"] == thread.name.removeprefix("spot-interruption-"))
            assert taken["StateReason"]["Code"] == SPOT_TERMINATION, taken["StateReason"]

        # The crash window between RunInstances and recording it was hit, and recovered by adoption.
        log_text = (spotrain_home / "controller.log").read_text(errors="replace")
        recoveries = recovery_counts(log_text)
        assert fault_crashes >= 1 and adopted_unrecorded >= 1, (fault_crashes, adopted_unrecorded)
        sweeps = [ast.literal_eval(m.group(1)) for m in SWEEP_LINE.finditer(log_text)]
        # The orphan was terminated by a TerminateInstances call (recovery or a sweep; only a controller
        # calls it). Its log line is not asserted: a SIGKILL can land between the call and the line.
        ghost = next(i for i in instances if i["InstanceId"] == orphan)
        assert ghost["State"]["Name"] == "terminated", ghost["State"]
        assert ghost["StateReason"]["Code"].startswith("Client.UserInitiatedShutdown"), ghost["StateReason"]
        gangs = gang_records(spotrain_home / "localcloud" / controller_id / "executor")
        for (job_id, attempt), members in gangs.items():
            ports = {m["master_port"] for m in members}
            worlds = {m["world_size"] for m in members}
            ranks = sorted(r for m in members for r in m["ranks"])
            assert len(ports) == 1 and len(worlds) == 1, (job_id, attempt, members)
            assert ranks == list(range(worlds.pop())), (job_id, attempt, members)
        assert_no_workers(str(PROTOCOL_WORKER), str(spotrain_home))

    print_figures({
        "sigkills": kills,
        "fault_crashes_after_launch": fault_crashes,
        "controller_starts": runner.starts,
        "recoveries_completed": len(recoveries),
        "jobs": len(jobs),
        "jobs_succeeded": sum(j["state"] == "SUCCEEDED" for j in jobs),
        "gangs_started": len(gangs),
        "instances_launched": len(ours),
        "decisions": sum(statuses.values()),
        "decisions_failed": statuses.get("failed", 0),
        "decisions_pending": statuses.get("pending", 0),
        "adopted": sum(r["adopted"] for r in recoveries),
        "adopted_unrecorded_launches": adopted_unrecorded,
        "orphans_terminated": sum(r["orphans_terminated"] for r in [*recoveries, *sweeps]),
        "released_at_recovery": sum(r["released"] for r in recoveries),
        "spot_interruptions": len(interruptions),
        "preemptions": sum(j["preemptions"] for j in jobs),
        "instances_left_running": len(still_up),
        "decisions_launched_twice": len(twice),
        "wall_s": round(wall_s, 1),
    })
