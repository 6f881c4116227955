"""One controller over AWS and GCP: the composite provider on the real providers (moto's server for
EC2, the loopback Compute fake for GCE), and ``spotrain controller start --cloud aws,gcp`` choosing the
cheaper cloud and moving to the other one when capacity runs out."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws.faults import Faults
from aws.harness import TEST_SPOT_PRICES, MotoServer, deliver_spot_interruption, ec2_client

from autoscaler.controller import Controller
from autoscaler.fleet.multicloud import MultiCloudProvider
from autoscaler.home import db_url
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.state import Store
from cloud_providers.base import MIN_BILLED_S_ATTR, SPOT, TAG_CONTROLLER, TAG_DECISION, TAG_JOB, TAG_MARKET, LaunchRequest
from cloud_providers.errors import ProviderError
from cloud_providers.local.executor import LocalExecutor
from support import PROTOCOL_WORKER, run_cli, start_controller, worker_pids, write_pw_spec

from .conftest import api_job
from .fake_compute import FakeCompute

pytestmark = [pytest.mark.gcp, pytest.mark.aws]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}
STABLE = ("job_id", "state", "step", "preemptions", "attempts", "final_model")
# GCP's T4 Spot VMs a little cheaper than EC2's g4dn.xlarge (0.1578): the policy should start there.
GCP_CHEAP_SPOT = {"n1-standard-4": 0.11, "n1-standard-8": 0.13}


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture
def gce(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCompute]:
    with FakeCompute() as fake:
        for key, value in fake.env().items():
            monkeypatch.setenv(key, value)
        yield fake


def both(controller_id: str) -> MultiCloudProvider:
    from cloud_providers.aws import make_provider as make_aws
    from cloud_providers.gcp import RetryPolicy
    from cloud_providers.gcp import make_provider as make_gcp

    quick = RetryPolicy(max_attempts=2, sleep=lambda _s: None)
    return MultiCloudProvider([
        make_aws(controller_id=controller_id, spot_price_overrides=dict(TEST_SPOT_PRICES), retry=quick),
        make_gcp(controller_id=controller_id, spot_price_overrides=GCP_CHEAP_SPOT, retry=quick),
    ])


def request(provider: MultiCloudProvider, cloud: str, job: str = "job-1") -> LaunchRequest:
    offering = min((o for o in provider.offerings() if o.cloud == cloud and o.accelerator == "T4" and o.gpus == 1),
                   key=lambda o: o.price_usd_per_hour(SPOT))
    decision = f"d-{uuid.uuid4().hex[:12]}"
    controller = next(iter(provider.providers.values())).controller_id  # type: ignore[attr-defined]
    return LaunchRequest(offering=offering, market=SPOT, decision_id=decision,
                         tags={TAG_JOB: job, TAG_CONTROLLER: controller, TAG_MARKET: SPOT, TAG_DECISION: decision})


# ----------------------------------------------------------------- the composite on the real providers


def test_one_catalog_and_routing_by_cloud(moto: MotoServer, gce: FakeCompute) -> None:
    cid = f"mc-{uuid.uuid4().hex[:6]}"
    provider = both(cid)
    assert provider.name == "aws,gcp" and getattr(provider, MIN_BILLED_S_ATTR) == 60.0
    keys = [o.key for o in provider.offerings()]
    assert {k.split("/")[0] for k in keys} == {"aws", "gcp"} and len(keys) == len(set(keys))
    on_aws, on_gcp = provider.launch(request(provider, "aws")), provider.launch(request(provider, "gcp"))
    assert (on_aws.cloud, on_gcp.cloud) == ("aws", "gcp")
    assert [i["name"] for i in gce.instances()] == [on_gcp.instance_id]
    assert ec2_client().describe_instances(InstanceIds=[on_aws.instance_id])["Reservations"]
    listed = {i.instance_id: i.cloud for i in provider.list_instances({TAG_CONTROLLER: cid}) if i.alive}
    assert listed == {on_aws.instance_id: "aws", on_gcp.instance_id: "gcp"}
    assert provider.billing(on_gcp).cost_usd > 0 and provider.billing(on_aws).cost_usd > 0
    # A controller that has never seen them (restarted, before recovery lists) still terminates both.
    fresh = both(cid)
    fresh.terminate(on_aws.instance_id)
    fresh.terminate(on_gcp.instance_id)
    fresh.terminate("no-such-instance")  # unknown everywhere: already gone
    assert not [i for i in fresh.list_instances({TAG_CONTROLLER: cid}) if i.alive]


def test_an_unreachable_cloud_never_looks_empty_and_loses_no_change(moto: MotoServer, gce: FakeCompute) -> None:
    cid = f"mc-{uuid.uuid4().hex[:6]}"
    provider = both(cid)
    provider.offerings()
    on_aws = provider.launch(request(provider, "aws"))
    provider.poll()
    provider.terminate(on_aws.instance_id)  # a change on AWS ...
    gce.fail(503, "backendError", times=None)  # ... while GCP is down
    offered = provider.offerings()  # GCP offered from its last catalog
    assert {o.cloud for o in offered} == {"aws", "gcp"}
    with pytest.raises(ProviderError):
        provider.list_instances({TAG_CONTROLLER: cid})
    with pytest.raises(ProviderError):
        provider.poll()
    gce.clear_failures()
    changed = {i.instance_id: i for i in provider.poll()}
    assert on_aws.instance_id in changed and not changed[on_aws.instance_id].alive


def test_what_cannot_be_combined() -> None:
    class P:
        def __init__(self, name: str) -> None:
            self.name = name

    with pytest.raises(ValueError, match="at least two"):
        MultiCloudProvider([P("aws")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="once"):
        MultiCloudProvider([P("aws"), P("aws")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="local cloud"):
        MultiCloudProvider([P("aws"), P("local")])  # type: ignore[list-item]


# ----------------------------------------------------------------- one controller, two clouds


def _status(job_id: str) -> dict[str, Any]:
    r = run_cli("status", job_id, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _alive_everywhere(controller_id: str, gce: FakeCompute) -> list[str]:
    pages = ec2_client().describe_instances(Filters=[
        {"Name": f"tag:{TAG_CONTROLLER}", "Values": [controller_id]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    aws = [i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]]
    return aws + [i["name"] for i in gce.instances()]


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_one_controller_starts_on_the_cheaper_cloud_and_moves_when_its_capacity_runs_out(
    moto: MotoServer, gce: FakeCompute, spotrain_home: Path, tmp_path: Path
) -> None:
    began = time.time()
    cid = f"mc-{uuid.uuid4().hex[:6]}"
    env = {**moto.env(), **gce.env(), "SPOTRAIN_AWS_SPOT_PRICES": json.dumps(dict(TEST_SPOT_PRICES)),
           "SPOTRAIN_GCP_SPOT_PRICES": json.dumps(GCP_CHEAP_SPOT), "PW_STEPS": "80", "PW_STEP_S": "0.05"}
    ctl = start_controller(spotrain_home, "--cloud", "aws,gcp", "--executor", "local", "--id", cid, env=env)
    try:
        r = run_cli("submit", str(write_pw_spec(tmp_path, name="mc", workers="{min: 1, max: 1}")), "--json")
        assert r.returncode == 0, r.stderr
        job_id = json.loads(r.stdout.strip().splitlines()[-1])["job_id"]
        first: dict[str, Any] | None = None
        moved: dict[str, Any] | None = None
        deadline = time.time() + 150
        job = api_job(job_id)
        while job["state"] not in TERMINAL and time.time() < deadline:
            workers = job["workers"]
            if first is None and job["state"] == "RUNNING" and workers and job.get("step", 0) >= 10:
                first = workers[0]
                assert first["offering"].startswith("gcp/") and first["market"] == "spot", workers
                # GCP runs out of Spot capacity everywhere, and takes the VM back (notice, then deletion).
                gce.stockout(spot_only=True)
                gce.preempt(first["instance_id"])
                time.sleep(1.0)
                gce.complete_preemption(first["instance_id"])
            elif first is not None and moved is None and workers and workers[0]["instance_id"] != first["instance_id"]:
                moved = workers[0]
            time.sleep(0.2)
            job = api_job(job_id)
        assert job["state"] == "SUCCEEDED", job
        said = _status(job_id)  # and the CLI says the same
        assert {k: said[k] for k in STABLE} == {k: job[k] for k in STABLE}
    finally:
        if ctl.poll() is None:
            ctl.send_signal(signal.SIGTERM)
            try:
                ctl.wait(timeout=15)
            except subprocess.TimeoutExpired:
                ctl.kill()
    assert first is not None and moved is not None, (first, moved)
    assert moved["offering"].startswith("aws/"), moved
    assert job["preemptions"] >= 1 and job["step"] == 80
    logs = run_cli("logs", job_id).stdout
    assert "capacity" in logs and "gcp/" in logs  # the refused GCP launches, before the move
    assert _alive_everywhere(cid, gce) == []
    assert worker_pids(str(PROTOCOL_WORKER), str(spotrain_home)) == []
    print(f"\nmulti-cloud move: {first['offering']} -> {moved['offering']} in {time.time() - began:.1f} s")


@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_the_same_controller_moves_from_aws_to_gcp_when_ec2_spot_runs_out(
    moto: MotoServer, gce: FakeCompute, spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other direction, with the controller in this process (no CLI, so it is quick): EC2 Spot is
    the cheaper market (GCP at its bundled list prices), so the job starts on AWS; then EC2 has no
    spot capacity left anywhere (``InsufficientInstanceCapacity``, injected through botocore's own
    hooks) and takes the instance back: the controller moves the job to GCP Spot."""
    from cloud_providers.aws import make_provider as make_aws
    from cloud_providers.aws._boto import make_client_factory as ec2_factory
    from cloud_providers.gcp import RetryPolicy
    from cloud_providers.gcp import make_provider as make_gcp

    monkeypatch.setenv("PW_STEPS", "60")
    monkeypatch.setenv("PW_STEP_S", "0.05")
    cid = f"mc-{uuid.uuid4().hex[:6]}"
    faults, ec2, clients = Faults(), ec2_factory(endpoint_url=moto.endpoint_url), {}

    def ec2_for(region: str) -> Any:
        if region not in clients:
            clients[region] = faults.attach(ec2(region))
        return clients[region]

    quick = RetryPolicy(max_attempts=2, sleep=lambda _s: None)
    provider = MultiCloudProvider([
        make_aws(controller_id=cid, client_factory=ec2_for, spot_price_overrides=dict(TEST_SPOT_PRICES), retry=quick),
        make_gcp(controller_id=cid, retry=quick),
    ])
    ctl = Controller(store=Store(db_url()), provider=provider, executor=LocalExecutor(tmp_path / "executor"),
                     policy=get_policy(), controller_id=cid, tick_s=0.1)
    ctl.recover()
    spec, workdir = load_spec(write_pw_spec(tmp_path, name="a2g", workers="{min: 1, max: 1}"))
    job_id = ctl.submit(spec, workdir)["job_id"]
    first: dict[str, Any] | None = None
    moved: dict[str, Any] | None = None
    deadline = time.time() + 60
    job = ctl.job_info(job_id)
    while job["state"] not in TERMINAL and time.time() < deadline:
        ctl.tick()
        job = ctl.job_info(job_id)
        workers = job["workers"]
        if first is None and job["state"] == "RUNNING" and workers and (job.get("step") or 0) >= 5:
            first = workers[0]
            assert first["offering"].startswith("aws/") and first["market"] == "spot", workers
            faults.fail("RunInstances", "InsufficientInstanceCapacity", when=lambda p: "InstanceMarketOptions" in p)
            deliver_spot_interruption(first["instance_id"], notice_s=1.0, background=True)
        elif first is not None and moved is None and workers and workers[0]["instance_id"] != first["instance_id"]:
            moved = workers[0]
        time.sleep(0.1)
    assert job["state"] == "SUCCEEDED", job
    assert first is not None and moved is not None, (first, moved)
    assert moved["offering"].startswith("gcp/") and moved["market"] == "spot", moved
    assert job["preemptions"] >= 1 and job["step"] == 60, job
    assert any(op == "RunInstances" for op, _ in faults.injected)  # EC2 refused before the move
    assert _alive_everywhere(cid, gce) == []
    assert worker_pids(str(PROTOCOL_WORKER), str(spotrain_home)) == []


@pytest.mark.parametrize(("clouds", "message"), [
    ("aws,aws", "each cloud may appear once"),
    ("local,gcp", "the local cloud cannot share a controller"),
    ("aws,azure", "choose from local, aws, gcp"),
])
def test_controller_start_refuses_what_cannot_be_combined_in_one_line(
    spotrain_home: Path, clouds: str, message: str
) -> None:
    r = run_cli("controller", "start", "--cloud", clouds, "--port", "0")
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
