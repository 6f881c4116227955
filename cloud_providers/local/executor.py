"""Runs a job's workers as local processes, one detached agent per (instance, attempt).

Layout under ``root``::

    instances/<instance_id>/attempt-<n>/agent.json   the agent's config (what to run, where)
    instances/<instance_id>/attempt-<n>/pid          the agent's pid (= its process group)
    instances/<instance_id>/attempt-<n>/notice.json  the notice file the runtime watches
    instances/<instance_id>/attempt-<n>/exit-<rank>  exit code of each rank, as it happens
    instances/<instance_id>/attempt-<n>/done         all ranks of the instance have exited
    instances/<instance_id>/attempt-<n>/owner-gone.json  the agent stopped them: its cloud's owner was gone
    jobs/<job_id>/progress.json                      rank 0's progress report

Everything is in files, so a restarted controller picks up exactly where the last one stopped.

Every file the workers could have replaced (the progress file, the exit records, the pid) is read
with ``jobfiles.py``: without blocking, regular files only, to a size cap (issue 21, finding 1).
``read_progress`` is what the controller calls outside its lock before each tick.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..executor import GangState, WorkerLaunch, WorkerStatus
from ..jobfiles import JobFileReader, read_small_text
from ..protocol import ENV_NOTICE_FILE, ENV_PROGRESS_FILE, ProgressError, ProgressRecord, parse_progress
from .owner import owner_gone_record

log = logging.getLogger("spotrain.local")

# The largest progress file read (rank 0's report is a few kB; its profile grows by ~150 bytes a
# batch configuration). A larger one is refused, not read: the job's progress stays as last seen.
MAX_PROGRESS_BYTES = 1024 * 1024


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, mode 0600: ``agent.json`` holds the job's environment,
    its checkpoint key included (issue 21, finding 9)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class LocalExecutor:
    def __init__(self, root: str | Path, *, owner_lease: Mapping[str, Any] | None = None) -> None:
        """``owner_lease``: ``{"path", "lease_s", "grace_s"}`` of the owner lease its agents watch
        (``owner.py``: the cloud of a ``spotrain run``, whose machines stop when that command is
        gone); None: the workers outlive any controller (a service's cloud)."""
        self.root = Path(root)
        self.owner_lease = dict(owner_lease) if owner_lease is not None else None
        (self.root / "instances").mkdir(parents=True, exist_ok=True)
        (self.root / "jobs").mkdir(parents=True, exist_ok=True)
        self._progress = JobFileReader(max_bytes=MAX_PROGRESS_BYTES)
        self._warned: dict[str, str] = {}

    # ----- paths -----
    def _idir(self, instance_id: str) -> Path:
        return self.root / "instances" / instance_id

    def _adir(self, instance_id: str, attempt: int) -> Path:
        return self._idir(instance_id) / f"attempt-{attempt}"

    def progress_file(self, job_id: str) -> str:
        d = self.root / "jobs" / job_id
        d.mkdir(parents=True, exist_ok=True)
        return str(d / "progress.json")

    # ----- contract -----
    def start(self, launch: WorkerLaunch) -> None:
        adir = self._adir(launch.instance_id, launch.attempt)
        if (adir / "pid").exists():
            return  # idempotent: this attempt was already started on this instance
        adir.mkdir(parents=True, exist_ok=True)
        Path(launch.log_dir).mkdir(parents=True, exist_ok=True)
        env = dict(launch.env)
        env[ENV_NOTICE_FILE] = str(adir / "notice.json")
        env[ENV_PROGRESS_FILE] = self.progress_file(launch.job_id)
        # Loopback gloo needs this on these machines; workers share 2 cores, so one thread each.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        # `python` in the user's command must be the interpreter spotrain runs under.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        # The launch itself (``WorkerLaunch``, which the agent reads back), and where this machine keeps its state.
        cfg = {
            **launch.with_(env=env).model_dump(mode="json"),
            "instance_dir": str(self._idir(launch.instance_id)),
            "attempt_dir": str(adir),
        }
        if self.owner_lease is not None:
            cfg["owner_lease"] = self.owner_lease
        cfg_path = adir / "agent.json"
        _write_atomic(cfg_path, json.dumps(cfg))
        proc = subprocess.Popen(
            [sys.executable, "-m", "cloud_providers.local.agent", str(cfg_path)],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(Path(launch.log_dir) / f"agent-{launch.instance_id}.log", "ab"),
            close_fds=True,
        )
        _write_atomic(adir / "pid", str(proc.pid))

    def _agent_alive(self, adir: Path) -> int | None:
        try:
            pid = int(read_small_text(adir / "pid") or "")
        except ValueError:
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        # Guard against pid reuse: the process must be our agent for this very attempt.
        if str(adir / "agent.json").encode() not in cmdline:
            return None
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return None
        except OSError:
            return None
        return pid

    def status(self, instance_id: str, attempt: int) -> WorkerStatus:
        adir = self._adir(instance_id, attempt)
        if not (adir / "pid").exists():
            return WorkerStatus(GangState.ABSENT)
        codes: dict[int, int] = {}
        for f in adir.glob("exit-*"):
            if f.name.endswith(".tmp"):
                continue
            try:
                codes[int(f.name.split("-", 1)[1])] = int(read_small_text(f) or "")
            except ValueError:
                continue
        if (adir / "done").exists():
            self._reap(adir)
            return WorkerStatus(GangState.EXITED, codes)
        if self._agent_alive(adir) is not None:
            return WorkerStatus(GangState.RUNNING, codes)
        # The agent may have just finished: look once more for its completion record.
        if (adir / "done").exists():
            return WorkerStatus(GangState.EXITED, codes)
        return WorkerStatus(GangState.LOST, codes)

    @staticmethod
    def _reap(adir: Path) -> None:
        """Collect a finished agent's exit status if this process started it (no zombies left)."""
        try:
            pid = int(read_small_text(adir / "pid") or "")
            os.waitpid(pid, os.WNOHANG)
        except (OSError, ValueError, ChildProcessError):
            pass

    def _latest_attempt_dir(self, instance_id: str) -> Path | None:
        idir = self._idir(instance_id)
        attempts = sorted(
            (int(p.name.split("-", 1)[1]), p) for p in idir.glob("attempt-*") if p.name.split("-", 1)[1].isdigit()
        )
        return attempts[-1][1] if attempts else None

    def stopped_at(self, instance_id: str) -> float | None:
        """The wall time the instance's machine shut itself down because the owner of its cloud was
        gone (``owner.py``: when its last rank ended); None while it runs, or if it never did."""
        adir = self._latest_attempt_dir(instance_id)
        if adir is None or not (adir / "done").exists():
            return None
        record = owner_gone_record(adir)
        ended = record.get("ended_unix_s") if record else None
        return float(ended) if isinstance(ended, (int, float)) and not isinstance(ended, bool) else None

    def agent_running(self, instance_id: str) -> bool:
        """Whether the instance's latest attempt still has its agent running (its workers, or a setup)."""
        adir = self._latest_attempt_dir(instance_id)
        return adir is not None and not (adir / "done").exists() and self._agent_alive(adir) is not None

    def notify(self, instance_id: str, notice: Mapping[str, Any]) -> None:
        adir = self._latest_attempt_dir(instance_id)
        if adir is None or (adir / "done").exists():
            return
        if not (adir / "notice.json").exists():
            _write_atomic(adir / "notice.json", json.dumps(dict(notice)))

    def stop(self, instance_id: str) -> None:
        idir = self._idir(instance_id)
        for adir in idir.glob("attempt-*"):
            pids = self._processes_of(adir)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
            # Reap the agent if this process started it, so it does not linger as a zombie.
            for pid in pids:
                for _ in range(50):
                    try:
                        done, _ = os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if done:
                        break
                    time.sleep(0.01)

    def _processes_of(self, adir: Path) -> list[int]:
        """Every live process of an attempt: its agent and the agent's workers, found in /proc.

        Found by what they carry, not only by the recorded pid: the agent may have died and left its
        ranks running, or the controller may have crashed between starting the agent and recording its
        pid. A worker is recognised by its notice-file path in its environment (unique per attempt), the
        agent by its config path on its command line.
        """
        config = str(adir / "agent.json").encode()
        notice = f"{ENV_NOTICE_FILE}={adir / 'notice.json'}".encode()
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                if config in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
                    continue
                if notice in (p / "environ").read_bytes().split(b"\0"):
                    out.append(int(p.name))
            except OSError:
                continue
        return out

    def rendezvous(self, instance_id: str) -> tuple[str, int]:
        # Every local instance is this machine: rank 0 listens on loopback.
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return "127.0.0.1", int(sock.getsockname()[1])

    def progress(self, job_id: str) -> ProgressRecord | None:
        """Rank 0's last report: its progress file, read without blocking (a FIFO, a device, a link or a
        file over ``MAX_PROGRESS_BYTES`` is refused and logged once), and not again while unchanged. A
        body that is not a progress record (``protocol.parse_progress``) is ignored the same way."""
        path = self.progress_file(job_id)
        data = self._progress.read_json(path)
        problem = self._progress.problem(path)
        record: ProgressRecord | None = None
        if isinstance(data, dict):
            try:
                record = parse_progress(data)
            except ProgressError as exc:
                problem = str(exc)
        if problem is not None and self._warned.get(job_id) != problem:
            self._warned[job_id] = problem
            log.warning("job %s: progress file ignored: %s", job_id, problem)
        return record

    def read_progress(self, job_ids: list[str]) -> dict[str, ProgressRecord | None]:
        """Every listed job's report (``progress``), for the controller to read before it takes its lock."""
        return {job_id: self.progress(job_id) for job_id in job_ids}
