"""Job logs: the controller's event history of a job, then its workers' output.

Each worker log shows its last ``_TAIL_BYTES``, read from the end of the file: a rank log can be
gigabytes, and reading it whole to keep 64 kB pushed the controller to 1.7 GB (issue 14, finding 6).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoscaler.errors import JobNotFound
from autoscaler.home import logs_dir
from autoscaler.jobs import log_cap
from cloud_providers.jobfiles import UnsafeJobFile, open_regular

if TYPE_CHECKING:  # the CLI renders logs without SQLAlchemy (cli/offline.py)
    from autoscaler.state import Store

_TAIL_BYTES = 64_000


def _fmt_ts(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def tail_bytes(path: Path, limit: int = _TAIL_BYTES) -> bytes:
    """The last ``limit`` bytes of ``path`` (``b"...\\n"`` first when there was more), reading no more
    than that: the file is read from ``size - limit``, never from its start. Only a regular file is
    read (the workers could leave a FIFO there): ``OSError`` otherwise."""
    try:
        f = open_regular(path)
    except UnsafeJobFile as exc:
        raise OSError(str(exc)) from None
    with f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - limit)
        f.seek(start)
        data = f.read(limit)
    return b"...\n" + data if start else data


def job_logs(store: Store, ref: str, *, rank: int | None = None) -> str:
    with store.session() as s:
        job = store.job(s, ref)
        if job is None:
            raise JobNotFound(f"no job {ref!r}")
        return render_logs(job.job_id, store.events(s, job.job_id), rank=rank)


def render_logs(job_id: str, events: Iterable[Any], *, rank: int | None = None) -> str:
    """The job's events (any rows with ``ts, kind, from_state, to_state, reason``), then its workers' output."""
    lines = [f"== events of {job_id}"]
    for e in events:
        arrow = f"{e.from_state} -> {e.to_state}" if e.kind == "state" else e.kind
        lines.append(f"{_fmt_ts(e.ts)}  {arrow:28s} {e.reason}")
    for attempt, r, text in worker_outputs(job_id, rank=rank):
        lines.append(f"== worker output: attempt {attempt}, rank {r}")
        lines.append(text)
    return "\n".join(lines) + "\n"


def worker_outputs(job_id: str, *, rank: int | None = None, limit_bytes: int = _TAIL_BYTES,
                   last_attempts: int | None = None) -> list[tuple[int, int, str]]:
    """The workers' output of ``job_id`` as ``(attempt, rank, text)``, oldest attempt first: rank 0's
    (or ``rank``'s) log of each gang attempt, its last ``limit_bytes`` (a note first when the log was
    rotated), only the newest ``last_attempts`` attempts when given. ``spotrain logs`` and the
    dashboard's job page both show this."""
    d = logs_dir(job_id)
    files = []
    for f in d.glob("attempt-*-rank-*.log"):
        m = re.match(r"attempt-(\d+)-rank-(\d+)\.log", f.name)
        if m and (rank is None and int(m.group(2)) == 0 or rank == int(m.group(2))) and f.is_file():
            files.append((int(m.group(1)), int(m.group(2)), f))
    files.sort()
    if last_attempts is not None:
        keep = sorted({a for a, _, _ in files})[-last_attempts:] if last_attempts > 0 else []
        files = [x for x in files if x[0] in keep]
    out = []
    for attempt, r, f in files:
        parts = []
        meta = log_cap.read_meta(f)
        if meta["rotations"]:
            parts.append(f"(output rotated {meta['rotations']} time(s): the first {meta['base_bytes']} bytes are not in "
                         f"{f.name}, the part before it is in {f.name}.1; each job keeps at most "
                         f"{log_cap.job_log_max_bytes() / 2**20:g} MiB of output, {log_cap.ENV_JOB_LOG_MAX_MB})")
        try:
            data = tail_bytes(f, limit_bytes)
        except OSError as exc:
            data = f"(cannot read {f.name}: {exc.strerror or exc})".encode()
        parts.append(data.decode(errors="replace").rstrip())
        out.append((attempt, r, "\n".join(parts)))
    return out


# The most one ``read_output`` call returns (``spotrain logs -f`` asks again for the rest).
CHUNK_BYTES = 256_000


def worker_log(job_id: str, attempt: int, rank: int) -> Path:
    return logs_dir(job_id) / f"attempt-{int(attempt)}-rank-{int(rank)}.log"


def read_output(job_id: str, *, attempt: int, rank: int, offset: int, limit: int = CHUNK_BYTES) -> tuple[bytes, int]:
    """Bytes ``offset`` .. ``offset + limit`` of a worker's log (none yet: empty), and the offset to
    read from next. A log that shrank (rewritten) is read again from its start."""
    path = worker_log(job_id, attempt, rank)
    try:
        with open_regular(path) as f:
            size = f.seek(0, os.SEEK_END)
            start = offset if 0 <= offset <= size else 0
            f.seek(start)
            data = f.read(max(0, min(limit, CHUNK_BYTES)))
    except FileNotFoundError:
        return b"", max(0, offset)
    except UnsafeJobFile:
        return b"", max(0, offset)
    return data, start + len(data)


def install_controller_log(*, level: int = logging.INFO, path: Path | None = None) -> None:
    """The controller's log, one line per thing that happened: every event row (submit, launch,
    release, notice, capacity refusal, state change, ...) as it is written, plus the controller's own
    lines (checkpoints, recovery, tick errors), on stderr or in the file ``path``. The scheduler's own chatter (each run of the
    reconcile job, and its "maximum number of running instances reached" warnings when a tick
    outlasts the interval) is not the user's business: only its errors are kept."""
    from sqlalchemy import event as sa_event

    from autoscaler.state import Event

    fmt = "%(asctime)s %(name)s %(levelname)s %(message)s"
    if path is None:
        logging.basicConfig(level=level, format=fmt)
    else:  # the embedded controller of `spotrain run`: its log is a file, the terminal is the user's
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(fmt))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(level)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    if not sa_event.contains(Event, "after_insert", _log_event):
        sa_event.listen(Event, "after_insert", _log_event)


_events_log = logging.getLogger("spotrain.events")


def _log_event(_mapper: object, _connection: object, e: object) -> None:
    kind = getattr(e, "kind", "")
    what = f"{getattr(e, 'from_state', '')} -> {getattr(e, 'to_state', '')}" if kind == "state" else kind
    _events_log.info("%s %s: %s", getattr(e, "job_id", "?"), what, getattr(e, "reason", ""))
