"""GCP provider: Compute Engine Spot and on-demand GPU VMs through google-cloud-compute (see docs/gcp.md).

The Google SDK is imported lazily (``_google.py``), so importing this package is cheap. The controller
builds the provider with ``make_provider(**settings)``; tests build ``GcpProvider`` directly with a
client factory, or through ``make_provider`` with ``SPOTRAIN_GCP_ENDPOINT`` pointing at the loopback
fake (tests/gcp/fake_compute.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..retry import RetryPolicy
from ..settings import check_settings, split_list, spot_prices_from_env
from ._google import default_credentials, require_sdk, split_endpoint
from .provider import DEFAULT_IMAGE, GcpProvider, instance_name, request_id
from .userdata import AgentBoot


def make_provider(**settings: Any) -> GcpProvider:
    """Build the GCP provider from controller settings (ValueError names a bad or unknown setting).

    ``controller_id`` is required. Unset settings come from the environment, so a controller started
    as a subprocess (e.g. against the loopback fake) can be configured without code:

    - ``endpoint``: ``SPOTRAIN_GCP_ENDPOINT`` (e.g. ``http://127.0.0.1:PORT``; default compute.googleapis.com).
      A plain-HTTP endpoint is a stand-in: it is reached with anonymous credentials.
    - ``project``: ``SPOTRAIN_GCP_PROJECT``, else ``GOOGLE_CLOUD_PROJECT``, else the auth chain's project
    - ``regions`` / ``zones``: ``SPOTRAIN_GCP_REGIONS`` / ``SPOTRAIN_GCP_ZONES`` (default: the bundled
      GPU zones of us-central1)
    - ``image``: ``SPOTRAIN_GCP_IMAGE``; ``service_account``: ``SPOTRAIN_GCP_SERVICE_ACCOUNT``
    - ``spot_price_overrides``: ``SPOTRAIN_GCP_SPOT_PRICES``, a JSON object such as
      ``{"g2-standard-4": 0.25, "us-central1-a/n1-standard-8/T4:1": 0.2}``

    Credentials are checked here, once: without any, ``CredentialsError`` in one line. Without the SDK
    installed it raises ``SdkMissing`` (a ValueError too), naming ``spotrain[gcp]``.
    """
    check_settings("GCP", settings, GcpProvider)
    kwargs: dict[str, Any] = dict(settings)
    env: Mapping[str, str] = os.environ
    if kwargs.get("client_factory") is None:
        require_sdk()
        if kwargs.get("endpoint") is None and env.get("SPOTRAIN_GCP_ENDPOINT"):
            kwargs["endpoint"] = env["SPOTRAIN_GCP_ENDPOINT"]
    project = kwargs.get("project") or env.get("SPOTRAIN_GCP_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT")
    stand_in = bool(kwargs.get("endpoint")) and split_endpoint(str(kwargs["endpoint"]))[0] == "http"
    if kwargs.get("client_factory") is None and kwargs.get("credentials") is None and not stand_in:
        credentials, chain_project = default_credentials()
        kwargs["credentials"] = credentials
        project = project or chain_project
    if not project:
        raise ValueError("no GCP project: set SPOTRAIN_GCP_PROJECT (or GOOGLE_CLOUD_PROJECT, or gcloud's default)")
    kwargs["project"] = project
    for key, var in (("regions", "SPOTRAIN_GCP_REGIONS"), ("zones", "SPOTRAIN_GCP_ZONES"),
                     ("image", "SPOTRAIN_GCP_IMAGE"), ("service_account", "SPOTRAIN_GCP_SERVICE_ACCOUNT")):
        if kwargs.get(key) is None and env.get(var):
            kwargs[key] = env[var]
    for key in ("regions", "zones", "machine_types"):
        if kwargs.get(key) is not None:
            kwargs[key] = split_list(kwargs[key])
    if kwargs.get("spot_price_overrides") is None:
        kwargs["spot_price_overrides"] = spot_prices_from_env(env, "SPOTRAIN_GCP_SPOT_PRICES", '{"g2-standard-4": 0.25}')
    return GcpProvider(**kwargs)


__all__ = [
    "AgentBoot",
    "DEFAULT_IMAGE",
    "GcpProvider",
    "RetryPolicy",
    "instance_name",
    "make_provider",
    "request_id",
]
