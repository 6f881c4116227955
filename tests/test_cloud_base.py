"""One copy of each contract the clouds and the two sides of the agent wall share (issue 22).

The AWS and GCP providers run one retry loop (``cloud_providers/retry.py``) and one poll/billing base
(``cloud_providers/cloud_base.py``), and GCP imports nothing of AWS; the controller, the wire and both
agents use one launch record (``cloud_providers/launch.py``).
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

import cloud_providers
from cloud_providers import cloud_base, executor, launch, retry
from cloud_providers.base import SPOT, TAG_PRICE, Instance, InstanceState
from cloud_providers.errors import Throttled
from cloud_providers.local import agent as local_agent
from cloud_providers.remote import wire

ROOT = Path(cloud_providers.__file__).parent


def _imports(path: Path) -> set[str]:
    """The modules a file imports, relative ones resolved against the ``cloud_providers`` package."""
    tree = ast.parse(path.read_text())
    package = ".".join(("cloud_providers", *path.relative_to(ROOT).parent.parts))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            out.add(".".join(p for p in (base, node.module or "") if p))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_gcp_imports_nothing_of_aws_and_both_share_one_retry_policy() -> None:
    from cloud_providers import aws, gcp

    offenders = {p.name: sorted(m for m in _imports(p) if m.startswith("cloud_providers.aws"))
                 for p in (ROOT / "gcp").glob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert aws.RetryPolicy is gcp.RetryPolicy is retry.RetryPolicy


def test_the_shared_loop_retries_retryable_errors_then_translates() -> None:
    sleeps: list[float] = []
    policy = retry.RetryPolicy(max_attempts=3, base_s=1.0, cap_s=8.0, sleep=sleeps.append, rng=random.Random(0))
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        raise TimeoutError("slow")

    with pytest.raises(Throttled) as caught:
        retry.retrying(flaky, retry=policy, sdk_errors=(TimeoutError,), retryable=lambda e: True,
                       translate=lambda e, n: Throttled(f"gave up after {n}", cloud="aws", attempts=n))
    assert (calls, len(sleeps), caught.value.attempts) == (3, 2, 3)
    assert 0 <= sleeps[0] <= 1.0 and 0 <= sleeps[1] <= 2.0
    assert isinstance(caught.value.__cause__, TimeoutError)
    # Not an SDK error: a bug of ours, surfaced as itself at once.
    with pytest.raises(KeyError):
        retry.retrying(lambda: {}["x"], retry=policy, sdk_errors=(TimeoutError,), retryable=lambda e: True,
                       translate=lambda e, n: Throttled("no", attempts=n))


def _instance(**changes: object) -> Instance:
    fields: dict[str, object] = dict(
        instance_id="i-1", cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="g4dn.xlarge",
        market=SPOT, state=InstanceState.TERMINATED, tags={TAG_PRICE: "0.300000"}, launched_at_s=1000.0,
        terminated_at_s=None)
    fields.update(changes)
    return Instance(**fields)  # type: ignore[arg-type]


def test_shared_billing_minimum_tagged_price_and_cap() -> None:
    asked: list[str] = []

    def live() -> float:
        asked.append("live")
        return 0.2

    short = cloud_base.billing(_instance(), end_s=1010.0, min_billed_s=60.0, on_demand_usd_per_hour=0.5,
                               spot_price_usd_per_hour=live)
    assert (short.billed_seconds, short.cost_usd, asked) == (60.0, pytest.approx(60 * 0.3 / 3600), [])
    capped = cloud_base.billing(_instance(tags={TAG_PRICE: "9"}), end_s=4600.0, min_billed_s=60.0,
                                on_demand_usd_per_hour=0.5, spot_price_usd_per_hour=live)
    assert capped.cost_usd == pytest.approx(0.5) == capped.on_demand_cost_usd
    untagged = cloud_base.billing(_instance(tags={}), end_s=4600.0, min_billed_s=60.0, on_demand_usd_per_hour=0.5,
                                  spot_price_usd_per_hour=live)
    assert (untagged.cost_usd, asked) == (pytest.approx(0.2), ["live"])


def test_one_launch_record_for_controller_wire_and_agents() -> None:
    assert executor.WorkerLaunch is launch.WorkerLaunch
    assert not hasattr(wire, "RankAssignment") and not hasattr(local_agent, "GangLaunch")
    la = launch.WorkerLaunch(instance_id="i-1", job_id="job-1", attempt=2, run="python train.py", cwd="/w",
                             ranks=[2, 3], world_size=4, master_addr="10.0.0.1", master_port=29500,
                             env={"SPOTRAIN_JOB_ID": "job-1"}, log_dir="/controller/logs")
    sent = wire.Assignment(instance_id="i-1", launch=la).to_json()
    # The controller's own fields stay home; the rest crosses as it was.
    assert "instance_id" not in sent["launch"] and "log_dir" not in sent["launch"]
    got = wire.Assignment.from_json(sent).launch
    assert got == la.with_(instance_id="", log_dir="")
    for bad, field in (({"attempt": "2"}, "launch.attempt"), ({"ranks": []}, "launch.ranks"),
                       ({"env": {"A": 1}}, "launch.env.A"), ({"world_size": 1}, "launch")):
        with pytest.raises(wire.WireError, match=rf"^{field}: "):
            wire.Assignment.from_json({**sent, "launch": {**sent["launch"], **bad}})
