"""Following a job to its end: ``spotrain attach``, ``logs -f``, ``status --watch`` and ``spotrain run``.

A *source* answers three questions about one job, however it is reached: its summary now, its events
after the first N, and its workers' output after a byte offset. ``HttpSource`` asks a controller over
its API (the controller that runs the job, wherever its workers are); ``LocalSource`` asks the
embedded controller of ``spotrain run`` in process. ``follow`` polls a source and hands what is new
to a view (``progress.py``) until the job ends.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any, Protocol

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET"}
# Event kinds a progress view shows (``logs -f`` shows every event).
SHOWN_EVENTS = ("state", "preemption-notice", "launched", "capacity", "released", "instance-terminated", "resumed", "moved")


class Source(Protocol):
    def job(self) -> dict[str, Any]: ...

    def events(self) -> list[Any]: ...

    def output(self, attempt: int, rank: int, offset: int) -> tuple[bytes, int]: ...


class HttpSource:
    def __init__(self, client: Any, ref: str) -> None:
        self.client, self.ref = client, ref

    def job(self) -> dict[str, Any]:
        return dict(self.client.job(self.ref).to_json_dict())

    def events(self) -> list[Any]:
        return list(self.client.events(self.ref))

    def output(self, attempt: int, rank: int, offset: int) -> tuple[bytes, int]:
        data, nxt = self.client.output(self.ref, attempt=attempt, rank=rank, offset=offset)
        return data, nxt


class LocalSource:
    """The embedded controller of ``spotrain run``."""

    def __init__(self, ctl: Any, job_id: str) -> None:
        self.ctl, self.job_id = ctl, job_id

    def job(self) -> dict[str, Any]:
        return dict(self.ctl.job_info(self.job_id))

    def events(self) -> list[Any]:
        with self.ctl.store.session() as s:
            return list(self.ctl.store.events(s, self.job_id))

    def output(self, attempt: int, rank: int, offset: int) -> tuple[bytes, int]:
        from autoscaler.client.logs import read_output

        return read_output(self.job_id, attempt=attempt, rank=rank, offset=offset)


class Follower:
    """What has been shown so far of one job: events, and each attempt's output offset."""

    def __init__(self, source: Source, view: Any, *, all_events: bool = False, rank: int | None = None,
                 out: IO[str] | None = None) -> None:
        self.source, self.view, self.all_events = source, view, all_events
        self.rank = rank  # None: no worker output
        self.out = out or sys.stdout
        self.seen_events = 0
        self.offsets: dict[int, int] = {}

    def poll(self) -> dict[str, Any]:
        """Show what is new; the job's summary."""
        job = self.source.job()
        events = self.source.events()
        for e in events[self.seen_events:]:
            if self.all_events or e.kind in SHOWN_EVENTS:
                what = f"{e.from_state} -> {e.to_state}" if e.kind == "state" else e.kind
                self.view.event(job["job_id"], e.ts, what, e.reason)
        self.seen_events = len(events)
        if self.rank is not None:
            self._output(int(job.get("attempts") or 0))
        self.view.job(job)
        return job

    def _output(self, attempts: int) -> None:
        for attempt in range(1, attempts + 1):
            while True:
                offset = self.offsets.get(attempt, 0)
                data, nxt = self.source.output(attempt, self.rank or 0, offset)
                self.offsets[attempt] = nxt
                if data:
                    self.out.write(data.decode(errors="replace"))
                    self.out.flush()
                if not data or nxt <= offset:
                    break


def follow(follower: Follower, *, interval_s: float = 0.5, stop: Callable[[dict[str, Any]], bool] | None = None
           ) -> dict[str, Any]:
    """Poll until the job ends (or ``stop(job)``); the last summary. A final poll after the end
    shows the last events and output."""
    while True:
        job = follower.poll()
        if job["state"] in TERMINAL or (stop is not None and stop(job)):
            time.sleep(min(interval_s, 0.3))
            return follower.poll()
        time.sleep(interval_s)


def service_client() -> Any | None:
    """A client of the started controller service (not an embedded ``spotrain run``'s), or None when
    none answers."""
    from autoscaler.client.http import Client

    from ..errors import ControllerUnreachable
    from ..home import live_controller_info

    info = live_controller_info()
    if info is None or info.get("embedded"):
        return None
    c = Client()
    try:
        c.healthz()
    except ControllerUnreachable:
        return None
    return c


def any_client() -> Any:
    """A client of whatever controller is recorded (a service, or a running ``spotrain run``)."""
    from autoscaler.client.http import Client

    return Client()


def follow_logs(job_ref: str, rank: int | None) -> None:
    """``spotrain logs -f``: every event and rank ``rank``'s output (default 0), as they come."""
    client = any_client()
    view = _EventsOnly(sys.stdout)
    final = follow(Follower(HttpSource(client, job_ref), view, all_events=True, rank=rank or 0))
    print(f"== {final['job_id']} ended: {final['state']}", flush=True)


class _EventsOnly:
    """``logs -f``'s view: event lines with the time of day, no progress line."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def event(self, job_id: str, ts: float, what: str, reason: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(ts))
        print(f"{stamp}  {what:28s} {reason}", file=self.out, flush=True)

    def job(self, j: dict[str, Any]) -> None:
        pass


def watch_status(job_ref: str | None, *, interval_s: float = 2.0, states: list[str] | None = None,
                 all_jobs: bool = False) -> None:
    """``spotrain status --watch``: the table (or one job's line) redrawn until Ctrl-C, or until the
    job ends when one is named; the jobs ``status`` lists (``states``, ``all_jobs``: its filters)."""
    from . import render
    from .render import RECENT_ENDED

    client = any_client()
    tty = sys.stdout.isatty()
    while True:
        if job_ref:
            jobs = [client.job_json(job_ref)]
        elif all_jobs:
            jobs = client.jobs_json("all" if states is None else ",".join(states))
        else:
            jobs = client.recent_jobs_json(RECENT_ENDED, states)
        text = render.table(jobs, render.terminal_width()) if jobs else "no jobs"
        if tty:
            print("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S  ") + "spotrain status --watch (Ctrl-C to stop)\n" + text,
                  flush=True)
        else:
            print(text + "\n", flush=True)
        if job_ref and jobs[0]["state"] in TERMINAL:
            return
        time.sleep(interval_s)
