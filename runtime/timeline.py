"""The timeline: a JSON-lines log of the moments that make up a changeover, written by rank 0.

A preemption costs the time from the notice until training runs again on the replacement workers
(the restart overhead of the policy's model, DESIGN.md). To make that figure measurable part by
part, rank 0 appends one line per moment, with wall-clock time so that lines from the old and the
new process compare directly::

    {"event": "notice_seen", "t_unix_s": ..., "attempt": 1, "pid": ..., "step": 41, ...}

Events: ``process_start`` (from ``/proc``: when the interpreter started, before any import),
``trainer_init``, ``restore_done`` (with ``restore_s``, ``step``), ``first_step``, ``notice_seen``,
``boundary`` (every rank agreed to stop here), ``snapshot_done`` (``stall_s``), ``durable``
(``persist_s``) and ``exiting`` (``code``). ``benchmarks/changeover.py`` reads them beside the local
cloud's own files. A line is one ``write`` on an ``O_APPEND`` descriptor and is never fsynced: the
log is a measurement, not state, and must cost nothing on the training path.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def process_start_unix_s() -> float | None:
    """When this process started (Linux ``/proc``, 10 ms resolution), or None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Timeline:
    """Appends events to ``path`` (no-op when ``path`` is None, e.g. on ranks other than 0)."""

    def __init__(self, path: str | None, *, attempt: int) -> None:
        self.path = path
        self.attempt = attempt
        self.seen: set[str] = set()

    def mark(self, event: str, *, once: bool = False, t_unix_s: float | None = None, **fields: Any) -> None:
        if once and event in self.seen:
            return
        self.seen.add(event)
        if self.path is None:
            return
        line = {"event": event, "t_unix_s": time.time() if t_unix_s is None else t_unix_s,
                "attempt": self.attempt, "pid": os.getpid(), **fields}
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            self.path = None  # a measurement must never stop training


def read_timeline(path: str) -> list[dict[str, Any]]:
    """The events in ``path`` (a torn last line, if any, is skipped)."""
    events = []
    try:
        with open(path) as f:
            for raw in f:
                try:
                    events.append(json.loads(raw))
                except ValueError:
                    continue
    except FileNotFoundError:
        return []
    return events
