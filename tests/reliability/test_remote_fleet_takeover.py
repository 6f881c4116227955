"""A fleet takeover keeps its remote agents (issue 21, finding 3): two ``--executor remote``
controllers of one fleet on PostgreSQL and the GCP fake; the leader is SIGKILLed mid-job.

Two ``spotrain controller start --cloud gcp --executor remote`` processes run with one ``--id``, one
``SPOTRAIN_DB_URL`` (a throwaway PostgreSQL, tests/pg_support.py) and one ``SPOTRAIN_FLEET_DIR``, each
with a home of its own (its API token, ``controller.json`` and log). Each serves its agents' HTTPS
listener on a port of its own; both tell the agents one ``--advertise-url``, a TCP forwarder in this
test that plays the fleet's load balancer: it connects to the leader's port and, when that refuses,
to the standby's. The test plays the VMs as ``tests/gcp/test_gcp_remote.py`` does (it starts each VM's
agent from its metadata). A job of the torch-free protocol worker runs on one VM; once it has made
progress the leader is SIGKILLed. The standby must take over, and the agent already running must go
on reporting to it: no request of any agent is refused (401: on main the standby had a key of its
own, refused every agent, and after 30 s of silence counted the gang LOST and bought a new VM), the
job SUCCEEDS in its first attempt on its first VM, and nothing is left running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gcp.fake_compute import FakeCompute
from gcp.test_gcp_remote import Machine, boot, ours

from autoscaler.state.lease import read_lease
from support import PROTOCOL_WORKER, assert_no_workers, free_port, worker_pids, write_pw_spec

from .figures import record

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.slow, pytest.mark.gcp]

AGENT_MODULE = "cloud_providers.remote.agent"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
PW_STEPS, PW_STEP_S = 120, 0.1  # 12 s of "training"
KILL_AT_STEP = 15
LEASE_TTL_S = 4.0
TAKEOVER_LIMIT_S = 20.0


class FailoverForwarder:
    """A TCP load balancer on loopback: each connection goes to the first backend that accepts it."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = {port: 0 for port in backends}
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            for port in self.backends:
                try:
                    backend = socket.create_connection(("127.0.0.1", port), timeout=2)
                except OSError:
                    continue
                backend.settimeout(None)
                self.connections[port] += 1
                for a, b in ((client, backend), (backend, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()
                break
            else:
                client.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.sock.close()


def spawn(home: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "controller.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--port", "0", "--tick", "0.2", *args],
            env={**os.environ, **env, "SPOTRAIN_HOME": str(home)}, stdout=subprocess.DEVNULL, stderr=log,
        )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if json.loads((home / "controller.json").read_text())["pid"] == proc.pid:
                return proc
        except (OSError, ValueError, KeyError):
            pass
        if proc.poll() is not None:
            raise AssertionError(f"controller exited: {(home / 'controller.log').read_text()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("controller did not start")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def api(home: Path) -> httpx.Client:
    info = json.loads((home / "controller.json").read_text())
    token = (home / "token").read_text().strip()
    return httpx.Client(base_url=info["url"], headers={"Authorization": f"Bearer {token}"}, timeout=10)


def refused(machines: dict[str, Machine]) -> list[str]:
    """Lines where an agent says the controller refused it (the agent logs each refusal status once
    per spell of unreachability, after a connection error too)."""
    return [line for m in machines.values() for line in m.log.read_text(errors="replace").splitlines()
            if "HTTP 401" in line or "HTTP 403" in line]


@pytest.mark.timeout(180)
def test_a_takeover_keeps_the_remote_agents_and_the_job_succeeds(spotrain_home: Path, tmp_path: Path,
                                                                   postgres_url: str) -> None:
    fleet_id = f"fleet-remote-{uuid.uuid4().hex[:6]}"
    fleet_dir = tmp_path / "fleet"
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    port_a, port_b = free_port(), free_port()
    forwarder = FailoverForwarder([port_a, port_b])
    machines: dict[str, Machine] = {}
    leader = standby = None
    client: httpx.Client | None = None
    engine = None
    with FakeCompute() as compute:
        env = {"SPOTRAIN_DB_URL": postgres_url, "SPOTRAIN_FLEET_DIR": str(fleet_dir), **compute.env()}
        common = ("--cloud", "gcp", "--executor", "remote", "--id", fleet_id, "--lease-ttl", str(LEASE_TTL_S),
                  "--advertise-url", f"https://127.0.0.1:{forwarder.port}", "--rendezvous-port", str(free_port()))
        machine_env = {**os.environ, "SPOTRAIN_HOME": str(spotrain_home), "PW_STEPS": str(PW_STEPS),
                       "PW_STEP_S": str(PW_STEP_S)}
        try:
            from sqlalchemy import create_engine

            engine = create_engine(postgres_url)
            leader = spawn(home_a, env, *common, "--agent-port", str(port_a))
            standby = spawn(home_b, env, *common, "--agent-port", str(port_b))
            lease = read_lease(engine, fleet_id)
            assert lease is not None and lease["holder_info"]["pid"] == leader.pid, lease
            client = api(home_b)  # the standby serves reads and takes writes to the database
            spec = write_pw_spec(tmp_path, name="takeover", workers="{min: 1, max: 1}")
            r = client.post("/v1/jobs", json={"spec": yaml.safe_load(spec.read_text()), "workdir": str(tmp_path)})
            assert r.status_code == 200, r.text
            job_id = r.json()["job_id"]

            def turn() -> dict[str, Any]:
                """Boot the VMs that appeared; the job as the standby's read API says."""
                for name, status in ours(compute, fleet_id).items():
                    if status == "RUNNING" and name not in machines:
                        machines[name] = boot(compute, name, tmp_path / "machines", machine_env)
                assert refused(machines) == [], refused(machines)[:3]
                job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
                return job

            deadline = time.time() + 60
            job = turn()
            while not (job["state"] == "RUNNING" and (job.get("step") or 0) >= KILL_AT_STEP):
                assert time.time() < deadline and job["state"] not in TERMINAL, job
                time.sleep(0.2)
                job = turn()
            step_at_kill = job["step"]
            before = dict(forwarder.connections)

            leader.send_signal(signal.SIGKILL)
            killed_at = time.time()
            leader.wait()
            takeover_s = None
            deadline = killed_at + 60
            while job["state"] not in TERMINAL:
                assert time.time() < deadline, job
                # On main the new leader refused the agent (401), counted its gang LOST and bought a new VM.
                assert job["attempts"] == 1 and len(machines) == 1, ("the standby lost the running agent", job,
                                                                     list(machines))
                if takeover_s is None:
                    lease = read_lease(engine, fleet_id)
                    if lease is not None and lease["holder_info"].get("pid") == standby.pid:
                        takeover_s = time.time() - killed_at
                        assert takeover_s < TAKEOVER_LIMIT_S, takeover_s
                time.sleep(0.2)
                job = turn()
            assert job["state"] == "SUCCEEDED", (job, (home_b / "controller.log").read_text()[-3000:])
            assert takeover_s is not None
            done_after_kill_s = time.time() - killed_at
            # The agent already running carried the job: one attempt, one VM, its agent heard by the new leader.
            assert job["attempts"] == 1 and job["step"] == PW_STEPS, job
            assert len(machines) == 1, list(machines)
            assert forwarder.connections[port_b] > before[port_b], forwarder.connections
            assert refused(machines) == []
            (machine,) = machines.values()
            assert machine.proc.wait(timeout=15) == 0, machine.log.read_text()[-2000:]  # released: 410, exit 0
            logs = client.get(f"/v1/jobs/{job_id}/logs").text
        finally:
            if client is not None:
                client.close()
            stop(standby)
            stop(leader)
            for m in machines.values():
                m.close()
            forwarder.close()
            if engine is not None:
                engine.dispose()
        assert ours(compute, fleet_id) == {}
    assert "controller-restart" in logs and "LOST" not in logs, logs[-3000:]
    assert (fleet_dir / "agent-token").stat().st_mode & 0o777 == 0o600
    assert not (home_a / "agent-token").exists() and not (home_b / "agent-token").exists()
    assert_no_workers(str(PROTOCOL_WORKER), str(spotrain_home))
    assert worker_pids(AGENT_MODULE, str(spotrain_home)) == []
    print(f"\nremote-agent fleet takeover: the standby led {takeover_s:.1f} s after the leader's SIGKILL; "
          f"the job succeeded {done_after_kill_s:.1f} s after it, on its first VM and attempt")
    record("remote_fleet_takeover",
           tried=f"SIGKILL of the leader of 2 --executor remote controllers (GCP fake, PostgreSQL, lease "
                 f"{LEASE_TTL_S:g} s) at step {step_at_kill} of {PW_STEPS}, the agent behind a failover TCP forwarder",
           held=f"standby led after {takeover_s:.1f} s; 0 agent requests refused; job SUCCEEDED "
                f"{done_after_kill_s:.1f} s after the kill on its first VM and attempt (before the fix: every "
                "agent 401, gang LOST, a new VM)",
           takeover_s=round(takeover_s, 2), done_after_kill_s=round(done_after_kill_s, 2), step_at_kill=step_at_kill,
           steps=PW_STEPS, attempts=job["attempts"], vms=len(machines), agent_requests_refused=0,
           lease_ttl_s=LEASE_TTL_S)
