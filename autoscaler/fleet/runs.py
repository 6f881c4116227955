"""The jobs of ``spotrain run``: who owns them, and what becomes of them once that command is gone.

A ``spotrain run`` is a controller embedded in one command, over a local cloud of its own whose id
(``run-<8 hex>``) is also its jobs' ``controller_id``. Its owner file (``localcloud/<id>/owner.json``:
pid, process start, host and the URL of its API) says whether it still runs, and its owner lease
(``cloud_providers/local/owner.py``) makes its machines stop at a checkpoint, and stop billing, on
their own once it is gone (issue 24).

What it leaves in the database is settled by the next command that comes by: ``spotrain run`` and
``controller start`` (every abandoned run, ``reap_abandoned_runs``), ``resume`` (the job it resumes)
and ``cancel`` (the job it cancels, ``cancel_abandoned``). Settling one run:

1. claims it: takes the lease named by the run's id (``state/lease.py``, as a fleet's controllers
   do), so that two commands never settle one run at once (the second one leaves it), and fences
   every commit it makes on that claim;
2. reopens its local cloud, lets machines still stopping on their own finish their checkpoint (not
   for ``cancel``), and polls it: a machine that shut itself down is terminated at the moment it
   did, one that ran no agent when the run died at the run's lease expiry, so bills end there, not now;
3. observes the gang as its controller would have (progress, exit codes): a job whose workers
   finished meanwhile ends as it ended;
4. ends the rest: FAILED, which ``spotrain resume`` continues from the checkpoint its workers wrote,
   or CANCELLED for ``cancel``; whatever still runs is stopped.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloud_providers.local.owner import proc_start

from ..home import fleet_dir, home

if TYPE_CHECKING:
    from ..state import Store

OWNER_FILE = "owner.json"
RUN_PREFIX = "run-"
# A run whose owner file is missing (written right after its cloud starts) counts as abandoned only
# once its job is this old: a run starting at the same moment is not mistaken for a dead one.
OWNER_GRACE_S = 60.0
# How long a claim on a dead run lasts unrenewed; a claimant that dies is replaced at once anyway (the
# lease's shortcut for a holder process on this machine that is gone).
CLAIM_TTL_S = 60.0


def is_run(controller_id: str) -> bool:
    return controller_id.startswith(RUN_PREFIX)


def cloud_dir(cloud_id: str) -> Path:
    return fleet_dir() / "localcloud" / cloud_id


def write_owner(directory: Path, **extra: str) -> None:
    """Record this process as the owner of the cloud in ``directory`` (``extra``: e.g. its API's ``url``)."""
    pid = os.getpid()
    body = {"pid": pid, "start": proc_start(pid), "host": socket.gethostname(), **extra}
    tmp = directory / f".{OWNER_FILE}.tmp-{pid}"
    tmp.write_text(json.dumps(body))
    os.replace(tmp, directory / OWNER_FILE)


def owner_info(cloud_id: str) -> dict[str, Any] | None:
    try:
        info = json.loads((cloud_dir(cloud_id) / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def owner_alive(cloud_id: str) -> bool | None:
    """True/False for a recorded owner, None when none was recorded. An owner on another machine
    (a shared ``SPOTRAIN_FLEET_DIR``) cannot be judged from here: it counts as alive."""
    info = owner_info(cloud_id)
    if info is None:
        return None
    if info.get("host", socket.gethostname()) != socket.gethostname():
        return True
    pid = info.get("pid")
    start = proc_start(pid) if isinstance(pid, int) and pid > 0 else None
    return start is not None and start == info.get("start")


def owner_gone(cloud_id: str, submitted_at: float) -> bool:
    """Whether the ``spotrain run`` that owns a live job submitted at ``submitted_at`` is gone."""
    alive = owner_alive(cloud_id)
    return alive is False or (alive is None and time.time() - submitted_at >= OWNER_GRACE_S)


def note_abandoned(summary: dict[str, Any], controller_id: str, submitted_at: float) -> None:
    """Say in ``summary`` (``status`` from the database) that a live job's ``spotrain run`` is gone,
    what its workers do about it and what the user can do."""
    from cloud_providers.local.owner import CHECK_EVERY_S, STOP_GRACE_S

    if summary.get("state") in _ENDED or not is_run(controller_id) or not owner_gone(controller_id, submitted_at):
        return
    job_id = summary.get("job_id")
    summary["reason"] = (f"its spotrain run was killed: its workers stop at a checkpoint on their own (within "
                         f"{CHECK_EVERY_S + STOP_GRACE_S:g} s) and their bill ends then; continue it with "
                         f"`spotrain resume {job_id}`, or end it with `spotrain cancel {job_id}`")


# The ended states (``jobs.domain.TERMINAL``, not imported: ``status`` stays light).
_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET")


def reap_abandoned_runs(store: Store) -> list[str]:
    """Settle the live jobs of every ``spotrain run`` that is gone (see the module doc); their ids."""
    with store.session() as s:
        stale = [(j.job_id, j.controller_id) for j in store.jobs(s, live_only=True)
                 if is_run(j.controller_id) and owner_gone(j.controller_id, j.submitted_at)]
    by_run: dict[str, list[str]] = {}
    for job_id, cid in stale:
        by_run.setdefault(cid, []).append(job_id)
    reaped: list[str] = []
    for cid, job_ids in by_run.items():
        reaped.extend(_settle(store, cid, job_ids, cancel=False))
    return reaped


def settle_if_abandoned(store: Store, ref: str) -> None:
    """Settle job ``ref`` if it is a live job of a ``spotrain run`` that is gone (``resume``)."""
    with store.session() as s:
        job = store.job(s, ref)
        found = None if job is None else (job.job_id, job.controller_id, job.submitted_at, job.state)
    if found is None:
        return
    job_id, cid, submitted_at, state = found
    from autoscaler.jobs.domain import JobState

    if not JobState(state).terminal and is_run(cid) and owner_gone(cid, submitted_at):
        _settle(store, cid, [job_id], cancel=False)


def cancel_abandoned(store: Store, job_id: str, controller_id: str) -> dict[str, Any] | None:
    """Cancel a live job of a ``spotrain run`` that is gone, in the database, stopping whatever of it
    still runs; its summary, or None when another command holds the run's claim right now."""
    done = _settle(store, controller_id, [job_id], cancel=True)
    return done.get(job_id) if done else None


def _settle(store: Store, cid: str, job_ids: list[str], *, cancel: bool) -> dict[str, dict[str, Any]]:
    """Settle the listed jobs of dead run ``cid`` under a claim on it (the module doc's steps);
    each settled job's summary (empty: another command holds the claim)."""
    from sqlalchemy import event

    from autoscaler.fleet.clouds import local_cloud

    from ..controller import Controller
    from ..jobs.domain import JobState
    from ..policy import get_policy
    from ..state import Job
    from ..state.lease import Holder, LeaderLease

    claim = LeaderLease(store.engine, cid, Holder.here(str(home())), ttl_s=CLAIM_TTL_S)
    if claim.step() != "acquired":
        return {}
    # Every commit this thread makes meanwhile is fenced on the claim. Not a second Store: opening the
    # SQLite file again in a process that holds it open would drop that process's locks on it (POSIX
    # locks end with any close of the file), and a service calls this beside its own sessions.
    sessions, me = store._sessions, threading.get_ident()  # noqa: SLF001 - the store's own sessionmaker

    def fence(s: Any) -> None:
        if threading.get_ident() == me:
            claim.fence(s)

    event.listen(sessions, "before_commit", fence)
    out: dict[str, dict[str, Any]] = {}
    try:
        setup = local_cloud(cid)
        if not cancel:
            _let_machines_checkpoint(setup)
        ctl = Controller(store=store, provider=setup.provider, executor=setup.executor, policy=get_policy(),
                         controller_id=cid, tick_s=1.0, clock_rate=setup.clock_rate)
        for job_id in job_ids:
            with store.session() as s:
                job = s.get(Job, job_id)
                live = job is not None and job.controller_id == cid and not JobState(job.state).terminal
            if not live:
                continue  # settled by another command before this one took the claim
            why = ctl.observe_abandoned(job_id)
            if cancel:
                out[job_id] = ctl.cancel(job_id)
            else:
                out[job_id] = ctl.fail_abandoned(job_id, why) if why is not None else ctl.job_info(job_id)
        for inst in setup.provider.list_instances({}):
            if inst.alive:  # launched for a job that has ended since: it must not bill on
                setup.provider.terminate(inst.instance_id)
    finally:
        event.remove(sessions, "before_commit", fence)
        claim.release()
    return out


def _let_machines_checkpoint(setup: Any) -> None:
    """Wait (at most as long as they take, ``CHECK_EVERY_S + STOP_GRACE_S``) for machines of the dead
    run still stopping on their own: their workers are writing the checkpoint ``resume`` continues
    from, and stopping them now would lose it (``cancel`` does not wait: it stops them)."""
    from cloud_providers.local.owner import CHECK_EVERY_S, STOP_GRACE_S

    running = getattr(setup.executor, "agent_running", None)
    if running is None:
        return
    deadline = time.monotonic() + CHECK_EVERY_S + STOP_GRACE_S + 1.0
    while time.monotonic() < deadline and any(running(i.instance_id) for i in setup.provider.list_instances({})
                                              if i.alive):
        time.sleep(0.2)
