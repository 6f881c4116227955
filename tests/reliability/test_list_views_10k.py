"""The reliability suite's row for issue 21, finding 7: the list views at 10,000 finished jobs.

``tests/test_list_latency.py``'s harness (a real SQLite file, the real app over HTTP, the real
recovery) at the issue's scale: ``GET /v1/jobs``, a page of every job, ``/ui``, ``/metrics`` and
startup recovery each answer in a fixed number of SQL statements, the same as with 100 finished jobs,
and well within the issue's 200 ms (best of 3; asserted at 500 ms for a loaded CI machine, the
figures say what they were). ``benchmarks/list_latency.py`` prints the same figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_list_latency import controller_with_history, measure

from reliability.figures import record

FINISHED = 10_000
TARGET_MS = 200.0


@pytest.mark.chaos
@pytest.mark.slow
def test_list_views_at_ten_thousand_finished_jobs(spotrain_home: Path, tmp_path: Path) -> None:
    few = measure(controller_with_history(tmp_path / "few.db", 100))
    full = measure(controller_with_history(tmp_path / "full.db", FINISHED), repeat=3)
    slowest = max(full.values(), key=lambda c: c.ms)
    record("list_latency", tried=f"GET /v1/jobs, a page of all jobs, /ui, /metrics and recovery at {FINISHED:,} finished jobs",
           held=(f"the same SQL statements as with 100; slowest {slowest.ms:.0f} ms "
                 f"({'within' if slowest.ms < TARGET_MS else 'PAST'} the {TARGET_MS:.0f} ms target)"),
           finished=FINISHED, views={k: {"statements": c.statements, "ms": round(c.ms, 2)} for k, c in full.items()})
    for name, cost in full.items():
        assert cost.statements == few[name].statements, (name, few[name], cost)
        assert cost.ms < 500.0, (name, cost)
