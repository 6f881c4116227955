"""Issue 14, finding 7, on moto with ``--executor remote``: the job's workdir reaches the instances
through the job's store, the agent is installed pinned, and the agents talk TLS to a pinned certificate.

Before: the user data ran ``pip install spotrain`` (unpinned, by name), carried ``http://`` for the
controller, and the workdir was not shipped at all (the agent ran the ranks in the submitting
machine's path, which only worked here because the "instances" share this machine's files).

The test plays the EC2 machines as ``test_aws_remote.py`` does: for each instance it reads the user
data back from EC2, checks the install is pinned and the controller URL is ``https://`` with a
certificate, and starts the agent from that config. The job's code (a ``train.py`` and its data file)
lives only in the workdir on the controller's side; its checkpoint store is an S3 bucket in moto. The
rank must run in the directory the agent unpacked from the archive it fetched from S3, after checking
its SHA-256, with the ``.spotrainignore``'d files left out.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import boto3
import httpx
import pytest

from cloud_providers.agent_boot import FETCH_WHEEL, PIP_WHEEL, installed_version
from cloud_providers.aws import userdata
from cloud_providers.remote.tls import pinned_context
from support import agent_signer, assert_no_workers, start_controller

from .harness import TEST_SPOT_PRICES, MotoServer, ec2_client
from .test_aws_remote import AGENT_MODULE, TERMINAL, Machine, free_port, moto_instances

pytestmark = [pytest.mark.aws, pytest.mark.e2e]

BUCKET = "spotrain-finding7"
TRAIN = """\
import json, os, pathlib, sys
msg = pathlib.Path("data/msg.txt").read_text().strip()
print("cwd=" + os.getcwd(), "msg=" + msg, "secret=" + str(pathlib.Path("secret.txt").exists()), flush=True)
uri = os.environ["SPOTRAIN_CHECKPOINT_URI"]
progress = pathlib.Path(os.environ["SPOTRAIN_PROGRESS_FILE"])
progress.write_text(json.dumps({"step": 1, "total_steps": 1, "completed": True, "metric": 1.0, "metric_name": "ok",
                                "final_model": uri + "/final/model.safetensors"}))
