"""Issue 14, finding 7, piece by piece: the workdir archive (deterministic, content-hashed,
``.spotrainignore``, size limit, no links out), the agent's checks of what it fetches (hash, safe
unpacking), the agents' TLS (a pinned certificate, nothing else, never plain HTTP) and the pinned
agent install. The whole path on moto is ``tests/aws/test_finding7_workdir_tls.py``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from autoscaler.errors import SpecError
from autoscaler.jobs.workdir import IGNORE_FILE, build_archive, ignored, parse_ignore, ship
from autoscaler.state import Store
from cloud_providers.agent_boot import AgentInstall, installed_version
from cloud_providers.aws.userdata import AgentBoot as AwsBoot
from cloud_providers.executor import WorkerLaunch
from cloud_providers.gcp.userdata import AgentBoot as GcpBoot
from cloud_providers.remote import agent as agent_module
from cloud_providers.remote.agent import Agent, ControllerChannel, ControllerUnreachable
from cloud_providers.remote.tls import pinned_context
from cloud_providers.remote.wire import STATE_EXITED
from cloud_providers.remote.workdir import WorkdirRef
from remote_support import FakeChannel, agent_config, drive, rank_assignment

TOKEN = "agent-token-for-tests"


def tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


# ----- the archive ----------------------------------------------------------------------------------
def test_archive_is_deterministic_and_named_by_its_content(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    os.utime(b / "train.py", (1, 1))
    (b / "pkg" / "mod.py").chmod(0o600)
    data_a, sha_a = build_archive(a)
    data_b, sha_b = build_archive(b)
    assert data_a == data_b and sha_a == sha_b == hashlib.sha256(data_a).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(data_a), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["pkg", "pkg/mod.py", "run.sh", "train.py"]
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and not m.uname for m in members)
    assert {m.name: m.mode for m in members}["run.sh"] == 0o755
    (b / "train.py").write_text("print('changed')\n")
    assert build_archive(b)[1] != sha_a


def test_spotrainignore_patterns(tmp_path: Path) -> None:
    rules = parse_ignore("# comment\n\n*.log\n!keep.log\n/build\ndata/\n**/tmp\na/**/b\ndocs/*.md\n")
    cases = {
        ("x.log", False): True, ("deep/x.log", False): True, ("keep.log", False): False,
        ("build", True): True, ("src/build", True): False, ("data", True): True, ("data", False): False,
        ("x/data", True): True, ("tmp", True): True, ("q/r/tmp", False): True, ("a/b", False): True,
        ("a/x/y/b", False): True, ("docs/x.md", False): True, ("docs/sub/x.md", False): False,
        ("train.py", False): False,
    }
    for (path, is_dir), want in cases.items():
        assert ignored(rules, path, is_dir) is want, (path, is_dir)


def test_archive_honours_spotrainignore_and_its_defaults(tmp_path: Path) -> None:
    root = tree(tmp_path / "w")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"\0")
    (root / "out").mkdir()
    (root / "out" / "big.bin").write_bytes(b"\0" * 10)

    def names() -> list[str]:
        with tarfile.open(fileobj=io.BytesIO(build_archive(root)[0]), mode="r:gz") as tar:
            return tar.getnames()

    assert ".git" not in names() and "pkg/__pycache__" not in names() and "out/big.bin" in names()
    (root / IGNORE_FILE).write_text("out/\n*.sh\n")  # a file of one's own replaces the defaults
    assert names() == [".git", ".git/HEAD", IGNORE_FILE, "pkg", "pkg/__pycache__", "pkg/__pycache__/mod.pyc",
                       "pkg/mod.py", "train.py"]


def test_too_large_a_workdir_is_one_line_naming_the_limit_and_the_size(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path / "w")
    (root / "weights.bin").write_bytes(b"\0" * (3 * 1024 * 1024))
    monkeypatch.setenv("SPOTRAIN_WORKDIR_MAX_MB", "2")
    with pytest.raises(SpecError) as err:
        build_archive(root)
    message = str(err.value)
    assert "\n" not in message and "3.0 MiB" in message and "2 MiB limit" in message and IGNORE_FILE in message
    (root / IGNORE_FILE).write_text("*.bin\n")
    build_archive(root)


def test_links_inside_are_kept_and_links_out_refused(tmp_path: Path) -> None:
    root = tree(tmp_path / "w")
    (root / "alias.py").symlink_to("train.py")
    with tarfile.open(fileobj=io.BytesIO(build_archive(root)[0]), mode="r:gz") as tar:
        assert tar.getmember("alias.py").issym() and tar.getmember("alias.py").linkname == "train.py"
    (root / "escape").symlink_to("/etc")
    with pytest.raises(SpecError, match="escape is a link out of the workdir"):
        build_archive(root)


# ----- the agent's side -----------------------------------------------------------------------------
def shipped(tmp_path: Path) -> WorkdirRef:
    code = tree(tmp_path / "code")
    (code / "train.py").write_text("import os; print('cwd=' + os.getcwd())\n")
    return ship(code, f"file://{tmp_path / 'store' / 'job-1'}")


def run_with(agent: Agent, channel: FakeChannel, tmp_path: Path, workdir: dict[str, object]) -> str:
    la = rank_assignment(tmp_path / "nowhere", "python train.py")
    channel.assign(WorkerLaunch(**{**la.__dict__, "workdir": workdir}))
    drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_EXITED)
    log = (tmp_path / "state" / "logs" / "job-1" / "attempt-1-rank-0.log").read_text()
    return f"{dict(channel.reports[-1].exit_codes)} {log}"


def test_the_agent_runs_the_ranks_in_the_verified_archive(tmp_path: Path, channel: FakeChannel) -> None:
    ref = shipped(tmp_path)
    assert ref.uri == f"file://{tmp_path}/store/job-1/workdir/{ref.sha256}.tar.gz"
    out = run_with(Agent(agent_config(tmp_path), channel=channel, sources=[]), channel, tmp_path, ref.to_json())
    assert out.startswith("{0: 0}") and f"cwd={tmp_path / 'state' / 'workdirs' / ref.sha256}" in out, out


def test_finding7_a_tampered_archive_is_refused(tmp_path: Path, channel: FakeChannel) -> None:
    ref = shipped(tmp_path)
    path = Path(ref.uri[len("file://"):])
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    out = run_with(Agent(agent_config(tmp_path), channel=channel, sources=[]), channel, tmp_path, ref.to_json())
    assert out.startswith("{0: 127}") and "refusing to run it" in out and ref.sha256 in out, out
    assert not (tmp_path / "state" / "workdirs" / ref.sha256).exists()


@pytest.mark.parametrize("evil", ["../escaped.txt", "/tmp/absolute-finding7.txt", "link"])
def test_an_archive_cannot_write_outside_its_directory_even_with_the_right_hash(
        tmp_path: Path, channel: FakeChannel, evil: str) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo(evil)
        if evil == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
    blob = raw.getvalue()
    (tmp_path / "evil.tar.gz").write_bytes(blob)
    ref = WorkdirRef(f"file://{tmp_path / 'evil.tar.gz'}", hashlib.sha256(blob).hexdigest(), len(blob))
    out = run_with(Agent(agent_config(tmp_path), channel=channel, sources=[]), channel, tmp_path, ref.to_json())
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute-finding7.txt").exists()
    if evil.startswith("/"):  # the data filter keeps an absolute name inside, with its leading / dropped
        assert (tmp_path / "state" / "workdirs" / ref.sha256 / evil.lstrip("/")).exists()
    else:
        assert out.startswith("{0: 127}") and "cannot be unpacked safely" in out, out


def test_a_workdir_the_controller_could_not_ship_fails_the_ranks_with_its_reason(
        tmp_path: Path, channel: FakeChannel, store: Store) -> None:
    from autoscaler.remote.executor import RemoteExecutor

    code = tree(tmp_path / "big")
    (code / "escape").symlink_to("/etc")
    executor = RemoteExecutor(store, agent_token=TOKEN)
    launch = WorkerLaunch(instance_id="i-1", job_id="job-1", attempt=1, run="true", setup=None, cwd=str(code),
                          ranks=[0], world_size=1, master_addr="10.0.0.1", master_port=29500,
                          env={"SPOTRAIN_CHECKPOINT_URI": f"file://{tmp_path / 'store' / 'job-1'}"}, log_dir="/x")
    executor.start(launch)
    executor.shipper.wait("job-1", 20)  # packed on a thread of its own (issue 21, finding 2)
    sent = executor.assignment("i-1").launch
    assert sent is not None and sent.workdir is not None and "link out of the workdir" in str(sent.workdir["error"])
    out = run_with(Agent(agent_config(tmp_path), channel=channel, sources=[]), channel, tmp_path, dict(sent.workdir))
    assert out.startswith("{0: 127}") and "link out of the workdir" in out, out


# ----- TLS ------------------------------------------------------------------------------------------
def test_the_agent_refuses_plain_http_and_a_missing_certificate(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="not https://"):
        ControllerChannel(agent_config(tmp_path, controller_url="http://127.0.0.1:9"))
    with pytest.raises(ValueError, match="controller_cert_pem: required"):
        ControllerChannel(agent_config(tmp_path, controller_url="https://127.0.0.1:9"))
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(agent_config(tmp_path).to_json()))
    assert agent_module.main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("spotrain agent: controller_url:")


def test_finding7_the_agent_talks_tls_to_the_pinned_certificate_only(
        spotrain_home: Path, tmp_path: Path, store: Store) -> None:
    from autoscaler.remote.executor import RemoteExecutor, agent_credential
    from autoscaler.remote.listener import bind_agent_listener
    from autoscaler.remote.tls import ensure_agent_cert

    listener = bind_agent_listener("127.0.0.1", 0)
    executor = RemoteExecutor(store, agent_token=TOKEN)
    listener.serve(executor)
    assert executor.served_apart
    other = ensure_agent_cert(root=tmp_path)  # another controller's certificate
    assert other.pem != listener.cert.pem and (spotrain_home / "agent-tls.key").stat().st_mode & 0o777 == 0o600
    channels: list[ControllerChannel] = []
    try:
        def channel(pem: str) -> ControllerChannel:
            channels.append(ControllerChannel(agent_config(
                tmp_path, controller_url=listener.url, controller_cert_pem=pem,
                agent_credential=agent_credential(TOKEN, "d-1"))))
            return channels[-1]

        assert channel(listener.cert.pem).assignment("i-1") is not None  # i-1 runs, decision d-1
        with pytest.raises(ControllerUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            channel(other.pem).assignment("i-1")
        # A certificate once made is kept: instances launched before a restart still trust the controller.
        assert ensure_agent_cert().pem == listener.cert.pem
        with pytest.raises(ValueError, match="not a PEM"):
            pinned_context(listener.url, "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    finally:
        for c in channels:
            c.close()
        listener.close()


# ----- the pinned install ---------------------------------------------------------------------------
def test_finding7_the_agent_install_is_pinned_whatever_the_source() -> None:
    version = installed_version()
    # (The default, ``served``, names the version through the wheel in the agent config: test_issue21_wheel.py.)
    for source in ("index:https://pypi.example.internal/simple", "image",
                   f"wheel:s3://bucket/wheels/spotrain-{version}-py3-none-any.whl#sha256={'ab' * 32}"):
        install = AgentInstall.parse(source)
        for boot in (AwsBoot(install=install), GcpBoot(install=install)):
            argv = [a for c in boot.install_commands() for a in c]
            assert version in " ".join(argv), (source, argv)
            assert not any(a in ("spotrain", "spotrain[aws]", "spotrain[gcp]") for a in argv), argv
    assert "'spotrain[gcp]==" in GcpBoot(install=AgentInstall.parse("index:https://pypi.org/simple")).script()
    with pytest.raises(ValueError, match="without a version"):
        AwsBoot(package="spotrain>=0")
    with pytest.raises(ValueError, match="is not spotrain"):
        AgentInstall.parse("wheel:s3://bucket/spotrain-0.0.1-py3-none-any.whl")
    with pytest.raises(ValueError, match="is not served, index:URL"):
        AgentInstall.parse("pypi")


def test_the_controllers_of_a_fleet_share_one_agent_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby that takes over serves the agents the leader launched: they pin the fleet's
    certificate, kept in SPOTRAIN_FLEET_DIR, not one per controller home."""
    from autoscaler.remote.tls import ensure_agent_cert

    fleet = tmp_path / "fleet"
    monkeypatch.setenv("SPOTRAIN_FLEET_DIR", str(fleet))
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "leader"))
    leader = ensure_agent_cert(["10.0.0.1"])
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "standby"))
    standby = ensure_agent_cert(["10.0.0.2"])
    assert standby.pem == leader.pem and leader.cert_path.parent == fleet
    assert not (tmp_path / "standby" / "agent-tls.crt").exists()


