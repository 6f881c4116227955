"""The local cloud's parts: market traces, scenarios, the simulated spot market and its billing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_providers.base import SPOT, TAG_JOB, InstanceState, LaunchRequest
from cloud_providers.errors import CapacityUnavailable
from cloud_providers.local.market import MarketTrace, TraceError, write_trace
from cloud_providers.local.provider import LocalProvider
from cloud_providers.local.scenario import ScenarioError, parse_scenario

TRACE = write_trace(
    [
        (0, "aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "T4", 1, 0.16, 0.526, 2),
        (3600, "aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "T4", 1, 0.32, 0.526, 1),
        (0, "gcp", "us-central1", "us-central1-a", "n1-standard-8", "V100", 1, "", 2.86, 0),
    ]
)
T4 = "aws/us-east-1a/g4dn.xlarge/T4:1"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def provider(tmp_path: Path, clock: FakeClock, scenario_text: str = "") -> LocalProvider:
    sc = parse_scenario(scenario_text, base_dir=tmp_path) if scenario_text else None
    return LocalProvider(root=tmp_path / "cloud", trace=MarketTrace.parse(TRACE), time_scale=60, scenario=sc,
                         clock=clock, min_notice_real_s=1.0)


def launch(p: LocalProvider, decision: str, market: str = SPOT, job: str = "j1"):  # type: ignore[no-untyped-def]
    o = next(o for o in p.offerings() if o.key == T4)
    return p.launch(LaunchRequest(offering=o, market=market, decision_id=decision, tags={TAG_JOB: job}))


def test_trace_state_and_price_integral() -> None:
    t = MarketTrace.parse(TRACE)
    assert t.offering_at(T4, 10).spot_available == 2
    assert t.offering_at(T4, 4000).spot_price_usd_per_hour == 0.32
    # Half an hour at 0.16 then half an hour at 0.32.
    assert t.spot_price_integral_usd(T4, 1800, 5400) == pytest.approx(0.08 + 0.16)
    assert t.spot_price_integral_usd(T4, 1800, 5400, market="on-demand") == pytest.approx(0.526)
    v100 = t.offering_at("gcp/us-central1-a/n1-standard-8/V100:1", 0)
    assert v100.spot_price_usd_per_hour is None and v100.notice_seconds == 30.0


@pytest.mark.parametrize(
    "text, msg",
    [
        ("a,b\n", "header must be"),
        (TRACE + "10,aws,us-east-1,us-east-1a,g4dn.xlarge,T4,1,x,0.5,1\n", "line 5"),
        (TRACE + "5,aws,us-east-1,us-east-1a,g4dn.xlarge,T4,1,0.1,0.5,1\n", "goes backwards"),
        (TRACE + "9000,aws,us-east-1,us-east-1a,g4dn.xlarge,T4,1,0.1,-0.5,1\n", "on_demand_price must be > 0"),
        (TRACE + "9000,aws,us-east-1,us-east-1a,g4dn.xlarge,T4,1,nan,0.5,1\n", "finite"),
        (TRACE + "inf,aws,us-east-1,us-east-1a,g4dn.xlarge,T4,1,0.1,0.5,1\n", "finite"),
        (TRACE + "9000,aws,us-east-1,us-east-1a,g4dn.xlarge,,1,0.1,0.5,1\n", "accelerator is empty"),
        (TRACE + "9000,aws,us-east-1,us-east-1a,g4dn.xlarge,T4,2.5,0.1,0.5,1\n", "gpus must be a whole number"),
        (TRACE + "9000,aws,us-east-1,us-east-1a,g4dn.xlarge,T4,1,0.1,0.5,99999999999999999999\n", "spot_available"),
    ],
)
def test_bad_traces_name_the_line(text: str, msg: str) -> None:
    with pytest.raises(TraceError, match=msg):
        MarketTrace.parse(text)


def test_bundled_trace_loads() -> None:
    t = MarketTrace.bundled()
    assert len(t.keys) >= 5 and t.duration_s >= 24 * 3600


@pytest.mark.parametrize(
    "text, msg",
    [
        ("time_scale: 0\n", "time_scale"),
        ("speed: 3\n", "speed: unknown field"),
        ("events:\n  - {at: 1s, at_step: 3, preempt: 1}\n", "exactly one of at, at_step"),
        ("events:\n  - {at: soon, preempt: 1}\n", "events[0].at"),
        ("events:\n  - {at_step: 3}\n", "exactly one of spot_capacity, preempt"),
        ("market: nope.csv\n", "market"),
    ],
)
def test_bad_scenarios(tmp_path: Path, text: str, msg: str) -> None:
    with pytest.raises(ScenarioError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(text, base_dir=tmp_path)


def test_market_notice_then_termination_and_billing(tmp_path: Path) -> None:
    clock = FakeClock()
    p = provider(tmp_path, clock)
    a, b = launch(p, "d1"), launch(p, "d2")
    with pytest.raises(CapacityUnavailable):
        launch(p, "d3")
    assert launch(p, "d1").instance_id == a.instance_id  # idempotent
    clock.t += 61  # 61 real s = 3660 market s: availability drops to 1
    changed = p.poll()
    assert [i.instance_id for i in changed] == [b.instance_id]  # the newest is preempted
    assert changed[0].state is InstanceState.NOTICE and changed[0].interruption == "spot-market"
    assert p.poll() == []
    clock.t += 30  # nobody polls for a while (a controller that was down)
    gone = p.poll()
    assert [i.instance_id for i in gone] == [b.instance_id] and gone[0].state is InstanceState.TERMINATED
    bill = p.billing(gone[0])
    # Billed until the notice ran out (min 1 real s = 60 market s, AWS's 120 s is longer), not until the late poll.
    assert bill.billed_seconds == pytest.approx(3660 + 120, abs=1)
    assert bill.cost_usd == pytest.approx(0.16 + 0.32 * 180 / 3600, rel=1e-3)
    assert bill.on_demand_cost_usd > bill.cost_usd
    # Billing of a live instance grows with time; a terminated one's is final.
    before = p.billing(p.get(a.instance_id)).cost_usd  # type: ignore[arg-type]
    clock.t += 10
    assert p.billing(p.get(a.instance_id)).cost_usd > before  # type: ignore[arg-type]
    assert p.billing(p.get(b.instance_id)).cost_usd == pytest.approx(bill.cost_usd)  # type: ignore[arg-type]


def test_scenario_capacity_and_preempt(tmp_path: Path) -> None:
    clock = FakeClock()
    p = provider(tmp_path, clock, "events:\n  - {at: 5s, spot_capacity: 1}\n  - {at: 20s, preempt: 1}\n")
    a, b = launch(p, "d1"), launch(p, "d2")
    clock.t += 6
    assert [i.instance_id for i in p.poll()] == [b.instance_id]
    clock.t += 3
    p.poll()
    with pytest.raises(CapacityUnavailable):
        launch(p, "d3")
    clock.t += 15
    assert [i.instance_id for i in p.poll()] == [a.instance_id]


def test_state_survives_a_new_provider_object(tmp_path: Path) -> None:
    clock = FakeClock()
    p = provider(tmp_path, clock)
    a = launch(p, "d1", market="on-demand")
    clock.t += 30
    p2 = provider(tmp_path, clock)
    assert p2.now_s() == pytest.approx(30 * 60)
    assert [i.instance_id for i in p2.list_instances({TAG_JOB: "j1"})] == [a.instance_id]
    assert launch(p2, "d1", market="on-demand").instance_id == a.instance_id
