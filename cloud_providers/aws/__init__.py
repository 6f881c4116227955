"""AWS provider: EC2 spot and on-demand GPU instances through boto3 (see docs/aws.md).

boto3 is imported lazily (``_boto.py``), so importing this package is cheap. The controller builds the
provider with ``make_provider(**settings)``; tests build ``AwsProvider`` directly with a client factory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..retry import RetryPolicy
from ..settings import check_settings, split_list, spot_prices_from_env
from ._boto import require_sdk
from .provider import DEFAULT_IMAGE_ID, AwsProvider
from .userdata import AgentBoot


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
    import os

    check_settings("AWS", settings, AwsProvider)
    if settings.get("client_factory") is None:
        require_sdk()
    kwargs: dict[str, Any] = dict(settings)
    env: Mapping[str, str] = os.environ
    default_region = (
        env.get("SPOTRAIN_AWS_REGIONS") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    )
    kwargs["regions"] = split_list(kwargs.get("regions") or default_region)
    if kwargs.get("zones") is None and env.get("SPOTRAIN_AWS_ZONES"):
        kwargs["zones"] = env["SPOTRAIN_AWS_ZONES"]
    if kwargs.get("spot_price_overrides") is None:
        kwargs["spot_price_overrides"] = spot_prices_from_env(env, "SPOTRAIN_AWS_SPOT_PRICES", '{"g4dn.xlarge": 0.16}')
    for key in ("zones", "security_group_ids"):
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = split_list(kwargs[key])
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
