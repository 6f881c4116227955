"""Issue 21, finding 14 (the agent's install): by default an instance installs the controller's own
wheel, served over the pinned TLS listener, and only with the sha256 its agent config names; a
tampered wheel is refused before pip sees it (and pip checks the hash again). On main the default was
``pip install --index-url https://pypi.org/simple spotrain[aws]==VERSION``: a package found by name."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.state import Store
from cloud_providers.agent_boot import FETCH_WHEEL, PIP_WHEEL, WHEEL_DIR, AgentInstall, installed_version
from cloud_providers.aws import userdata as aws_userdata
from cloud_providers.aws.userdata import AgentBoot as AwsBoot
from cloud_providers.gcp.userdata import AgentBoot as GcpBoot

TOKEN = "agent-token-for-tests"


def test_the_default_install_is_the_served_wheel_with_its_hash_checked() -> None:
    assert AgentInstall.parse(None).kind == "served" and AgentInstall().kind == "served"
    for boot in (AwsBoot(), GcpBoot()):
        commands = boot.install_commands()
        argv = [a for c in commands for a in c]
        assert "--index-url" not in argv and not any(a.startswith("spotrain[") and "==" in a for a in argv), argv
        assert [c[1:3] for c in commands[1:]] == [["-c", FETCH_WHEEL], ["-c", PIP_WHEEL]]
        assert commands[0][-1] == WHEEL_DIR
    assert "pypi.org" not in GcpBoot().script()
    # The user data, programs and all, still fits EC2's 16 KiB with a real-sized config.
    aws_userdata.render({"controller_cert_pem": "x" * 800, "agent_credential": "d-1:" + "0" * 64,
                         "agent_wheel": "spotrain-0.1.0-py3-none-any.whl", "agent_wheel_sha256": "0" * 64})
    assert AgentInstall.parse("served").kind == "served"
    assert AgentInstall.parse("index:https://pypi.org/simple").kind == "index"  # still there, when asked for


def run_program(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(180)
def test_a_booting_instance_installs_exactly_the_served_wheel_and_refuses_a_tampered_one(
        spotrain_home: Path, tmp_path: Path, store: Store) -> None:
    from autoscaler.remote.executor import RemoteExecutor
    from autoscaler.remote.listener import bind_agent_listener
    from autoscaler.remote.wheel import ensure_agent_wheel

    wheel = ensure_agent_wheel()
    assert wheel.name == f"spotrain-{installed_version()}-py3-none-any.whl"
    assert hashlib.sha256(wheel.data).hexdigest() == wheel.sha256 == hashlib.sha256(wheel.path.read_bytes()).hexdigest()
    assert wheel.path.stat().st_mode & 0o777 == 0o600
    assert ensure_agent_wheel().sha256 == wheel.sha256  # reproducible: every controller of a fleet serves the same
    tampered = wheel.data.replace(b"spotrain", b"sp0train", 1)
    assert tampered != wheel.data
    listeners = []
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fetched = wheels / wheel.name

    def serve(served: bytes) -> Path:
        """An agents' listener serving ``served`` as the wheel; an agent config naming the good hash."""
        listener = bind_agent_listener("127.0.0.1", 0)
        listeners.append(listener)
        executor = RemoteExecutor(store, agent_token=TOKEN)
        executor.agent_wheel = dataclasses.replace(wheel, data=served)
        listener.serve(executor)
        config = tmp_path / f"agent-{len(listeners)}.json"
        config.write_text(json.dumps({"controller_url": listener.url, "controller_cert_pem": listener.cert.pem,
                                      "agent_wheel": wheel.name, "agent_wheel_sha256": wheel.sha256}))
        return config

    try:
        # The boot fetches it over the pinned TLS listener (no credential: it is public) and keeps it.
        config = serve(wheel.data)
        r = run_program(FETCH_WHEEL, str(config), str(wheels))
        assert r.returncode == 0, r.stderr
        assert fetched.read_bytes() == wheel.data
        # A tampered wheel (the controller's copy replaced, or anything on the way) is refused, not kept.
        fetched.unlink()
        r = run_program(FETCH_WHEEL, str(serve(tampered)), str(wheels))
        assert r.returncode != 0 and "refused" in r.stderr, r.stderr
        assert list(wheels.iterdir()) == []
    finally:
        for listener in listeners:
            listener.close()

    # A tampered file in the wheel directory is refused before pip runs.
    fetched.write_bytes(tampered)
    r = run_program(PIP_WHEEL, str(config), str(wheels), "spotrain[aws]")
    assert r.returncode != 0 and "refused" in r.stderr, r.stderr

    # The wheel itself is a real one: pip installs it with its hash checked, and refuses another hash.
    good = tmp_path / "good" / wheel.name
    good.parent.mkdir()
    good.write_bytes(wheel.data)
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target)]
    r = subprocess.run([*pip, f"spotrain @ file://{good}#sha256={'0' * 64}"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "HASH" in r.stderr.upper(), r.stderr[-2000:]
    r = subprocess.run([*pip, f"spotrain @ file://{good}#sha256={wheel.sha256}"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (target / "cloud_providers" / "remote" / "agent.py").is_file()
    assert (target / "cloud_providers" / "local" / "data" / "market.csv").is_file()
    meta = (target / f"spotrain-{installed_version()}.dist-info" / "METADATA").read_text()
    assert f"Version: {installed_version()}" in meta
