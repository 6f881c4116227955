"""spotrain's parameters object: one frozen dataclass, validated, round-tripped through a mapping."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import make_spec

from autoscaler.policy import JobView, PolicyInput, get_policy
from autoscaler.policy.jobmath import CAPACITY_BACKOFF_S, DEFAULT_RESTART_OVERHEAD_S
from autoscaler.policy.params import DEFAULT_PARAMS, PolicyParams
from autoscaler.policy.spotrain import SpotrainPolicy
from cloud_providers.base import Offering


def test_defaults_round_trip_through_json() -> None:
    d = DEFAULT_PARAMS.to_dict()
    assert PolicyParams.from_mapping(json.loads(json.dumps(d))) == DEFAULT_PARAMS
    assert d["capacity_backoff_s"] == CAPACITY_BACKOFF_S and d["default_restart_overhead_s"] == DEFAULT_RESTART_OVERHEAD_S
    assert set(d) == {f.name for f in dataclasses.fields(PolicyParams)}
    # JSON writes 6.0 as 6.0 but a tuner may write 6: float fields read ints as floats.
    p = PolicyParams.from_mapping({"switch_margin": 5, "spot_candidates": 3})
    assert p.switch_margin == 5.0 and isinstance(p.switch_margin, float) and p.spot_candidates == 3
    assert p.horizon_s == DEFAULT_PARAMS.horizon_s  # names left out keep the defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.switch_margin = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("values,match", [
    ({"swich_margin": 3.0}, "'swich_margin' is unknown"),
    ({"switch_margin": -1.0}, r"'switch_margin' must be in \[0, 1000\]"),
    ({"faster_tolerance": 1.5}, "'faster_tolerance' must be in"),
    ({"horizon_s": float("nan")}, "'horizon_s' must be in"),
    ({"spot_candidates": 2.5}, "'spot_candidates' must be an integer"),
    ({"spot_candidates": 0}, "'spot_candidates' must be in"),
    ({"wait_premium": "0.1"}, "'wait_premium' must be a number"),
    ({"od_candidates": True}, "'od_candidates' must be an integer"),
    ({"safety_net_restarts": 0.5}, "'safety_net_restarts' must be in"),
])
def test_bad_values_name_the_field(values: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        PolicyParams.from_mapping(values)
    assert "\n" not in str(info.value)


def test_construction_validates_too() -> None:
    with pytest.raises(ValueError, match="'outage_margin'"):
        PolicyParams(outage_margin=-2.0)
    with pytest.raises(TypeError):
        PolicyParams.from_mapping([("switch_margin", 3.0)])  # type: ignore[arg-type]


def test_the_policy_reads_its_params() -> None:
    """The defaults are what ``get_policy`` builds; a parameter passed in changes the decision: a spot
    market that refused capacity 700 s ago is asked again under the default 600 s back-off, not under
    a 1000 s one."""
    assert get_policy("spotrain").params is DEFAULT_PARAMS  # type: ignore[attr-defined]
    cheap, dear = (Offering("aws", "us-east-1", f"us-east-1{z}", "p3.2xlarge", "V100", 1, 3.06, spot, 1)
                   for z, spot in (("a", 0.9), ("b", 1.0)))
    spec = make_spec(objective={}, simulate={"work_gpu_hours": 4})
    job = JobView("j", spec, submitted_s=0.0, progress=0.0, recent_capacity_failures={cheap.key + "|spot": 300.0})
    inp = PolicyInput(now_s=1000.0, jobs=(job,), offerings=(cheap, dear))

    def where(policy: SpotrainPolicy) -> list[tuple[str, str]]:
        return [(p.offering_key, p.market) for p in policy.decide(inp)[0].placements]

    assert where(SpotrainPolicy()) == [(cheap.key, "spot")]
    assert where(SpotrainPolicy(PolicyParams(capacity_backoff_s=1000.0))) == [(dear.key, "spot")]
    with pytest.raises(TypeError):
        SpotrainPolicy({"switch_margin": 3.0})  # type: ignore[arg-type]