sys.exit(0 if msg == "shipped through the store" else 3)
"""


def make_workdir(root: Path) -> Path:
    code = root / "code"
    (code / "data").mkdir(parents=True)
    (code / "train.py").write_text(TRAIN)
    (code / "data" / "msg.txt").write_text("shipped through the store\n")
    (code / "secret.txt").write_text("not for the instances\n")
    (code / "outputs").mkdir()
    (code / "outputs" / "big.bin").write_bytes(b"\0" * 4096)
    (code / ".spotrainignore").write_text("# left out\nsecret.txt\noutputs/\n")
    return code


def boot_tls(instance_id: str, root: Path, env: dict[str, str]) -> tuple[Machine, dict[str, object]]:
    attr = ec2_client().describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    text = base64.b64decode(attr["UserData"]["Value"]).decode()
    commands = userdata.commands(text)
    assert commands[-1][-4:] == ["-m", AGENT_MODULE, "--config", userdata.CONFIG_PATH], commands
    # The agent is installed pinned to the controller's version, never as a bare name: by default the
    # controller's own wheel, fetched and checked against the config's sha256 (issue 21, finding 14).
    assert [c[1:3] for c in commands[1:3]] == [["-c", FETCH_WHEEL], ["-c", PIP_WHEEL]], commands
    assert not any("--index-url" in c for c in commands), commands
    config = userdata.decode(text)
    assert config["agent_wheel"] == f"spotrain-{installed_version()}-py3-none-any.whl", config
    # The boot's fetch, run against the controller as the instance would: the served wheel's hash holds.
    wheel_dir = root / f"{instance_id}-wheel"
    wheel_dir.mkdir(parents=True)
    (wheel_dir / "agent.json").write_text(json.dumps(config))
    fetch = subprocess.run([sys.executable, "-c", FETCH_WHEEL, str(wheel_dir / "agent.json"), str(wheel_dir)],
                           capture_output=True, text=True, timeout=60)
    assert fetch.returncode == 0, fetch.stderr
    got = (wheel_dir / str(config["agent_wheel"])).read_bytes()
    assert hashlib.sha256(got).hexdigest() == config["agent_wheel_sha256"]
    assert str(config["controller_url"]).startswith("https://127.0.0.1:"), config
    assert "BEGIN CERTIFICATE" in str(config["controller_cert_pem"]), config
    assert config["agent_version"] == installed_version()
    return Machine(instance_id, config, root, env), config


@pytest.mark.timeout(150)
def test_finding7_workdir_ships_through_the_store_and_agents_talk_tls(spotrain_home: Path, tmp_path: Path) -> None:
    controller_id = f"f7-{uuid.uuid4().hex[:8]}"
    code = make_workdir(tmp_path)
    spec = {
        "name": "finding7", "workdir": str(code), "run": "python train.py",
        "resources": {"accelerators": ["T4:1"], "clouds": ["aws"]}, "workers": {"min": 1, "max": 1},
        "training": {"logical_workers": 1, "global_batch_size": 8},
        "checkpoint": {"store": f"s3://{BUCKET}/jobs"},
    }
    machines: dict[str, Machine] = {}
    with MotoServer() as server:
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        # What the machines' processes inherit (moto's endpoint and keys: the agent reads S3 with them).
        machine_env = {**os.environ, "SPOTRAIN_HOME": str(spotrain_home), "OMP_NUM_THREADS": "1"}
        ctl = start_controller(
            spotrain_home, "--cloud", "aws", "--executor", "remote", "--id", controller_id, "--agent-port", "0",
            "--rendezvous-port", str(free_port()),
            env={**server.env(), "SPOTRAIN_AWS_SPOT_PRICES": json.dumps(dict(TEST_SPOT_PRICES))},
        )
        info = json.loads((spotrain_home / "controller.json").read_text())
        token = (spotrain_home / "token").read_text().strip()
        api = httpx.Client(base_url=info["url"], headers={"Authorization": f"Bearer {token}"}, timeout=10)
        config: dict[str, object] = {}
        try:
            r = api.post("/v1/jobs", json={"spec": spec, "workdir": str(code)})
            assert r.status_code == 200, r.text
            job_id = r.json()["job_id"]
            deadline = time.time() + 90
            job = r.json()
            while job["state"] not in TERMINAL and time.time() < deadline:
                for iid, state in moto_instances(controller_id).items():
                    if state == "running" and iid not in machines:
                        machines[iid], config = boot_tls(iid, tmp_path / "machines", machine_env)
                time.sleep(0.3)
                job = api.get(f"/v1/jobs/{job_id}").json()
            assert job["state"] == "SUCCEEDED", (job, (spotrain_home / "controller.log").read_text()[-3000:],
                                                 [m.log.read_text()[-2000:] for m in machines.values()])

            # The plain-HTTP user API does not serve the agents, not even with a valid agent credential.
            agent_auth = agent_signer(str(config["agent_credential"]))
            agent_auth.counter.advance_past(10**12)  # above every counter the agent itself has used
            assert httpx.get(info["url"] + "/v1/agent/assignment", auth=agent_auth).status_code == 401
            # The agents' listener is TLS only, with the pinned certificate: plain HTTP gets no answer,
            # and a client that trusts only public CAs refuses the certificate.
            agents_url = str(config["controller_url"])
            with pytest.raises(httpx.HTTPError):
                httpx.get(agents_url.replace("https://", "http://") + "/v1/agent/assignment", auth=agent_auth,
                          timeout=5)
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                httpx.get(agents_url + "/v1/agent/assignment", auth=agent_auth, timeout=5)
            # With the pinned certificate: the agent credential opens its assignment, the user token nothing.
            pinned = pinned_context(agents_url, str(config["controller_cert_pem"]))
            with httpx.Client(base_url=agents_url, verify=pinned, timeout=5) as agents:
                assert agents.get("/v1/agent/assignment", auth=agent_auth).status_code == 410  # terminated
                assert agents.get("/v1/agent/assignment", headers=api.headers).status_code == 401
                assert agents.get("/v1/jobs", headers=api.headers).status_code == 401
            cert = spotrain_home / "agent-tls.crt"
            assert cert.read_text() == config["controller_cert_pem"]
            assert cert.stat().st_mode & 0o777 == 0o600 and (spotrain_home / "agent-tls.key").stat().st_mode & 0o777 == 0o600
        finally:
            api.close()
            ctl.send_signal(signal.SIGTERM)
            try:
                ctl.wait(timeout=15)
            except subprocess.TimeoutExpired:
                ctl.kill()
            for m in machines.values():
                if m.proc.poll() is None:
                    try:
                        m.proc.wait(timeout=10)  # the agent hears 410 and leaves on its own
                    except subprocess.TimeoutExpired:
                        pass
                m.close()

        # The archive is in the job's S3 store, named by its SHA-256, without the ignored files.
        s3 = boto3.client("s3")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"jobs/{job_id}/workdir/")["Contents"]]
        assert len(keys) == 1 and keys[0].endswith(".tar.gz"), keys
        blob = s3.get_object(Bucket=BUCKET, Key=keys[0])["Body"].read()
        sha = hashlib.sha256(blob).hexdigest()
        assert keys[0] == f"jobs/{job_id}/workdir/{sha}.tar.gz"
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            assert sorted(tar.getnames()) == [".spotrainignore", "data", "data/msg.txt", "train.py"]

    # The rank ran in the directory its agent unpacked from that archive (the only train.py it could see).
    (machine,) = machines.values()
    unpacked = machine.dir / "state" / "workdirs" / sha
    assert (unpacked / "train.py").read_text() == TRAIN and not (unpacked / "secret.txt").exists()
    rank_log = next((machine.dir / "state" / "logs").rglob("attempt-1-rank-0.log")).read_text()
    assert f"cwd={unpacked}" in rank_log and "msg=shipped through the store" in rank_log, rank_log
    assert "secret=False" in rank_log
    assert_no_workers(AGENT_MODULE, str(spotrain_home))
