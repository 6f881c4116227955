"""Figures of the reliability checks: one JSON file per check, read by ``benchmarks/reliability.py``.

A check records what it tried and what held (``tried`` and ``held``: one line each, for the table)
and its raw counts. Files go to ``$SPOTRAIN_RELIABILITY_OUT`` when it is set (the benchmark sets
it); otherwise nothing is written. Counts that CI keeps smaller than the benchmark's are read from
the environment here, so that both name them in one place.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

ENV_OUT = "SPOTRAIN_RELIABILITY_OUT"
# Hypothesis cases over specs; the benchmark runs the 10,000 (see docs/reliability.md).
ENV_SPEC_CASES = "SPOTRAIN_RELIABILITY_SPEC_CASES"
# Schemathesis examples per API operation.
ENV_API_EXAMPLES = "SPOTRAIN_RELIABILITY_API_EXAMPLES"


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = int(raw)
    if value < 1:
        raise ValueError(f"{name}: must be a positive integer, got {raw!r}")
    return value


def record(check: str, *, tried: str, held: str, **figures: Any) -> Path | None:
    """Write ``check``'s figures (JSON) under ``$SPOTRAIN_RELIABILITY_OUT``; the path, or None."""
    out = os.environ.get(ENV_OUT)
    if not out:
        return None
    path = Path(out) / f"{check}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"check": check, "tried": tried, "held": held, "recorded_unix_s": round(time.time(), 3), **figures}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path
