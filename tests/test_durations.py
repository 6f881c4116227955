"""One duration grammar (``cloud_providers.durations``) for the job spec and the local cloud's scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.errors import SpecError
from autoscaler.jobs.spec import parse_spec_text, spec_from_dict, spec_from_stored
from cloud_providers.durations import format_duration_s, parse_duration_s
from cloud_providers.local.scenario import ScenarioError, parse_scenario

SPEC = "name: a\nrun: x\nresources: {accelerators: [V100:1]}\n"


@pytest.mark.parametrize(
    "text, seconds",
    [("36h", 129600.0), ("90m", 5400.0), ("30s", 30.0), ("2d", 172800.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
     ("1d 2h", 93600.0), ("250ms", 0.25), ("5m30s", 330.0), (" 10 s ", 10.0)],
)
def test_durations_need_a_unit_and_may_combine_units(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize(
    "value, msg",
    [(36, "36 has no unit"), ("36", "'36' has no unit"), (2.5, "2.5 has no unit"), ("-5h", "not a duration"),
     ("1s1h", "not a duration"), ("", "not a duration"), ("h", "not a duration"), (True, "not a duration"),
     (None, "not a duration"), ("0s", "must be positive"), ("1e400s", "too large")],
)
def test_bad_durations_are_one_line_errors(value: object, msg: str) -> None:
    with pytest.raises(ValueError, match=msg) as err:
        parse_duration_s(value)
    assert "\n" not in str(err.value)


def test_zero_only_where_allowed() -> None:
    assert parse_duration_s("0s", allow_zero=True) == 0.0


@pytest.mark.parametrize("seconds", [600.0, 129600.0, 1 / 3, 1e20, 1e-7])
def test_format_reads_back_to_the_same_float(seconds: float) -> None:
    assert parse_duration_s(format_duration_s(seconds)) == seconds


@pytest.mark.parametrize("field, where", [("objective: {deadline: %s}", "objective.deadline"),
                                          ("checkpoint: {interval: %s}", "checkpoint.interval")])
def test_a_unitless_spec_duration_is_an_error_naming_the_field(field: str, where: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec_text(SPEC + field % "36")
    assert str(err.value) == f"spec error: {where}: 36 has no unit: write e.g. 36h, 90m, 30s or 2d"
    with pytest.raises(SpecError, match=f"^spec error: {where}: 36 has no unit"):
        parse_spec_text(SPEC, overrides=[f"{where}=36"])


def test_spec_durations_round_trip_through_to_dict() -> None:
    spec = parse_spec_text(SPEC + "objective: {deadline: 1h30m}\ncheckpoint: {interval: 10m}\n")
    assert spec.objective.deadline_s == 5400.0 and spec.checkpoint.interval_s == 600.0
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["objective"]["deadline"] == "5400.0s" and data["checkpoint"]["interval"] == "600.0s"
    assert spec_from_dict(data) == spec
    no_deadline = parse_spec_text(SPEC)
    assert no_deadline.to_dict()["objective"]["deadline"] is None
    assert spec_from_dict(no_deadline.to_dict()) == no_deadline


def test_specs_stored_before_durations_needed_a_unit_still_load() -> None:
    spec = parse_spec_text(SPEC + "objective: {deadline: 36h}\ncheckpoint: {interval: 10m}\n")
    old = {**spec.to_dict(), "objective": {"deadline": 129600.0, "budget_usd": None},
           "checkpoint": {"store": None, "interval": 600.0, "keep": 3}}
    assert spec_from_stored(old) == spec
    assert spec_from_stored(spec.to_dict()) == spec
    with pytest.raises(SpecError, match="objective.deadline: 129600.0 has no unit"):
        spec_from_dict(old)


def test_scenario_times_use_the_same_grammar(tmp_path: Path) -> None:
    sc = parse_scenario("events:\n  - {at: 0s, spot_capacity: 2}\n  - {at: 1m30s, preempt: 1}\n"
                        "  - {at: 250ms, preempt: 1}\n", base_dir=tmp_path)
    assert [e.at_real_s for e in sc.events] == [0.0, 90.0, 0.25]
    with pytest.raises(ScenarioError) as err:
        parse_scenario("events:\n  - {at: 10, preempt: 1}\n", base_dir=tmp_path)
    assert str(err.value) == "scenario error: events[0].at: 10 has no unit: write e.g. 36h, 90m, 30s or 2d"
