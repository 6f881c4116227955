"""Smoke test against a real AWS account. Skipped unless asked for, because it needs credentials
and, with SPOTRAIN_AWS_REAL_LAUNCH=1, spends a few cents on a g4dn.xlarge spot instance.

    SPOTRAIN_AWS_REAL=1 [SPOTRAIN_AWS_REAL_LAUNCH=1] AWS_PROFILE=... python -m pytest tests/aws/test_aws_real.py

It always terminates what it launched (see docs/aws.md).
"""

from __future__ import annotations

import os
import uuid

import pytest

from cloud_providers.aws import make_provider
from cloud_providers.base import SPOT, TAG_CONTROLLER, TAG_JOB, InstanceState, LaunchRequest

pytestmark = [
    pytest.mark.aws,
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SPOTRAIN_AWS_REAL") != "1", reason="set SPOTRAIN_AWS_REAL=1 to use real AWS"),
]


def test_real_offerings_have_live_spot_prices() -> None:
    provider = make_provider(controller_id=f"smoke-{uuid.uuid4().hex[:8]}")
    offerings = provider.offerings()
    assert offerings
    spot = [o for o in offerings if o.spot_price_usd_per_hour is not None]
    assert spot and all(0 < o.spot_price_usd_per_hour < o.on_demand_price_usd_per_hour for o in spot)  # type: ignore[operator]


@pytest.mark.skipif(os.environ.get("SPOTRAIN_AWS_REAL_LAUNCH") != "1", reason="set SPOTRAIN_AWS_REAL_LAUNCH=1 to launch")
def test_real_launch_is_idempotent_and_terminates() -> None:
    controller = f"smoke-{uuid.uuid4().hex[:8]}"
    provider = make_provider(controller_id=controller)
    offering = min((o for o in provider.offerings() if o.spot_price_usd_per_hour),
                   key=lambda o: o.spot_price_usd_per_hour or 0.0)
    request = LaunchRequest(offering=offering, market=SPOT, decision_id=f"smoke-{uuid.uuid4().hex}",
                            tags={TAG_JOB: "smoke", TAG_CONTROLLER: controller})
    instance = provider.launch(request)
    try:
        assert provider.launch(request).instance_id == instance.instance_id
    finally:
        for inst in provider.list_instances({TAG_CONTROLLER: controller}):
            provider.terminate(inst.instance_id)
    assert all(i.state is InstanceState.TERMINATED for i in provider.list_instances({TAG_CONTROLLER: controller}))
