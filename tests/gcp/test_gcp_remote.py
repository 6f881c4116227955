"""The real-cloud path on the GCP fakes: `spotrain controller start --cloud gcp --executor remote`, with the
test playing the GCE machines (the mirror of ``tests/aws/test_aws_remote.py``, on the torch-free worker).

For every VM the controller inserts in the Compute fake, the test does what the VM would: it reads the
VM's metadata back from Compute, checks that the ``startup-script`` is the fixed one that starts the
agent module with the config file, and starts ``python -m cloud_providers.remote.agent`` with the
config from the ``spotrain-agent-config`` key, its metadata endpoint pointed at the VM's own loopback
metadata server (``FakeGceMetadata``, named as the VM). The agents fetch their assignments from the
controller over HTTP and run the job.

The preemption is delivered through the VM's metadata server only: ``instance/preempted`` turns TRUE,
which the agent's long poll sees at once, and Compute keeps the VM RUNNING. The agent writes the
workers' notice file and reports the notice; the worker checkpoints and exits. Then Compute deletes the
VM (``instanceTerminationAction=DELETE``) and every process on the machine is SIGKILLed. The job must
still succeed, on a replacement VM, with nothing left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aws.test_aws_remote import free_port, session_pids

from cloud_providers.base import TAG_CONTROLLER
from cloud_providers.gcp import userdata
from cloud_providers.gcp.labels import decode_labels
from support import PROTOCOL_WORKER, REPO, assert_no_workers, start_controller, worker_pids, write_pw_spec

from .fake_compute import FakeCompute
from .fake_metadata import FakeGceMetadata

pytestmark = [pytest.mark.gcp, pytest.mark.e2e]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
AGENT_MODULE = "cloud_providers.remote.agent"
NOTICE_S = 1.0  # Compute gives 30 s; the worker stops at its next step
PW_STEPS = 40


class Machine:
    """One Compute fake VM played as a machine: its metadata server and its agent process."""

    def __init__(self, name: str, config: dict[str, Any], root: Path, env: dict[str, str]) -> None:
        self.name = name
        self.metadata = FakeGceMetadata(name=name, ip="127.0.0.1").__enter__()
        self.dir = root / name
        self.dir.mkdir(parents=True)
        config = {**config, "gce_metadata_endpoint": self.metadata.endpoint, "state_dir": str(self.dir / "state"),
                  "advertise_address": "127.0.0.1", "poll_s": 0.2}
        self.config_path = self.dir / "agent.json"
        self.config_path.write_text(json.dumps(config))
        self.log = self.dir / "agent.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", AGENT_MODULE, "--config", str(self.config_path)], cwd=REPO, env=env,
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"),
        )
        self.died = False

    def training(self, attempt: int) -> bool:
        return (self.dir / "state" / "attempts" / str(attempt) / "progress.json").exists()

    def die(self) -> None:
        """The VM is deleted: every process on it is SIGKILLed at once."""
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        self.died = True

    def close(self) -> None:
        if self.proc.poll() is None:
            self.die()
        self.metadata.__exit__()


def boot(compute: FakeCompute, name: str, root: Path, env: dict[str, str]) -> Machine:
    """What the VM does at boot: Compute runs its startup script, which copies the agent config out of
    the metadata and starts the agent with it."""
    record = compute.instance(name)
    assert record is not None
    items = {i["key"]: i["value"] for i in record["metadata"]["items"]}
    script = items[userdata.SCRIPT_KEY]
    assert script == userdata.AgentBoot().script(), script  # fixed text, no job data
    assert f"-m {AGENT_MODULE} --config {userdata.CONFIG_PATH}" in script
    config = json.loads(items[userdata.CONFIG_KEY])
    assert config["notice_sources"] == ["gce-metadata"], config
    assert config["controller_url"].startswith("https://127.0.0.1:"), config  # TLS, pinned (finding 7)
    assert "BEGIN CERTIFICATE" in config["controller_cert_pem"], config
    assert config["agent_credential"].startswith(config["decision_id"] + ":"), config
    return Machine(name, config, root, env)


def ours(compute: FakeCompute, controller_id: str) -> dict[str, str]:
    """VM name -> Compute status, for this controller's VMs."""
    return {i["name"]: i["status"] for i in compute.instances()
            if decode_labels(i.get("labels", {})).get(TAG_CONTROLLER) == controller_id}


