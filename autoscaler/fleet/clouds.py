"""Builds the provider and executor a controller runs with (``--cloud``, ``--executor``).

``--cloud aws,gcp`` builds each cloud's provider as for one cloud and puts them behind one
``MultiCloudProvider`` (``fleet/multicloud.py``), so one policy decision sees every cloud's offerings.

Cloud SDKs are imported only when their cloud is chosen, so the CLI stays fast and the local cloud
needs no cloud account.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from autoscaler.fleet.multicloud import MultiCloudProvider, check_clouds
from autoscaler.home import localcloud_dir
from autoscaler.remote.executor import DEFAULT_MASTER_PORT
from autoscaler.state import Store
from cloud_providers.base import Provider
from cloud_providers.executor import Executor
from cloud_providers.local.executor import LocalExecutor
from cloud_providers.local.market import MarketTrace
from cloud_providers.local.owner import LEASE_FILE, STOP_GRACE_S, lease_expiry
from cloud_providers.local.provider import DEFAULT_TIME_SCALE, LocalProvider
from cloud_providers.local.scenario import Scenario


@dataclasses.dataclass
class CloudSetup:
    provider: Provider
    executor: Executor
    # Provider-clock seconds per wall second (the local cloud's time compression).
    clock_rate: float


def local_cloud(
    cloud_id: str, *, scenario: Scenario | None = None, trace_path: Path | None = None,
    time_scale: float | None = None, owner_lease_s: float | None = None,
) -> CloudSetup:
    """The local cloud ``cloud_id`` (its state under ``SPOTRAIN_FLEET_DIR/localcloud/``, made or
    reopened). ``owner_lease_s``: its machines stop once the process that owns the cloud (a ``spotrain
    run``, which holds ``OwnerLease(root, lease_s=owner_lease_s)``) is gone (``owner.py``); None: its
    workers outlive any controller."""
    root = localcloud_dir(cloud_id)
    lease = None if owner_lease_s is None else {
        "path": str(root / LEASE_FILE), "lease_s": owner_lease_s, "grace_s": STOP_GRACE_S}
    executor = LocalExecutor(root / "executor", owner_lease=lease)
    scenario = scenario or Scenario()
    trace_file = trace_path or scenario.market
    trace = MarketTrace.load(trace_file) if trace_file else MarketTrace.bundled()
    scale = time_scale or scenario.time_scale or DEFAULT_TIME_SCALE

    def progress_of(job_id: str) -> int | None:
        p = executor.progress(job_id)
        step = p.get("step") if p else None
        # Only a finite step in range counts: a hostile progress file must not break the market's poll.
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or not 0 <= step <= 2**53:
            return None
        return int(step)

    def stopped_at(instance_id: str) -> float | None:
        """When the machine stopped on its own: its agent's record (its owner was gone); or, for a
        machine of a cloud whose owner is gone that runs no agent (nothing to checkpoint), when the
        owner's lease ran out: the cloud went away with its owner (``owner.py``)."""
        ended = executor.stopped_at(instance_id)
        if ended is not None or executor.agent_running(instance_id):
            return ended
        return lease_expiry(root / LEASE_FILE)

    provider = LocalProvider(
        root=root / "cloud", trace=trace, time_scale=scale, scenario=scenario,
        on_terminate=executor.stop, progress_of=progress_of, min_billed_s=scenario.min_billed_s,
        stopped_at=stopped_at,
        oracle=scenario.oracle,
    )
    return CloudSetup(provider, executor, provider.time_scale)


