"""Test harness for the AWS provider against moto's server mode, and spot interruption delivery.

``MotoServer`` runs moto's ThreadedMotoServer on a free loopback port in this process and points
boto3 at it the standard way (``AWS_ENDPOINT_URL``) with dummy credentials, so code under test — the
provider, or a ``spotrain controller start --cloud aws`` subprocess given ``server.env()`` — talks
real HTTP to it.

A spot interruption is delivered as EC2 delivers one, in two steps:

1. ``mark_spot_interruption``: the notice. The instance is tagged ``spotrain-interruption`` with the
   notice deadline (Unix seconds), which the provider reports as ``InstanceState.NOTICE`` (on real
   EC2 the spot request status ``marked-for-termination`` plays this part). Given ``imds`` (a
   ``tests/fakes/imds.FakeMetadataServer``), the same notice is served as IMDSv2
   ``spot/instance-action`` to the worker agent; ``on_notice(instance_id, deadline)`` is called for
   anything else a test wants to relay.
2. ``complete_spot_interruption``: after the notice window, the instance is terminated in moto's
   backend with state reason ``Server.SpotInstanceTermination``, exactly what the provider reads
   from a real interrupted instance. moto has no API for that, so this step needs the server (or
   ``mock_aws``) to run in this process, which both ``MotoServer`` and ``mock_aws`` do.

``deliver_spot_interruption`` does both, waiting ``notice_s`` in between (in a background thread when
``background=True``).
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2 import ec2_backends
from moto.ec2.models.instances import Instance, StateReason
from moto.moto_server.threaded_moto_server import ThreadedMotoServer

from cloud_providers.aws.instances import SPOT_TERMINATION, TAG_INTERRUPTION

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Settings of moto itself (this process): skip loading its public AMI catalogue.
MOTO_ENV = {"MOTO_EC2_LOAD_DEFAULT_AMIS": "false"}
TEST_IMAGE_NAME = "spotrain-test-ami"
NoticeHook = Callable[[str, float], None]


class MotoServer:
    """moto in server mode on 127.0.0.1:<free port>. ``start()`` also sets the AWS env vars of this
    process (restored by ``stop()``); ``env()`` gives them for subprocesses."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._saved: dict[str, str | None] = {}
        self.endpoint_url = ""

    def start(self) -> MotoServer:
        for key, value in MOTO_ENV.items():
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        for key, value in self.env().items():
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value
        return self

    def env(self) -> dict[str, str]:
        return {**DUMMY_ENV, "AWS_ENDPOINT_URL": self.endpoint_url}

    def reset(self) -> None:
        """Forget every resource (moto's /moto-api/reset)."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST"))

    def stop(self) -> None:
        self._server.stop()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved.clear()

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def moto_server() -> Iterator[MotoServer]:
    """Generator for a pytest fixture: ``yield from moto_server()``."""
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


def ec2_client(region: str = "us-east-1", endpoint_url: str | None = None) -> Any:
    kwargs: dict[str, Any] = {"region_name": region}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
    return boto3.client("ec2", **kwargs)


def any_image_id(region: str = "us-east-1", endpoint_url: str | None = None) -> str:
    """An AMI of this (moto) account, registered on first use. moto checks no AMI by default, but a
    real id keeps the launch honest; registering one beats listing moto's thousand public AMIs,
    which ``MOTO_ENV`` stops moto from loading (a second per region and test)."""
    client = ec2_client(region, endpoint_url)
    mine = client.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [TEST_IMAGE_NAME]}])
    if mine["Images"]:
        return str(mine["Images"][0]["ImageId"])
    made = client.register_image(Name=TEST_IMAGE_NAME, RootDeviceName="/dev/sda1", Architecture="x86_64")
    return str(made["ImageId"])


def mark_spot_interruption(
    instance_id: str,
    *,
    region: str = "us-east-1",
    notice_s: float = 120.0,
    endpoint_url: str | None = None,
    imds: Any | None = None,
    on_notice: NoticeHook | None = None,
    clock: Callable[[], float] = time.time,
) -> float:
    """Give the notice; return its deadline (Unix seconds)."""
    deadline_s = clock() + notice_s
    ec2_client(region, endpoint_url).create_tags(
        Resources=[instance_id], Tags=[{"Key": TAG_INTERRUPTION, "Value": f"{deadline_s:.3f}"}]
    )
    if imds is not None:
        imds.notice_spot_interruption(action="terminate", in_s=notice_s)
    if on_notice is not None:
        on_notice(instance_id, deadline_s)
    return deadline_s


def _terminate_once(terminate: Callable[[Instance], Any]) -> Callable[[Instance], Any]:
    """EC2's TerminateInstances on an instance already terminated succeeds and changes nothing; moto's
    sets the state reason again to ``Client.UserInitiatedShutdown``, which would hide a spot
    termination from the provider when the controller releases an instance the cloud already took."""

    def once(self: Instance) -> Any:
        if self._state.name == "terminated":
            return copy.copy(self._state)
        return terminate(self)

    once.__wrapped__ = terminate  # type: ignore[attr-defined]
    return once


if not hasattr(Instance.terminate, "__wrapped__"):
    Instance.terminate = _terminate_once(Instance.terminate)  # type: ignore[method-assign]


def complete_spot_interruption(
    instance_id: str, *, region: str = "us-east-1", account_id: str = DEFAULT_ACCOUNT_ID
) -> bool:
    """Terminate the instance as EC2 does when it takes a spot instance back; False (nothing done) if it
    was terminated already (the controller released it first)."""
    instance = ec2_backends[account_id][region].get_instance(instance_id)
    if instance._state.name == "terminated":
        return False
    instance.terminate()
    instance.state_reason = StateReason(f"{SPOT_TERMINATION}: Spot instance termination", SPOT_TERMINATION)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    instance._reason = f"Service initiated ({stamp} GMT)"
    return True


def deliver_spot_interruption(
    instance_id: str,
    *,
    region: str = "us-east-1",
    notice_s: float = 120.0,
    endpoint_url: str | None = None,
    imds: Any | None = None,
    on_notice: NoticeHook | None = None,
    sleep: Callable[[float], None] = time.sleep,
    background: bool = False,
) -> threading.Thread | None:
    """Notice, wait ``notice_s``, terminate. With ``background=True`` return the started thread."""

    def run() -> None:
        mark_spot_interruption(instance_id, region=region, notice_s=notice_s, endpoint_url=endpoint_url,
                               imds=imds, on_notice=on_notice)
        sleep(notice_s)
        complete_spot_interruption(instance_id, region=region)

    if not background:
        run()
        return None
    thread = threading.Thread(target=run, name=f"spot-interruption-{instance_id}", daemon=True)
    thread.start()
    return thread


# Spot prices for tests, near the bundled market trace's (moto's own are all 0.00001).
TEST_SPOT_PRICES: Mapping[str, float] = {
    "g4dn.xlarge": 0.1578,
    "g4dn.12xlarge": 1.1736,
    "g5.xlarge": 0.3621,
    "g5.12xlarge": 2.0419,
    "g6.xlarge": 0.3322,
    "p4d.24xlarge": 9.8318,
    "p5.48xlarge": 29.496,
}