@pytest.mark.timeout(120)
def test_a_job_runs_on_agents_and_survives_a_preemption_seen_on_the_metadata_server(
    spotrain_home: Path, tmp_path: Path, gcp_fake_wall: FakeCompute
) -> None:
    compute = gcp_fake_wall
    controller_id = f"remote-{uuid.uuid4().hex[:8]}"
    machine_env = {**os.environ, "SPOTRAIN_HOME": str(spotrain_home), "PW_STEPS": str(PW_STEPS), "PW_STEP_S": "0.05"}
    machines: dict[str, Machine] = {}
    preempted: Machine | None = None
    notice_at = 0.0
    ctl = start_controller(spotrain_home, "--cloud", "gcp", "--executor", "remote", "--id", controller_id,
                           "--rendezvous-port", str(free_port()), env=compute.env())
    assert compute.count("GET", r"/machineTypes$") >= 1  # offerings were listed at start
    assert compute.count("GET", r"/aggregated/instances$") >= 1  # recovery listed the instances
    assert compute.count("GET", r"/operations$") >= 1  # and the preemptions it may have missed
    info = json.loads((spotrain_home / "controller.json").read_text())
    token = (spotrain_home / "token").read_text().strip()
    api = httpx.Client(base_url=info["url"], headers={"Authorization": f"Bearer {token}"}, timeout=10)
    try:
        spec = write_pw_spec(tmp_path, name="remote", workers="{min: 1, max: 1}")
        r = api.post("/v1/jobs", json={"spec": yaml.safe_load(spec.read_text()), "workdir": str(tmp_path)})
        assert r.status_code == 200, r.text
        job_id = r.json()["job_id"]
        deadline = time.time() + 90
        job = api.get(f"/v1/jobs/{job_id}").json()
        while job["state"] not in TERMINAL and time.time() < deadline:
            for name, status in ours(compute, controller_id).items():
                if status == "RUNNING" and name not in machines:
                    machines[name] = boot(compute, name, tmp_path / "machines", machine_env)
            if preempted is None:
                started = [m for m in machines.values() if m.training(1)]
                if started:
                    preempted = started[0]
                    preempted.metadata.preempt()  # the metadata server only: Compute still says RUNNING
                    notice_at = time.time()
            elif not preempted.died and time.time() - notice_at >= NOTICE_S:
                compute.preempt(preempted.name, complete=True)  # then Compute deletes the VM
                preempted.die()
            time.sleep(0.1)
            job = api.get(f"/v1/jobs/{job_id}").json()
        if job["state"] != "SUCCEEDED":
            # pytest shows captured output whole, where an assertion's repr is cut: the log is what
            # says why a run stalled (stop 28's CI: PROVISIONING after the agent checked in).
            log = (spotrain_home / "controller.log").read_text()
            print(json.dumps(job, indent=1), "\n--- controller.log ---\n", log[-12000:])
            print("--- instances on the fake ---", ours(compute, controller_id), "machines booted:", sorted(machines))
        assert job["state"] == "SUCCEEDED", job["state"]
        assert preempted is not None and preempted.died, "the job finished before a preemption"
        # Released VMs: their agents hear 410 from the controller and exit 0 by themselves.
        for m in machines.values():
            if not m.died:
                assert m.proc.wait(timeout=15) == 0, m.log.read_text()[-2000:]
        logs = api.get(f"/v1/jobs/{job_id}/logs").text
    finally:
        api.close()
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=15)
        except subprocess.TimeoutExpired:
            ctl.kill()
        for m in machines.values():
            m.close()

    assert "cloud gcp, executor remote" in (spotrain_home / "controller.log").read_text()
    assert job["preemptions"] >= 1 and job["attempts"] >= 2 and job["step"] == PW_STEPS, job
    # The notice reached the controller through the agent, from the long poll of instance/preempted.
    assert "preemption-notice" in logs and preempted.name in logs, logs
    polls = [q for p, q in preempted.metadata.requests if p == "/computeMetadata/v1/instance/preempted"]
    assert any("wait_for_change=true" in q for q in polls), polls
    assert any((preempted.dir / "state" / "attempts").rglob("notice.json"))
    assert len(machines) >= 2, machines.keys()  # the replacement booted its own agent
    assert compute.instance(preempted.name) is None
    assert ours(compute, controller_id) == {}
    assert_no_workers(str(PROTOCOL_WORKER), str(spotrain_home))
    assert worker_pids(AGENT_MODULE, str(spotrain_home)) == []