def test_finding7_a_workdir_over_the_limit_is_refused_at_submission(
        spotrain_home: Path, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the remote executor the workdir is shipped, so its size limit is checked when the job is
    submitted (a one-line 422 through the API), not when the first gang starts; nothing is stored."""
    from fastapi.testclient import TestClient

    from autoscaler.controller import Controller
    from autoscaler.fleet.clouds import local_cloud
    from autoscaler.policy import get_policy
    from autoscaler.remote.executor import RemoteExecutor
    from autoscaler.server.api import create_app
    from autoscaler.state import Job

    monkeypatch.setenv("SPOTRAIN_WORKDIR_MAX_MB", "1")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    (work / "data.bin").write_bytes(b"\0" * (2 * 2**20))
    ctl = Controller(store=store, provider=local_cloud("f7-submit").provider,
                     executor=RemoteExecutor(store, agent_token=TOKEN), policy=get_policy(), controller_id="c")
    http = TestClient(create_app(ctl, "user-token"), raise_server_exceptions=False)
    with store.session() as s:
        before = s.query(Job).count()
    spec = {"name": "big", "run": "python train.py", "resources": {"accelerators": ["T4:1"], "clouds": ["aws"]}}
    r = http.post("/v1/jobs", json={"spec": spec, "workdir": str(work)}, headers={"authorization": "Bearer user-token"})
    assert r.status_code == 422, r.text
    message = r.json()["detail"] if "detail" in r.json() else r.json()
    assert "2.0 MiB to ship, over the 1 MiB limit" in json.dumps(message) and "\\n" not in json.dumps(message)
    with store.session() as s:
        assert s.query(Job).count() == before
    (work / ".spotrainignore").write_text("*.bin\n")  # left out: now it fits
    r = http.post("/v1/jobs", json={"spec": spec, "workdir": str(work)}, headers={"authorization": "Bearer user-token"})
    assert r.status_code == 200, r.text
