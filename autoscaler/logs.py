"""Job logs: the controller's event history of a job, then its workers' output."""

from __future__ import annotations

import datetime as dt
import re

from .errors import JobNotFound
from .home import logs_dir
from .state import Store

_TAIL_BYTES = 64_000


def _fmt_ts(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def job_logs(store: Store, ref: str, *, rank: int | None = None) -> str:
    with store.session() as s:
        job = store.job(s, ref)
        if job is None:
            raise JobNotFound(f"no job {ref!r}")
        job_id = job.job_id
        lines = [f"== events of {job_id}"]
        for e in store.events(s, job_id):
            arrow = f"{e.from_state} -> {e.to_state}" if e.kind == "state" else e.kind
            lines.append(f"{_fmt_ts(e.ts)}  {arrow:28s} {e.reason}")
    d = logs_dir(job_id)
    files = []
    for f in d.glob("attempt-*-rank-*.log"):
        m = re.match(r"attempt-(\d+)-rank-(\d+)\.log", f.name)
        if m and (rank is None and int(m.group(2)) == 0 or rank == int(m.group(2))):
            files.append((int(m.group(1)), int(m.group(2)), f))
    for attempt, r, f in sorted(files):
        lines.append(f"== worker output: attempt {attempt}, rank {r}")
        data = f.read_bytes()
        if len(data) > _TAIL_BYTES:
            data = b"...\n" + data[-_TAIL_BYTES:]
        lines.append(data.decode(errors="replace").rstrip())
    return "\n".join(lines) + "\n"
