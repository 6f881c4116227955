"""Running one instance's share of a gang: ``Gang`` (shared), and the local instance agent.

``Gang`` is how spotrain starts a job's workers on a machine, wherever that machine is: it runs the job's
``setup`` once per instance (a marker file remembers it), then one ``bash -c <run>`` per local rank (the
user's own command, given as one argument, never spliced into another shell string) with the worker
protocol's environment, and collects each rank's exit code as it happens. It never blocks, so an agent
can keep talking to its controller while a long ``setup`` runs. Two agents use it:

- the local agent below: one detached process per (instance, attempt), started by ``LocalExecutor`` in
  a new session, so the workers outlive the controller (a controller crash must not kill training) and
  the whole "machine" can be killed at once with ``killpg``. It forwards SIGTERM to the ranks (a
  notice source of the runtime) and records each rank's exit code in a file. The machines of a
  ``spotrain run``'s own cloud also watch that command's owner lease (``owner.py``): once it is gone,
  they stop their ranks at a checkpoint and shut down, so a killed ``run`` stops training and billing;
- the instance agent on a real cloud machine (``cloud_providers/remote/agent.py``), which puts the
  ranks in a process group of their own so that a stop order kills them (and anything they spawned)
  without killing the agent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from ..launch import WorkerLaunch
from ..protocol import NOTICE_PREEMPTION
from .owner import CHECK_EVERY_S, STOP_GRACE_S, OwnerWatch, record_owner_gone

PHASE_IDLE = "idle"
PHASE_SETUP = "setup"
PHASE_RUNNING = "running"
PHASE_EXITED = "exited"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def exit_code(rc: int) -> int:
    """Popen's return code as a shell reports it (128+N for signal N)."""
    return 128 - rc if rc < 0 else rc


