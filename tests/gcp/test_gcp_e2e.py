"""End to end on the GCP fakes: the real product (`spotrain controller start --cloud gcp --executor local`)
runs the Quickstart job with the real elastic runtime, checkpoints to ``gs://`` on the GCS fake, takes a
Spot VM preemption and finishes with nothing left running.

The preemption reaches the workers as it does on a VM: through the GCE metadata server (the fake in
``tests/gcp/fake_metadata.py``; the workers' runtime watches it, ``SPOTRAIN_NOTICE_SOURCES=gce-metadata``,
which the local executor's ranks inherit from the controller's environment). Only once a rank has seen
that notice does Compute take the VM (STOPPING, then deleted), so the checkpoint the job resumes from
was written on the metadata server's word. The local executor's ranks share one host and so one
metadata server: the test turns ``preempted`` back to FALSE once the notice was seen, as the
replacement VM's own metadata server would say.

The Compute fake (``tests/gcp/fake_compute.py``) and the GCS fake (``tests/gcp/fake_gcs.py``) run in
this process; the controller subprocess reaches Compute through ``SPOTRAIN_GCP_ENDPOINT`` and its
workers reach GCS through ``STORAGE_EMULATOR_HOST`` (the client library's own convention), both with
anonymous credentials, and nothing of the Google clients is patched. Compute's side of the preemption is as
Compute delivers one: the VM goes STOPPING with ``lastStopTimestamp`` and a preempted status message
(the notice, which the provider reports and the controller relays to the workers, who checkpoint),
then, after the notice window, the fake deletes it (``instanceTerminationAction=DELETE``). The mirror
of ``tests/aws/test_aws_e2e.py``. The same notice through the VM's metadata server, which only an
agent watches (``--executor remote``), is ``test_gcp_remote.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from safetensors.numpy import load as load_safetensors

from cloud_providers.base import TAG_CONTROLLER
from cloud_providers.gcp.labels import decode_labels
from support import REPO, assert_no_workers, run_cli, start_controller

from .conftest import api_job
from .fake_compute import FakeCompute
from .fake_gcs import FakeGcs
from .fake_metadata import FakeGceMetadata

pytestmark = [pytest.mark.gcp, pytest.mark.e2e]

QUICKSTART = REPO / "examples" / "quickstart"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
STABLE = ("job_id", "state", "step", "preemptions", "attempts", "final_model")
NOTICE_S = 3.0  # Compute gives 30 s; the workers need about one step to checkpoint


def last_json(out: str) -> Any:
    return json.loads(out.strip().splitlines()[-1])


def job_status(job_id: str) -> dict[str, Any]:
    r = run_cli("status", job_id, "--json")
    assert r.returncode == 0, r.stderr
    job = last_json(r.stdout)
    assert isinstance(job, dict)
    return job


def live_instances(controller_id: str, compute: FakeCompute) -> list[str]:
    """Instances of this controller (by its label) that the fake still has, in any state but TERMINATED."""
    return [i["name"] for i in compute.instances()
            if decode_labels(i.get("labels", {})).get(TAG_CONTROLLER) == controller_id and i["status"] != "TERMINATED"]


def quickstart_spec(dir_: Path, store_uri: str) -> Path:
    """examples/quickstart/job.yaml on GCP only, its workdir made absolute, checkpoints in ``store_uri``."""
    text = (QUICKSTART / "job.yaml").read_text()
    for old, new in (
        ("workdir: .", f"workdir: {QUICKSTART}"),
        ("clouds: [aws, gcp]", "clouds: [gcp]"),
        ("keep: 3", f"keep: 3\n  store: {store_uri}"),
    ):
        assert old in text, f"examples/quickstart/job.yaml no longer has {old!r}"
        text = text.replace(old, new)
    spec = dir_ / "quickstart-gcp.yaml"
    spec.write_text(text)
    return spec


def notices_seen(home: Path) -> list[dict[str, Any]]:
    """Every rank-0 ``notice_seen`` of a preemption in the runtime timelines under ``home`` (a
    rescale's notice comes from the controller's notice file)."""
    from runtime.timeline import read_timeline

    return [e for p in sorted(home.rglob("timeline.jsonl")) for e in read_timeline(str(p))
            if e["event"] == "notice_seen" and e.get("reason") == "preemption"]


def deliver_preemption(compute: FakeCompute, metadata: FakeGceMetadata, home: Path, name: str, *,
                       notice_s: float) -> threading.Thread:
    """In the background: ``preempted`` TRUE on the metadata server; once a rank saw it, Compute
    stops the VM (STOPPING) and deletes it after ``notice_s``."""

    def run() -> None:
        metadata.preempt()
        deadline = time.time() + 30
        while not notices_seen(home) and time.time() < deadline:
            time.sleep(0.05)
        metadata.set("preempted", "FALSE")  # the replacement VM's metadata server (see the module doc)
        compute.preempt(name)
        time.sleep(notice_s)
        compute.complete_preemption(name)

    thread = threading.Thread(target=run, name=f"preempt-{name}", daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(240)
def test_quickstart_on_the_gcp_fake_survives_a_preemption_with_gcs_checkpoints(
    spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on AWS: 8 epochs keep the run at 10-30 s on 2 cores, long enough for the preemption, sent at
    # 10 % of the steps, to reach the workers before the end.
    monkeypatch.setenv("QUICKSTART_EPOCHS", "8")
    began = time.time()
    controller_id = f"e2e-{uuid.uuid4().hex[:8]}"
    bucket = f"spotrain-e2e-{uuid.uuid4().hex[:8]}"
    with FakeCompute() as compute, FakeGcs() as gcs, FakeGceMetadata() as metadata:
        gcs.create_bucket(bucket)
        env = {**compute.env(), "STORAGE_EMULATOR_HOST": gcs.endpoint,
               "SPOTRAIN_NOTICE_SOURCES": "gce-metadata", "SPOTRAIN_GCE_METADATA_ENDPOINT": metadata.endpoint}
        spec = quickstart_spec(tmp_path, f"gs://{bucket}/runs")
        ctl = start_controller(spotrain_home, "--cloud", "gcp", "--executor", "local", "--id", controller_id, env=env)
        preempted: str | None = None
        try:
            r = run_cli("submit", str(spec), "--json")
            assert r.returncode == 0, r.stderr
            job_id = last_json(r.stdout)["job_id"]
            deadline = time.time() + 200
            job = api_job(job_id)
            while job["state"] not in TERMINAL and time.time() < deadline:
                if (preempted is None and job["state"] == "RUNNING" and job["total_steps"]
                        and job["step"] >= 0.1 * job["total_steps"]):
                    assert all(w["market"] == "spot" and w["offering"].startswith("gcp/") for w in job["workers"])
                    preempted = job["workers"][0]["instance_id"]
                    deliver_preemption(compute, metadata, spotrain_home, preempted, notice_s=NOTICE_S)
                time.sleep(0.25)
                job = api_job(job_id)
            assert job["state"] == "SUCCEEDED", job
            said = job_status(job_id)  # and the CLI says the same
            assert {k: said[k] for k in STABLE} == {k: job[k] for k in STABLE}
            assert preempted is not None, "the job finished before a preemption could be delivered"
        finally:
            if ctl.poll() is None:
                ctl.send_signal(signal.SIGTERM)
                try:
                    ctl.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    ctl.kill()
                    ctl.wait()

        assert job["preemptions"] >= 1, job
        # The workers heard of it from the metadata server, before Compute stopped the VM.
        seen = notices_seen(spotrain_home)
        assert seen and seen[0]["source"] == "gce-metadata", seen
        assert job["attempts"] >= 2, job  # the gang was restarted from a checkpoint
        assert 0 < job["cost_usd"] < job["on_demand_cost_usd"], job
        assert job["metric_name"] == "test_accuracy" and job["metric"] > 0.5, job

        # The final weights and the checkpoints are in GCS (the fake), under the job's own prefix.
        assert job["final_model"] == f"gs://{bucket}/runs/{job_id}/final/model.safetensors"
        weights = load_safetensors(gcs.get(bucket, f"runs/{job_id}/final/model.safetensors"))
        assert weights and all(w.size > 0 for w in weights.values())
        names = gcs.names(bucket, f"runs/{job_id}/checkpoints/")
        assert any(n.endswith("/manifest.json") for n in names), names
        assert gcs.count("POST", "/upload/") > 0 and gcs.count("GET", "/download/") > 0  # written, and read back

        # Compute's side: the preempted VM was deleted by Compute itself, and nothing of this controller
        # is left running.
        assert compute.instance(preempted) is None
        assert live_instances(controller_id, compute) == []

        logs = run_cli("logs", job_id)
        assert logs.returncode == 0
        assert "preemption-notice" in logs.stdout and preempted in logs.stdout
        assert "resumed from checkpoint" in logs.stdout
        assert_no_workers("train.py", str(spotrain_home))
    print(f"\ngcp e2e: {job['attempts']} attempts, {job['preemptions']} preemption(s), "
          f"{len(names)} checkpoint objects, {time.time() - began:.1f} s")