def remote_cloud(
    cloud: str, *, cloud_id: str, store: Store, advertise_url: str, rendezvous_port: int = DEFAULT_MASTER_PORT,
    agent_cert_pem: str | None = None, agent_install: str | None = None,
) -> CloudSetup:
    """A real cloud whose instances run their own agent (``--executor remote``): the user data of each
    instance carries the agent config (controller URL, the instance's agent credential, notice sources,
    ``agent_cert_pem``: the certificate the agent pins, ``remote/listener.py``) and installs the agent pinned
    to this version from ``agent_install`` (``cloud_providers/agent_boot.py``). ``cloud`` may name
    several (``aws,gcp``): one agent gate over the clouds' composite provider."""
    clouds = cloud.split(",")
    for name in clouds:
        if name not in ("aws", "gcp"):
            raise ValueError(f"--executor remote needs a real cloud with agents on its instances (aws, gcp), not {name!r}")
    if len(clouds) > 1:
        check_clouds(clouds)
    from autoscaler.remote.executor import AgentGatedProvider, RemoteExecutor, agent_credential, ensure_agent_token
    from cloud_providers.agent_boot import AgentInstall
    from cloud_providers.base import TAG_JOB, LaunchRequest
    from cloud_providers.remote.config import NOTICE_SOURCE_AWS, NOTICE_SOURCE_GCE, AgentConfig

    try:
        AgentConfig(controller_url=advertise_url, agent_credential="d:x", decision_id="d")
    except ValueError:
        raise ValueError(f"--advertise-url: {advertise_url!r} is not an http(s) URL the instances can reach") from None
    token = ensure_agent_token()
    install = AgentInstall.parse(agent_install)
    version = install.pinned_version()
    wheel = None
    if install.kind == "served":  # the default: the instances install this controller's own wheel
        from autoscaler.remote.wheel import ensure_agent_wheel

        wheel = ensure_agent_wheel()

    def boot_config_for(request: LaunchRequest) -> dict[str, Any]:
        return AgentConfig(
            controller_url=advertise_url, agent_credential=agent_credential(token, request.decision_id),
            decision_id=request.decision_id, job_id=request.tags.get(TAG_JOB), controller_id=cloud_id,
            notice_sources=(NOTICE_SOURCE_GCE if request.offering.cloud == "gcp" else NOTICE_SOURCE_AWS,),
            controller_cert_pem=agent_cert_pem, agent_version=version,
            agent_wheel=wheel.name if wheel else None, agent_wheel_sha256=wheel.sha256 if wheel else None,
        ).to_json()

    executor = RemoteExecutor(store, agent_token=token, master_port=rendezvous_port)
    executor.agent_wheel = wheel
    raw = [_provider_factory(name)(controller_id=cloud_id, boot_config_for=boot_config_for,
                                   agent_boot=_agent_boot(name, install)) for name in clouds]
    provider = AgentGatedProvider(raw[0] if len(raw) == 1 else MultiCloudProvider(raw), executor)
    executor.address_of = provider.address_of
    return CloudSetup(provider, executor, 1.0)


def _agent_boot(cloud: str, install: Any) -> Any:
    """The cloud's ``AgentBoot`` (its image's interpreter and extra) installing from ``install``."""
    if cloud == "gcp":
        from cloud_providers.gcp.userdata import AgentBoot as GcpBoot

        return GcpBoot(install=install)
    from cloud_providers.aws.userdata import AgentBoot as AwsBoot

    return AwsBoot(install=install)


def make_cloud(
    cloud: str, *, cloud_id: str, executor: str = "local", store: Store | None = None,
    advertise_url: str | None = None, rendezvous_port: int = DEFAULT_MASTER_PORT,
    agent_cert_pem: str | None = None, agent_install: str | None = None,
) -> CloudSetup:
    """``executor``: ``local`` (workers as processes on this machine) or ``remote`` (each instance's
    agent runs them; needs the controller's ``store`` and the ``advertise_url`` agents reach it on)."""
    if executor == "remote":
        if store is None or not advertise_url:
            raise ValueError("--executor remote needs the controller's database and an advertised URL")
        return remote_cloud(cloud, cloud_id=cloud_id, store=store, advertise_url=advertise_url,
                            rendezvous_port=rendezvous_port, agent_cert_pem=agent_cert_pem, agent_install=agent_install)
    if executor != "local":
        raise ValueError(f"unknown executor {executor!r} (choose local or remote)")
    if "," in cloud:  # one controller over several clouds (autoscaler/fleet/multicloud.py)
        names = cloud.split(",")
        check_clouds(names)
        setups = [make_cloud(name, cloud_id=cloud_id) for name in names]
        return CloudSetup(MultiCloudProvider([s.provider for s in setups]), setups[0].executor, 1.0)
    if cloud == "local":
        return local_cloud(cloud_id)
    if cloud == "aws":
        from cloud_providers.aws import make_provider  # lazily: boto3 is only needed for AWS

        if not os.environ.get("AWS_ENDPOINT_URL"):
            # Real EC2 instances would be bought and left idle while their workers ran here.
            raise ValueError("--executor local runs the workers on this machine: use it with a stand-in cloud "
                             "(AWS_ENDPOINT_URL, e.g. moto); on real AWS use --executor remote")
        root = localcloud_dir(cloud_id)
        return CloudSetup(make_provider(controller_id=cloud_id), LocalExecutor(root / "executor"), 1.0)
    if cloud == "gcp":
        if not os.environ.get("SPOTRAIN_GCP_ENDPOINT"):
            # Real GCE instances would be bought and left idle while their workers ran here.
            raise ValueError("--executor local runs the workers on this machine: use it with a stand-in cloud "
                             "(SPOTRAIN_GCP_ENDPOINT, e.g. the Compute fake); on real GCP use --executor remote")
        root = localcloud_dir(cloud_id)
        return CloudSetup(_provider_factory("gcp")(controller_id=cloud_id), LocalExecutor(root / "executor"), 1.0)
    raise ValueError(f"cloud {cloud!r} is not available yet (choose local, aws or gcp)")


def _provider_factory(cloud: str) -> Any:
    """The cloud's ``make_provider``, imported only now: its SDK is needed for that cloud alone.
    ``make_provider`` for GCP checks the Google credentials once (CredentialsError in one line)."""
    if cloud == "gcp":
        from cloud_providers.gcp import make_provider as make_gcp

        return make_gcp
    from cloud_providers.aws import make_provider as make_aws

    return make_aws
