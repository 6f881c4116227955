"""Scripted local-cloud scenarios (DESIGN.md "Local-cloud scenario"), for tests, demos and checks.

```yaml
market: PATH            # optional market trace; default: the bundled one
time_scale: 60          # optional: market seconds per real second
min_billed: 60s         # optional: the least the cloud bills a launch (EC2: 60 s)
oracle: false           # optional: report each offering's spot room (no real cloud does; research only)
events:                 # each at a real time since the job started, or at a training step
  - {at: 10s, spot_capacity: 2}   # from then on the job may hold at most 2 spot workers
  - {at_step: 55, preempt: 1}     # preempt 1 spot worker, with the cloud's notice
```
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..durations import parse_duration_s
from ..errors import ProviderError
from ..safe_files import MAX_DOCUMENT_BYTES, FileRefused, parse_yaml, read_text_file


class ScenarioError(ProviderError, ValueError):
    """The scenario file is invalid; the message is one line naming the field."""


@dataclasses.dataclass(frozen=True)
class ScenarioEvent:
    index: int
    at_real_s: float | None = None
    at_step: int | None = None
    spot_capacity: int | None = None
    preempt: int | None = None


@dataclasses.dataclass(frozen=True)
class Scenario:
    market: Path | None = None
    time_scale: float | None = None
    events: tuple[ScenarioEvent, ...] = ()
    # The least the cloud bills a launch, in market seconds (EC2: 60 s); 0: none.
    min_billed_s: float = 0.0
    # Report the trace's spot room to the controller (off: only launches and notices show it).
    oracle: bool = False


def _seconds(v: Any, where: str) -> float:
    try:
        return parse_duration_s(v, allow_zero=True)
    except ValueError as exc:
        raise ScenarioError(f"scenario error: {where}: {exc}") from None


def parse_scenario(text: str, *, base_dir: Path, source: str = "scenario") -> Scenario:
    try:  # the product's one bounded YAML reader (issue 21, finding 11)
        data = parse_yaml(text, source=source)
    except FileRefused as exc:
        raise ScenarioError(f"scenario error: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario error: {source}: must be a mapping")
    unknown = set(data) - {"market", "time_scale", "events", "min_billed", "oracle"}
    if unknown:
        raise ScenarioError(f"scenario error: {sorted(unknown)[0]}: unknown field")
    market = None
    if data.get("market") is not None:
        market = (base_dir / str(data["market"])).resolve()
        if not market.is_file():
            raise ScenarioError(f"scenario error: market: {data['market']!r} is not a file")
    ts = data.get("time_scale")
    if ts is not None:
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts <= 0:
            raise ScenarioError(f"scenario error: time_scale: must be a positive number, got {ts!r}")
        ts = float(ts)
    raw_events = data.get("events") or []
    if not isinstance(raw_events, list):
        raise ScenarioError("scenario error: events: must be a list")
    events = []
    for i, e in enumerate(raw_events):
        where = f"events[{i}]"
        if not isinstance(e, dict):
            raise ScenarioError(f"scenario error: {where}: must be a mapping")
        unknown = set(e) - {"at", "at_step", "spot_capacity", "preempt"}
        if unknown:
            raise ScenarioError(f"scenario error: {where}.{sorted(unknown)[0]}: unknown field")
        if ("at" in e) == ("at_step" in e):
            raise ScenarioError(f"scenario error: {where}: give exactly one of at, at_step")
        if ("spot_capacity" in e) == ("preempt" in e):
            raise ScenarioError(f"scenario error: {where}: give exactly one of spot_capacity, preempt")
        at = _seconds(e["at"], f"{where}.at") if "at" in e else None
        at_step = None
        if "at_step" in e:
            if isinstance(e["at_step"], bool) or not isinstance(e["at_step"], int) or e["at_step"] < 0:
                raise ScenarioError(f"scenario error: {where}.at_step: must be a non-negative integer")
            at_step = e["at_step"]
        cap = e.get("spot_capacity")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ScenarioError(f"scenario error: {where}.spot_capacity: must be a non-negative integer")
        pre = e.get("preempt")
        if pre is not None and (isinstance(pre, bool) or not isinstance(pre, int) or pre < 1):
            raise ScenarioError(f"scenario error: {where}.preempt: must be a positive integer")
        events.append(ScenarioEvent(i, at, at_step, cap, pre))
    min_billed = _seconds(data["min_billed"], "min_billed") if data.get("min_billed") is not None else 0.0
    oracle = data.get("oracle", False)
    if oracle is None:
        oracle = False
    if not isinstance(oracle, bool):
        raise ScenarioError(f"scenario error: oracle: must be true or false, got {oracle!r}")
    return Scenario(market, ts, tuple(events), min_billed, oracle)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:  # a regular file of at most MAX_DOCUMENT_BYTES: a FIFO or /dev/zero is refused, never waited on
        text = read_text_file(p, max_bytes=MAX_DOCUMENT_BYTES, what="")
    except FileRefused as exc:
        raise ScenarioError(f"scenario error: {exc}") from None
    return parse_scenario(text, base_dir=p.parent, source=str(path))
