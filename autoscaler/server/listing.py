"""Lists of jobs that do not grow with history (issue 21, finding 7).

At 10,000 finished jobs, ``GET /v1/jobs`` took 147 s (every job, one instances query per job), the
dashboard 160 s and ``/metrics`` 9.9 s. A list is now one page of jobs chosen by state (the live
ones by default), read off the ``(state, submitted_at)`` index, and the instances of the whole page
in one query: a fixed number of statements per page, whatever number of jobs ended before.

``state``: ``live`` (default), ``ended``, ``all`` or a comma-separated list of states;
``limit``: 1..``MAX_LIMIT`` jobs a page; ``offset``: jobs to skip; ``order``: ``oldest`` first
(default) or ``newest`` first. The answer says how many jobs match and where the next page starts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from autoscaler.errors import SpecError
from autoscaler.jobs.summary import job_summary
from autoscaler.state.store import LIVE_SELECTOR, Store, states_of

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from autoscaler.server.schemas import JobSummary

DEFAULT_LIMIT = 200
MAX_LIMIT = 1000
ORDERS = ("oldest", "newest")


@dataclasses.dataclass(frozen=True)
class JobPage:
    jobs: list[JobSummary]
    total: int  # jobs that match the selector, on every page
    next_offset: int | None  # where the next page starts; None on the last page


def job_page(store: Store, s: Session, *, state: str = LIVE_SELECTOR, limit: int = DEFAULT_LIMIT, offset: int = 0,
             order: str = "oldest") -> JobPage:
    """One page of job summaries (see the module doc); ``SpecError`` (one line) for a bad parameter."""
    try:
        states = states_of(state)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if not 1 <= limit <= MAX_LIMIT:
        raise SpecError(f"limit: must be between 1 and {MAX_LIMIT}, got {limit}")
    if offset < 0:
        raise SpecError(f"offset: must be >= 0, got {offset}")
    if order not in ORDERS:
        raise SpecError(f"order: {order!r} is not one of {', '.join(ORDERS)}")
    jobs = store.job_page(s, states=states, limit=limit, offset=offset, newest_first=order == "newest")
    rows = store.instances_of(s, [j.job_id for j in jobs])
    total = store.count_jobs(s, states)
    nxt = offset + len(jobs)
    return JobPage([job_summary(j, rows[j.job_id]) for j in jobs], total, nxt if nxt < total else None)
