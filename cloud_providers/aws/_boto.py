"""The only module that imports boto3/botocore: everything else receives clients through a factory.

Importing the SDK costs about half a second, so ``import cloud_providers`` must not pay for it
(SkyPilot's ``adaptors/aws.py`` lesson). A *client factory* (``region -> EC2 client``) is also the
seam tests use: they pass clients wrapped in botocore's ``Stubber`` or clients talking to moto.

Endpoints follow boto3's own conventions (``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_EC2``), which is
how moto's server mode is reached; nothing here reads those variables itself.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..errors import SdkMissing

# An EC2 client for a region. Typed as Any: boto3's client classes are generated at run time.
ClientFactory = Callable[[str], Any]

# boto3 is an extra of the package (a controller for the local cloud needs no cloud SDK).
INSTALL_HINT = "the AWS provider needs boto3, which is not installed: pip install 'spotrain[aws]'"


def _sdk_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SdkMissing(INSTALL_HINT, cloud="aws") from exc


def require_sdk() -> None:
    """Raise ``SdkMissing`` (one line naming the extra) unless boto3 can be imported."""
    _sdk_module("boto3")


def botocore_exceptions() -> Any:
    """The ``botocore.exceptions`` module, imported on first use."""
    return _sdk_module("botocore.exceptions")


def make_client_factory(
    session: Any | None = None,
    *,
    endpoint_url: str | None = None,
) -> ClientFactory:
    """Build a thread-safe, caching ``region -> ec2 client`` factory from a boto3 Session.

    botocore's own retries are turned off (``max_attempts=1``): the provider retries throttled calls
    itself, with full jitter and a bounded attempt count it reports in ``Throttled.attempts``, and
    two stacked retry loops would multiply the wait and hide the count. Run-instances retries are
    safe because every launch carries a ClientToken.
    """
    boto3 = _sdk_module("boto3")
    Config = _sdk_module("botocore.config").Config

    lock = threading.Lock()
    clients: dict[str, Any] = {}
    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60)

    def factory(region: str) -> Any:
        with lock:
            nonlocal session
            if session is None:
                # boto3 sessions are not thread-safe; one session, created once, under the lock.
                session = boto3.session.Session()
            client = clients.get(region)
            if client is None:
                kwargs: dict[str, Any] = {"region_name": region, "config": config}
                if endpoint_url is not None:
                    kwargs["endpoint_url"] = endpoint_url
                client = session.client("ec2", **kwargs)
                clients[region] = client
            return client

    return factory
