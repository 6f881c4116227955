"""End to end on moto: the real product (`spotrain controller start --cloud aws --executor local`) runs
the Quickstart job with the real elastic runtime, takes a spot interruption and finishes.

moto runs in server mode in this process (``MotoServer``), reached by the controller subprocess and
by the workers through ``AWS_ENDPOINT_URL``: the controller's instances are moto records, the local
executor runs each instance's workers, and the checkpoint store is an S3 bucket on the same moto
server. The interruption is delivered as EC2 delivers one (``harness.deliver_spot_interruption``):
the notice (which the controller sees through ``DescribeInstances`` and relays to the workers), then,
after the notice window, termination with ``Server.SpotInstanceTermination``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from safetensors.numpy import load as load_safetensors

from cloud_providers.aws.instances import SPOT_TERMINATION
from cloud_providers.base import TAG_CONTROLLER
from support import REPO, assert_no_workers, run_cli, start_controller

from .harness import TEST_SPOT_PRICES, MotoServer, deliver_spot_interruption, ec2_client

pytestmark = [pytest.mark.aws, pytest.mark.e2e]

QUICKSTART = REPO / "examples" / "quickstart"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
NOTICE_S = 3.0  # EC2 gives 120 s; the workers need about one step to checkpoint


def last_json(out: str) -> Any:
    return json.loads(out.strip().splitlines()[-1])


def job_status(job_id: str) -> dict[str, Any]:
    r = run_cli("status", job_id, "--json")
    assert r.returncode == 0, r.stderr
    job = last_json(r.stdout)
    assert isinstance(job, dict)
    return job


def controller_env(server: MotoServer) -> dict[str, str]:
    """What a controller needs to run against this moto server (and to pass on to its workers)."""
    return {**server.env(), "SPOTRAIN_AWS_SPOT_PRICES": json.dumps(dict(TEST_SPOT_PRICES))}


def live_instances(controller_id: str, server: MotoServer) -> list[dict[str, Any]]:
    """Instances of this controller that moto still has pending or running."""
    pages = ec2_client(endpoint_url=server.endpoint_url).describe_instances(Filters=[
        {"Name": f"tag:{TAG_CONTROLLER}", "Values": [controller_id]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def stop_controller(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def quickstart_spec(dir_: Path, store_uri: str) -> Path:
    """examples/quickstart/job.yaml on AWS only, its workdir made absolute, checkpoints in ``store_uri``."""
    text = (QUICKSTART / "job.yaml").read_text()
    for old, new in (
        ("workdir: .", f"workdir: {QUICKSTART}"),
        ("clouds: [aws, gcp]", "clouds: [aws]"),
        ("keep: 3", f"keep: 3\n  store: {store_uri}"),
    ):
        assert old in text, f"examples/quickstart/job.yaml no longer has {old!r}"
        text = text.replace(old, new)
    spec = dir_ / "quickstart-aws.yaml"
    spec.write_text(text)
    return spec


@pytest.mark.timeout(240)
def test_quickstart_on_moto_survives_spot_interruption(
    spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers inherit the controller's environment: 12 epochs keep the run at 15-45 s on 2 cores, long
    # enough for the interruption, sent at 10 % of the steps, to reach the workers before the end (with 8,
    # stop 29's loaded CI run saw the job finish inside the notice: one attempt).
    monkeypatch.setenv("QUICKSTART_EPOCHS", "12")
    controller_id = f"e2e-{uuid.uuid4().hex[:8]}"
    bucket = f"spotrain-e2e-{uuid.uuid4().hex[:8]}"
    with MotoServer() as server:
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=bucket)
        spec = quickstart_spec(tmp_path, f"s3://{bucket}/runs")
        ctl = start_controller(spotrain_home, "--cloud", "aws", "--id", controller_id, env=controller_env(server))
        interrupted: str | None = None
        try:
            r = run_cli("submit", str(spec), "--json")
            assert r.returncode == 0, r.stderr
            job_id = last_json(r.stdout)["job_id"]
            deadline = time.time() + 200
            job = job_status(job_id)
            while job["state"] not in TERMINAL and time.time() < deadline:
                if (interrupted is None and job["state"] == "RUNNING" and job["total_steps"]
                        and job["step"] >= 0.1 * job["total_steps"]):
                    # Mid-run, after training has visibly moved: take one worker's spot instance back.
                    assert all(w["market"] == "spot" for w in job["workers"]), job["workers"]
                    interrupted = job["workers"][0]["instance_id"]
                    deliver_spot_interruption(interrupted, notice_s=NOTICE_S, background=True)
                time.sleep(0.5)
                job = job_status(job_id)
            assert job["state"] == "SUCCEEDED", job
            assert interrupted is not None, "the job finished before an interruption could be delivered"
            events = run_cli("logs", job_id).stdout  # for the message, should what follows fail
        finally:
            stop_controller(ctl)

        assert job["preemptions"] >= 1, (job, events[-4000:])
        assert job["attempts"] >= 2, (job, events[-4000:])  # the gang was restarted from a checkpoint
        assert 0 < job["cost_usd"] < job["on_demand_cost_usd"], job
        assert job["metric_name"] == "test_accuracy" and job["metric"] > 0.5, job

        # The final weights and the checkpoints are in S3 (moto), under the job's own prefix.
        assert job["final_model"] == f"s3://{bucket}/runs/{job_id}/final/model.safetensors"
        final = s3.get_object(Bucket=bucket, Key=f"runs/{job_id}/final/model.safetensors")["Body"].read()
        weights = load_safetensors(final)
        assert weights and all(w.size > 0 for w in weights.values())
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{job_id}/checkpoints/")["Contents"]]
        assert any(k.endswith("/manifest.json") for k in keys), keys

        # EC2's side of the story: the interrupted instance was taken back as a spot termination, and
        # nothing of this controller is left running.
        described = ec2_client().describe_instances(InstanceIds=[interrupted])["Reservations"][0]["Instances"][0]
        assert described["State"]["Name"] == "terminated"
        assert described["StateReason"]["Code"] == SPOT_TERMINATION
        assert live_instances(controller_id, server) == []

        logs = run_cli("logs", job_id)
        assert logs.returncode == 0
        assert "preemption-notice" in logs.stdout and interrupted in logs.stdout
        assert_no_workers("train.py", str(spotrain_home))
