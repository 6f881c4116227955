"""AWS provider: EC2 spot and on-demand GPU instances through boto3 (see docs/aws.md).

boto3 is imported lazily (``_boto.py``), so importing this package is cheap. The controller builds the
provider with ``make_provider(**settings)``; tests build ``AwsProvider`` directly with a client factory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._boto import require_sdk
from .errors import RetryPolicy
from .provider import DEFAULT_IMAGE_ID, AwsProvider
from .userdata import AgentBoot

_SETTINGS = frozenset(
    {
        "regions",
        "zones",
        "controller_id",
        "session",
        "client_factory",
        "endpoint_url",
        "image_id",
        "spot_price_overrides",
        "spot_price_ttl_s",
        "catalog_ttl_s",
        "boot_config_for",
        "agent_boot",
        "subnet_by_zone",
        "security_group_ids",
        "key_name",
        "instance_profile",
        "retry",
        "clock",
    }
)


def _split(value: Any) -> Any:
    """Accept "us-east-1,us-west-2" from a command line or environment as well as a list."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def make_provider(**settings: Any) -> AwsProvider:
    """Build the AWS provider from controller settings (ValueError names a bad or unknown setting).

    ``controller_id`` is required. Unset settings come from the environment, so a controller started
    as a subprocess (e.g. against moto's server) can be configured without code:

    - ``regions``: ``SPOTRAIN_AWS_REGIONS``, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else us-east-1
    - ``zones``: ``SPOTRAIN_AWS_ZONES`` (default: every zone of the regions)
    - ``image_id``: ``SPOTRAIN_AWS_IMAGE_ID`` (default: the PyTorch Deep Learning AMI via SSM)
    - ``spot_price_overrides``: ``SPOTRAIN_AWS_SPOT_PRICES``, a JSON object such as
      ``{"g4dn.xlarge": 0.16, "us-east-1a/g5.xlarge": 0.36}`` (moto's own spot prices are fake)

    Comma-separated strings are accepted for ``regions``, ``zones`` and ``security_group_ids``.
    Without boto3 installed it raises ``SdkMissing`` (a ValueError too), naming ``spotrain[aws]``.
    """
    import json
    import os

    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise ValueError(f"unknown AWS provider setting(s): {', '.join(unknown)}")
    if "controller_id" not in settings:
        raise ValueError("AWS provider setting controller_id is required")
    if settings.get("client_factory") is None:
        require_sdk()
    kwargs: dict[str, Any] = dict(settings)
    env: Mapping[str, str] = os.environ
    default_region = (
        env.get("SPOTRAIN_AWS_REGIONS") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    )
    kwargs["regions"] = _split(kwargs.get("regions") or default_region)
    if kwargs.get("zones") is None and env.get("SPOTRAIN_AWS_ZONES"):
        kwargs["zones"] = env["SPOTRAIN_AWS_ZONES"]
    if kwargs.get("spot_price_overrides") is None and env.get("SPOTRAIN_AWS_SPOT_PRICES"):
        try:
            prices = json.loads(env["SPOTRAIN_AWS_SPOT_PRICES"])
            kwargs["spot_price_overrides"] = {str(k): float(v) for k, v in prices.items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise ValueError(
                "SPOTRAIN_AWS_SPOT_PRICES must be a JSON object of prices, e.g. {\"g4dn.xlarge\": 0.16}"
            ) from exc
    for key in ("zones", "security_group_ids"):
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = _split(kwargs[key])
    if not kwargs.get("image_id"):
        kwargs["image_id"] = env.get("SPOTRAIN_AWS_IMAGE_ID") or DEFAULT_IMAGE_ID
    return AwsProvider(**kwargs)


__all__ = [
    "AgentBoot",
    "AwsProvider",
    "DEFAULT_IMAGE_ID",
    "RetryPolicy",
    "make_provider",
]