class Gang:
    """The ranks of one gang attempt on one machine: setup once, then one process per local rank.

    ``launch`` as this machine runs it: ``env`` is the ranks' whole base environment (the caller decides
    what it inherits; the rank variables are added per rank), ``cwd`` where they run and ``log_dir``
    where their logs go. ``setup_marker`` remembers that this machine ran the job's setup, whose output
    goes to ``setup_log``. With ``own_process_group``, the ranks (and setup) run in process groups of
    their own, so ``kill`` reaches their children too.
    """

    def __init__(self, launch: WorkerLaunch, *, setup_marker: Path, setup_log: Path,
                 own_process_group: bool = False) -> None:
        self.launch = launch
        self.log_dir = Path(launch.log_dir)
        self.setup_marker = setup_marker
        self.setup_log = setup_log
        self.own_process_group = own_process_group
        self.phase = PHASE_IDLE
        self.exit_codes: dict[int, int] = {}
        self.setup_failed = False
        self._setup: subprocess.Popen[bytes] | None = None
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._pgid: int | None = None

    # ----- starting -----
    def _popen(self, argv: list[str], env: Mapping[str, str], log: IO[bytes], *, group: int | None) -> subprocess.Popen[bytes]:
        # process_group=0 makes a new group led by the child; None leaves it in the caller's group.
        pgroup = (0 if group is None else group) if self.own_process_group else None
        return subprocess.Popen(argv, cwd=self.launch.cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, process_group=pgroup)

    def start(self) -> None:
        """Start the setup (if this machine has not run it yet) or the ranks. Never blocks."""
        if self.phase != PHASE_IDLE:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.launch.setup and not self.setup_marker.exists():
            self.setup_log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.setup_log, "ab") as log:
                self._setup = self._popen(["bash", "-c", self.launch.setup], self.launch.env, log, group=None)
            self.phase = PHASE_SETUP
            return
        self._start_ranks()

    def _start_ranks(self) -> None:
        la = self.launch
        group: int | None = None
        for local, r in enumerate(la.ranks):
            env = {
                **la.env,
                "RANK": str(r),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(len(la.ranks)),
                "WORLD_SIZE": str(la.world_size),
                "MASTER_ADDR": la.master_addr,
                "MASTER_PORT": str(la.master_port),
            }
            with open(self.log_dir / f"attempt-{la.attempt}-rank-{r}.log", "ab") as log:
                proc = self._popen(["bash", "-c", la.run], env, log, group=group)
            self._children[r] = proc
            if self.own_process_group and group is None:
                group = self._pgid = proc.pid
        self.phase = PHASE_RUNNING

    def fail(self, code: int) -> None:
        """Record that the ranks could not be started at all (every rank exits with ``code``)."""
        self.kill()
        self.exit_codes = {r: code for r in self.launch.ranks}
        self.phase = PHASE_EXITED

    # ----- watching -----
    def poll(self) -> bool:
        """Advance (setup finished -> start the ranks; record exits). True once every rank has exited."""
        if self.phase == PHASE_SETUP and self._setup is not None:
            rc = self._setup.poll()
            if rc is None:
                return False
            self._setup = None
            if rc != 0:
                self.setup_failed = True
                self.exit_codes = {r: exit_code(rc) for r in self.launch.ranks}
                self.phase = PHASE_EXITED
                return True
            self.setup_marker.parent.mkdir(parents=True, exist_ok=True)
            self.setup_marker.write_text("ok")
            self._start_ranks()
        if self.phase == PHASE_RUNNING:
            for r, p in self._children.items():
                if r not in self.exit_codes:
                    rc = p.poll()
                    if rc is not None:
                        self.exit_codes[r] = exit_code(rc)
            if len(self.exit_codes) == len(self._children):
                self.phase = PHASE_EXITED
        return self.phase == PHASE_EXITED

    # ----- signalling -----
    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to every running rank (SIGTERM is a notice source of the runtime)."""
        for p in self._children.values():
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    def kill(self, *, timeout_s: float = 10.0) -> None:
        """SIGKILL the setup and every rank (their whole process groups when they have their own) and
        wait for them, so a port or a GPU they held is free when this returns."""
        procs = [p for p in [self._setup, *self._children.values()] if p is not None]
        groups = {self._pgid} if self._pgid else set()
        if self._setup is not None and self.own_process_group:
            groups.add(self._setup.pid)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._setup = None
        self.poll()
        for r in self.launch.ranks:
            self.exit_codes.setdefault(r, exit_code(-signal.SIGKILL))
        self.phase = PHASE_EXITED


def main(config_path: str) -> int:
    """The local agent: run one (instance, attempt) to the end, recording exits in files."""
    cfg = json.loads(Path(config_path).read_text())
    adir = Path(cfg["attempt_dir"])
    launch = WorkerLaunch.model_validate(cfg)
    gang = Gang(
        launch.with_(env={**os.environ, **launch.env}),
        setup_marker=Path(cfg["instance_dir"]) / "setup.done",
        setup_log=Path(launch.log_dir) / f"setup-{launch.instance_id}.log",
    )
    signal.signal(signal.SIGTERM, lambda signum, _frame: gang.send_signal(signum))
    guard = OwnerGuard.from_config(cfg.get("owner_lease"), adir)
    gang.start()
    written: set[int] = set()
    while True:
        done = gang.poll()
        for r, code in gang.exit_codes.items():
            if r not in written:
                _write_atomic(adir / f"exit-{r}", str(code))
                written.add(r)
        if done:
            break
        if guard is not None:
            guard.step(gang)
        time.sleep(0.05)
    if guard is not None:
        guard.ended()
    _write_atomic(adir / "done", "setup failed" if gang.setup_failed else "ok")
    return 0


class OwnerGuard:
    """The local agent's watch on the owner of its cloud (``owner.py``): when the owner is gone, the
    ranks get a stop notice, ``grace_s`` to checkpoint and exit, and are killed after that."""

    def __init__(self, watch: OwnerWatch, attempt_dir: Path, grace_s: float) -> None:
        self.watch, self.adir, self.grace_s = watch, attempt_dir, grace_s
        self.why: str | None = None
        self._next_check = 0.0
        self._kill_at = 0.0

    @staticmethod
    def from_config(cfg: object, attempt_dir: Path) -> OwnerGuard | None:
        """From the agent config's ``owner_lease`` (``{"path", "lease_s", "grace_s"}``); None without one."""
        if not isinstance(cfg, dict):
            return None
        watch = OwnerWatch(Path(str(cfg["path"])), lease_s=float(cfg["lease_s"]))
        return OwnerGuard(watch, attempt_dir, float(cfg.get("grace_s", STOP_GRACE_S)))

    def step(self, gang: Gang) -> None:
        now = time.monotonic()
        if self.why is None:
            if now < self._next_check:
                return
            self._next_check = now + CHECK_EVERY_S
            self.why = self.watch.gone()
            if self.why is None:
                return
            record_owner_gone(self.adir, self.why)
            notice = self.adir / "notice.json"
            if not notice.exists():
                _write_atomic(notice, json.dumps({"reason": NOTICE_PREEMPTION, "deadline_unix_s": time.time() + self.grace_s,
                                                  "detail": f"owner-gone: {self.why}"}))
            # Still in setup: there is nothing to checkpoint, so nothing to wait for.
            self._kill_at = now + (self.grace_s if gang.phase == PHASE_RUNNING else 0.0)
        if now >= self._kill_at:
            gang.kill()

    def ended(self) -> None:
        """Every rank has ended: record when, which is when this machine's bill ends."""
        if self.why is not None:
            record_owner_gone(self.adir, self.why, ended_unix_s=time.time())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
