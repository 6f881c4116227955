"""The owner lease of a local cloud that lives and dies with one process: ``spotrain run`` (issue 24).

``spotrain run`` runs its controller in process over a local cloud of its own. The cloud's "machines"
(one agent per instance and attempt, ``agent.py``) run in sessions of their own, so that Ctrl-C in the
terminal reaches the controller first and it can stop them at a checkpoint. When the command dies
without that clean-up (SIGKILL, the OOM killer, a crash), nothing stopped them: they trained, and the
local cloud billed them, until the next ``spotrain run`` reaped them ($0.39 instead of $0.09 in the
issue's run).

So the owner holds a lease the machines watch. It rewrites ``LEASE_FILE`` in the cloud's directory
every ``lease_s / 4`` seconds: ``{"pid", "pid_start", "lease_s", "seq", "renewed_unix_s"}``. Each agent
started with the lease (``LocalExecutor(owner_lease=...)``) reads it every ``CHECK_EVERY_S`` and counts
its owner gone when

- the recorded process is gone (no such pid, a zombie, or a process started at another time: the pid
  was reused): at once; or
- ``seq`` has not changed for ``lease_s`` seconds of the agent's *monotonic* clock (an owner that hangs
  or was stopped with SIGSTOP / Ctrl-Z). Monotonic, not wall time: a laptop's suspend stops that clock
  for owner and agent alike, so waking up is no expiry.

Then the machine does what a cloud does to a preempted one: it writes the notice file (reason
``preemption``, ``detail: owner-gone``), so the workers stop at the next minibatch boundary, checkpoint
and exit ``EXIT_RESCHEDULE`` (the runtime, and any script that watches its notices, needs nothing new);
``STOP_GRACE_S`` later it kills what still runs; it records when its last rank ended
(``OWNER_GONE_FILE`` in the attempt's directory) and shuts down. The local cloud ends that instance's
bill at that moment (``LocalProvider(stopped_at=...)``), whenever a controller next looks.

Billing after the owner dies is therefore bounded by ``CHECK_EVERY_S + STOP_GRACE_S`` (15.5 s) for a
process that is gone, and by ``lease_s + CHECK_EVERY_S + STOP_GRACE_S`` (25.5 s with the default
``lease_s``) for one that hangs. ``spotrain run`` reads ``lease_s`` from ``SPOTRAIN_RUN_LEASE_S``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..jobfiles import read_small_text

LEASE_FILE = "owner-lease.json"
OWNER_GONE_FILE = "owner-gone.json"
ENV_LEASE_S = "SPOTRAIN_RUN_LEASE_S"
DEFAULT_LEASE_S = 10.0
MIN_LEASE_S, MAX_LEASE_S = 1.0, 3600.0
# Seconds the workers get to reach a minibatch boundary and checkpoint once the owner is gone.
STOP_GRACE_S = 15.0
# How often an agent looks at its owner.
CHECK_EVERY_S = 0.5


def proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat): with the pid it names one
    process, whatever pid reuse happened since. None for no such process, or a zombie (it has exited;
    its parent just has not collected it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def lease_s_from_env(environ: dict[str, str] | None = None) -> float:
    """``SPOTRAIN_RUN_LEASE_S`` as seconds (default ``DEFAULT_LEASE_S``); ``ValueError`` naming the
    variable and its value when it is not a number of seconds in [1, 3600]."""
    raw = (os.environ if environ is None else environ).get(ENV_LEASE_S, "").strip()
    if not raw:
        return DEFAULT_LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not MIN_LEASE_S <= value <= MAX_LEASE_S:
        raise ValueError(f"{ENV_LEASE_S}={raw!r}: expected seconds between {MIN_LEASE_S:g} and {MAX_LEASE_S:g}")
    return value


def _write_atomic(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


class OwnerLease:
    """The owner's side: renews the lease from a daemon thread until ``stop``."""

    def __init__(self, cloud_dir: Path, *, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.path = Path(cloud_dir) / LEASE_FILE
        self.lease_s = float(lease_s)
        self.seq = 0
        self._pid = os.getpid()
        self._start = proc_start(self._pid)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def renew(self) -> None:
        self.seq += 1
        _write_atomic(self.path, {"pid": self._pid, "pid_start": self._start, "lease_s": self.lease_s,
                                  "seq": self.seq, "renewed_unix_s": time.time()})

    def start(self) -> OwnerLease:
        self.renew()
        self._thread = threading.Thread(target=self._loop, name="spotrain-owner-lease", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stopping.wait(self.lease_s / 4):
            try:
                self.renew()
            except OSError:
                pass  # a full disk for a moment: the next renewal retries; the lease covers 4 of them

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None


class OwnerWatch:
    """A machine's side: :meth:`gone` says why the owner counts as gone, or None while it holds."""

    def __init__(self, path: Path, *, lease_s: float, clock: Callable[[], float] = time.monotonic,
                 start_of: Callable[[int], str | None] = proc_start) -> None:
        self.path, self.lease_s, self.clock, self.start_of = Path(path), float(lease_s), clock, start_of
        self._seen: object = None
        self._seen_at = clock()

    def gone(self) -> str | None:
        try:
            body = json.loads(self.path.read_text())
        except (OSError, ValueError):
            body = None
        now = self.clock()
        if isinstance(body, dict):
            pid = body.get("pid")
            if isinstance(pid, int) and pid > 0 and self.start_of(pid) != body.get("pid_start"):
                return f"its owner (pid {pid}) has exited"
            if body.get("seq") != self._seen:
                self._seen, self._seen_at = body.get("seq"), now
        if now - self._seen_at >= self.lease_s:
            who = f"pid {body.get('pid')}" if isinstance(body, dict) else "no lease file"
            return f"its owner ({who}) has not renewed its lease for {self.lease_s:g} s"
        return None


def lease_expiry(path: Path) -> float | None:
    """When the lease in ``path`` ran out (its last renewal + ``lease_s``, wall time) if its owner's
    process is gone; None while it lives, or without a readable lease. What a machine that ran no
    agent when its owner died (waiting for the rest of its gang, say) is billed until."""
    try:
        body = json.loads(Path(path).read_text())
        pid, renewed, lease_s = int(body["pid"]), float(body["renewed_unix_s"]), float(body["lease_s"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if pid > 0 and proc_start(pid) == body.get("pid_start"):
        return None
    return renewed + lease_s


def record_owner_gone(attempt_dir: Path, why: str, *, ended_unix_s: float | None = None) -> None:
    """The agent's record that it shut its machine down for its owner (``ended_unix_s``: when its
    last rank ended; absent while they still run)."""
    body: dict[str, Any] = {"why": why}
    if ended_unix_s is not None:
        body["ended_unix_s"] = ended_unix_s
    _write_atomic(attempt_dir / OWNER_GONE_FILE, body)


def owner_gone_record(attempt_dir: Path) -> dict[str, Any] | None:
    """``record_owner_gone``'s record in ``attempt_dir``, or None."""
    text = read_small_text(attempt_dir / OWNER_GONE_FILE)  # the workers could have replaced it
    try:
        body = json.loads(text) if text else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None
