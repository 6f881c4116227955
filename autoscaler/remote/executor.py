"""The remote executor: workers on real cloud instances, run by each instance's own agent.

The controller cannot start processes on an EC2 machine; the instance's agent
(``cloud_providers/remote/agent.py``) does, and it talks to the controller over HTTP
(``autoscaler/remote/endpoints.py``). This executor is the controller's side of that conversation, kept in
the controller's database so that a restarted controller carries on where the last one stopped:

- ``start`` stores the attempt's assignment for the instance (``agent_assignments``);
- ``status`` reads the instance's latest agent report (``agent_reports``); an agent silent for more
  than ``lost_after_s`` counts as LOST. Silence is measured on this controller's monotonic clock, from
  the moment it last saw the instance's report or assignment change (or first looked, so a controller
  restart or takeover does not make every agent look dead), never by comparing wall times: a step of
  the wall clock neither makes healthy agents LOST nor hides a dead one (issue 21, finding 8). The
  wall times in the tables are for display;
- ``notify`` stores a directive for the running attempt, ``stop`` orders the agent to kill its workers;
- ``progress`` is rank 0's last progress as its agent relayed it (``agent_progress``);
- ``rendezvous`` is the first member's private address, as its agent reported it or else as the cloud
  does (``Instance.address``), and a fixed port (the security group must allow it between instances).

``AgentGatedProvider`` wraps the cloud's provider so that the controller's view of an instance includes
what its agent says: an instance is not RUNNING (ready for a gang) until its agent has checked in, and a
spot notice the agent read from the instance metadata makes it NOTICE even before the cloud's API shows
one. An instance whose agent never checks in within ``boot_timeout_s`` is terminated (its boot failed).

Storage: the tables are the controller's (``state/models.py``), in an engine of the executor's own.
The controller calls ``notify`` and ``stop`` in the middle of a tick whose session already holds
SQLite's single write lock, so with SQLite the agent tables live in a sibling file
(``spotrain-agents.db`` beside ``spotrain.db``); with a server database (PostgreSQL, ...) they share the
controller's URL, since row locks on other tables do not conflict.

Workdir: ``start`` has the job's workdir shipped (``jobs/workdir.py``: a content-hashed archive in the job's
store, once per job and controller), on a thread of its own (``remote/shipper.py``: never on the
tick's); the agent gets its launch once the archive is in the store, with its URI and hash, which it verifies;
a workdir that cannot be shipped (too large, a link out of it) reaches the agent as an error it fails
the ranks with, so the job fails with that one line. TLS: with ``spotrain controller start --executor
remote`` the agents' endpoints are served apart, over HTTPS (``remote/listener.py``), and
``served_apart`` keeps them off the plain-HTTP user API.

Agent credentials (``remote/auth.py``): one agent key per fleet (``agent-token`` in SPOTRAIN_FLEET_DIR,
shared by a leader and its standbys, mode 0600); each instance gets ``<decision_id>:<HMAC(key,
decision_id)>`` in its user data, so a leaked user data exposes one instance's agent, never the key or
the user API. The agent signs each request with it and a counter the controller takes once
(``accept_seq``), so a replayed request is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import CursorResult, select, update
from sqlalchemy.engine.url import make_url
from sqlalchemy.exc import IntegrityError

from autoscaler.errors import SpotrainError
from autoscaler.home import logs_dir
from autoscaler.jobs import log_cap
from autoscaler.remote.auth import agent_credential, agent_token_path, decision_of, ensure_agent_token
from autoscaler.remote.shipper import WorkdirShipper, is_pending
from autoscaler.state import InstanceRow, Store
from autoscaler.state.migrate import AGENTS
from autoscaler.state.models import AgentAssignment, AgentProgress, AgentReport, AgentSeq
from autoscaler.state.store import Database
from cloud_providers.base import Billing, Instance, InstanceState, LaunchRequest, Offering, Provider
from cloud_providers.errors import ProviderError
from cloud_providers.executor import GangState, WorkerLaunch, WorkerStatus
from cloud_providers.protocol import ENV_CHECKPOINT_URI, ProgressError, ProgressRecord, parse_progress
from cloud_providers.remote.wire import (
    STATE_EXITED,
    STATE_IDLE,
    STATE_STOPPED,
    Assignment,
    OutputChunk,
    Report,
    WireError,
    launch_from_json,
    launch_to_json,
)

log = logging.getLogger("spotrain.remote")

DEFAULT_MASTER_PORT = 29500


# ----- bounds on an agent's report (issue 14, finding 1) -------------------------------------------
# An agent's report is untrusted input: the numbers it carries go into the database (SQLite integers
# are 64-bit) and into the controller's arithmetic, so they are refused unless finite and in range.
MAX_ATTEMPT = 2**31 - 1
MAX_RANK = 2**20
MAX_NUMBER = 2**53
MAX_DEPTH = 8
MAX_STRING = 4096
MAX_OBJECT_BYTES = 64 * 1024


def _check_values(value: Any, where: str) -> None:
    """Every number in ``value`` finite and within +-MAX_NUMBER, strings short, nesting shallow."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        v, at, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise WireError(f"{at}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            if not -MAX_NUMBER <= v <= MAX_NUMBER:
                raise WireError(f"{at}: {v.bit_length()}-bit integer out of range (at most {MAX_NUMBER})")
        elif isinstance(v, float):
            if not math.isfinite(v) or abs(v) > MAX_NUMBER:
                raise WireError(f"{at}: {v!r} is not a finite number in range")
        elif isinstance(v, str):
            if len(v) > MAX_STRING:
                raise WireError(f"{at}: a string of {len(v)} characters is too long (at most {MAX_STRING})")
        elif isinstance(v, Mapping):
            stack.extend((item, f"{at}.{str(k)[:64]}", depth + 1) for k, item in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((item, f"{at}[{i}]", depth + 1) for i, item in enumerate(v))
        else:
            raise WireError(f"{at}: {type(v).__name__} is not a JSON value")


def check_report(report: Report) -> None:
    """Refuse a report whose values are not finite, typed and bounded (``WireError``, one line):
    Infinity / NaN anywhere, an attempt past 2**31, ranks and exit codes out of range, an oversized
    progress or notice object."""
    if not 0 <= report.attempt <= MAX_ATTEMPT:
        raise WireError(f"attempt: must be between 0 and {MAX_ATTEMPT}")
    if len(report.exit_codes) > MAX_RANK:
        raise WireError("exit_codes: too many ranks")
    for rank, code in report.exit_codes.items():
        if not 0 <= rank < MAX_RANK or not -2**31 <= code < 2**31:
            raise WireError("exit_codes: ranks must be in [0, 2**20) and codes 32-bit integers")
    for name in ("instance_id", "address"):
        text = getattr(report, name)
        if text is not None and len(text) > 256:
            raise WireError(f"{name}: longer than 256 characters")
    for name in ("progress", "notice"):
        obj = getattr(report, name)
        if obj is None:
            continue
        _check_values(obj, name)
        if len(json.dumps(obj, allow_nan=False)) > MAX_OBJECT_BYTES:
            raise WireError(f"{name}: larger than {MAX_OBJECT_BYTES} bytes")


# ----- storage -------------------------------------------------------------------------------------
def agent_db_url(controller_db_url: str) -> str:
    """Where the agent tables live: beside a SQLite database file, else in the same database."""
    url = make_url(controller_db_url)
    if url.get_backend_name() != "sqlite":
        return controller_db_url
    if not url.database or url.database == ":memory:":
        raise ValueError(f"the remote executor needs a database file, not {controller_db_url!r}")
    path = Path(url.database)
    return str(url.set(database=str(path.with_name(path.stem + "-agents" + (path.suffix or ".db")))))


class AgentTables(Database):
    """Sessions over the agent tables (their own engine, see the module doc)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, branches=(AGENTS,))


# ----- errors of an agent's lookup (the agent API maps them to HTTP statuses: remote/endpoints.py) ---------
class AgentLookupError(SpotrainError):
    """An agent's credential maps to no instance it may use."""


class InstanceNotYetKnown(AgentLookupError):
    """The controller has not recorded an instance for this decision yet (the agent retries)."""


class InstanceTerminated(AgentLookupError):
    """The instance is terminated in the controller's records: its agent should stop and exit."""


class WrongInstance(AgentLookupError):
    """The agent claims an instance id other than the one its decision launched."""


@dataclasses.dataclass(frozen=True)
class AgentSeen:
    """What the controller knows of an instance's agent (for the provider overlay)."""

    reported_at: float
    notice: Mapping[str, Any] | None
    address: str | None


def _loads(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


class RemoteExecutor:
    """``cloud_providers.executor.Executor`` for workers run by instance agents (see module doc)."""

    def __init__(
        self,
        store: Store,
        *,
        agent_token: str,
        master_port: int = DEFAULT_MASTER_PORT,
        lost_after_s: float = 30.0,
        address_of: Callable[[str], str | None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        ship_workdir: bool = True,
    ) -> None:
        """``clock``: wall time, stored in the tables for display. ``monotonic``: what liveness is
        measured on (see the module doc); tests give both fakes."""
        if not 0 < master_port < 65536:
            raise ValueError(f"master_port: {master_port} is not a TCP port")
        if lost_after_s <= 0:
            raise ValueError(f"lost_after_s: must be > 0, got {lost_after_s}")
        if not agent_token:
            raise ValueError("agent_token: must be a non-empty secret")
        self.store = store
        self.tables = AgentTables(agent_db_url(store.url))
        self.agent_token = agent_token
        self.master_port = master_port
        self.lost_after_s = lost_after_s
        self.address_of = address_of
        self._clock = clock
        self._monotonic = monotonic
        # instance id -> (what its report and assignment rows said, monotonic time that was first seen)
        self._heard: dict[str, tuple[tuple[Any, ...], float]] = {}
        self._output_lock = threading.Lock()
        self.ship_workdir = ship_workdir
        self.shipper = WorkdirShipper()
        # True once the agents' endpoints are served on their own TLS listener (``remote/listener.py``).
        self.served_apart = False
        # The controller's wheel that listener serves to booting instances (``remote/wheel.py``), if any.
        self.agent_wheel: Any = None

    def workdir_for(self, launch: WorkerLaunch) -> dict[str, Any] | None:
        """The job's shipped workdir for its assignments (``jobs/workdir.py``): ``{uri, sha256, size}``,
        ``{error}`` when it cannot be shipped (the agent fails the ranks with that line), or
        ``workdir_shipper.PENDING`` while it is being packed (a build starts at the first ask). None
        when not shipping, or without a job store to ship to."""
        store_uri = launch.env.get(ENV_CHECKPOINT_URI)
        if not self.ship_workdir or not store_uri:
            return None
        return self.shipper.ref(launch.job_id, Path(launch.cwd), store_uri)

    # ----- the Executor contract (controller side) -----
    def start(self, launch: WorkerLaunch) -> None:
        assigned = launch.with_(workdir=self.workdir_for(launch))
        with self.tables.session() as s:
            row = s.get(AgentAssignment, launch.instance_id)
            if row is not None and row.attempt >= launch.attempt:
                return  # idempotent per (instance, attempt)
            if row is None:
                row = AgentAssignment(instance_id=launch.instance_id, stop_attempt=0)
                s.add(row)
            row.job_id, row.attempt = launch.job_id, launch.attempt
            row.launch_json = json.dumps(launch_to_json(assigned))
            row.notice_json = None
            row.assigned_at = self._clock()

    def status(self, instance_id: str, attempt: int) -> WorkerStatus:
        with self.tables.session() as s:
            assigned = s.get(AgentAssignment, instance_id)
            report = s.get(AgentReport, instance_id)
        if assigned is None or assigned.attempt < attempt:
            return WorkerStatus(GangState.ABSENT)
        if report is not None and report.attempt == attempt:
            codes = {int(k): int(v) for k, v in (_loads(report.exit_codes_json) or {}).items()}
            if report.state == STATE_EXITED:
                return WorkerStatus(GangState.EXITED, codes)
            if report.state == STATE_STOPPED:
                return WorkerStatus(GangState.LOST, codes)
        else:
            codes = {}
        if assigned.attempt > attempt:
            return WorkerStatus(GangState.LOST, codes)  # superseded before it reported an end
        if self._silent_s(instance_id, assigned, report) > self.lost_after_s:
            return WorkerStatus(GangState.LOST, codes)
        return WorkerStatus(GangState.RUNNING, codes)

    def _silent_s(self, instance_id: str, assigned: AgentAssignment, report: AgentReport | None) -> float:
        """Monotonic seconds since this controller saw the instance's rows change. The stored times
        serve as change markers only (any other value, later or earlier, is news), whichever
        controller of the fleet took the report."""
        marker = (assigned.attempt, assigned.assigned_at,
                  (report.attempt, report.state, report.reported_at) if report is not None else None)
        now = self._monotonic()
        last = self._heard.get(instance_id)
        if last is None or last[0] != marker:
            self._heard[instance_id] = (marker, now)
            return 0.0
        return now - last[1]

    def notify(self, instance_id: str, notice: Mapping[str, Any]) -> None:
        with self.tables.session() as s:
            row = s.get(AgentAssignment, instance_id)
            if row is not None and row.attempt > row.stop_attempt and row.notice_json is None:
                row.notice_json = json.dumps(dict(notice))

    def stop(self, instance_id: str) -> None:
        with self.tables.session() as s:
            row = s.get(AgentAssignment, instance_id)
            if row is not None and row.stop_attempt < row.attempt:
                row.stop_attempt = row.attempt

    def progress(self, job_id: str) -> ProgressRecord | None:
        """Rank 0's last record as its agent relayed it (checked by ``parse_progress`` when received)."""
        with self.tables.session() as s:
            row = s.get(AgentProgress, job_id)
        data = _loads(row.progress_json) if row is not None else None
        return data if isinstance(data, dict) else None  # type: ignore[return-value]

    def progress_file(self, job_id: str) -> str:
        """Rank 0 writes its progress file on its own instance; this names it for messages."""
        return f"agent://{job_id}/progress.json"

    def rendezvous(self, instance_id: str) -> tuple[str, int]:
        with self.tables.session() as s:
            report = s.get(AgentReport, instance_id)
        address = report.address if report is not None and report.address else None
        if address is None and self.address_of is not None:
            address = self.address_of(instance_id)
        if not address:
            raise ProviderError(f"no private address known for instance {instance_id} yet")
        return address, self.master_port

    # ----- the agents' side (autoscaler/remote/endpoints.py) -----
    def instance_for(self, decision_id: str, claimed_instance_id: str | None) -> str:
        """The instance launched for ``decision_id``; raises AgentLookupError (see the classes)."""
        with self.store.session() as s:
            row = s.scalars(select(InstanceRow).where(InstanceRow.decision_id == decision_id)).first()
        if row is None:
            raise InstanceNotYetKnown(f"no instance recorded for decision {decision_id} yet")
        if claimed_instance_id and claimed_instance_id != row.instance_id:
            raise WrongInstance(f"decision {decision_id} launched {row.instance_id}, not {claimed_instance_id}")
        if row.state == InstanceState.TERMINATED.value:
            raise InstanceTerminated(f"instance {row.instance_id} is terminated")
        return row.instance_id

    def assignment(self, instance_id: str) -> Assignment:
        with self.tables.session() as s:
            row = s.get(AgentAssignment, instance_id)
        if row is None or not row.launch_json:
            return Assignment(instance_id=instance_id)
        launch = launch_from_json(json.loads(row.launch_json))
        if is_pending(launch.workdir):
            shipped = self._with_workdir(instance_id, launch)
            if shipped is None:  # still being packed: the agent waits, as for a slow boot
                return Assignment(instance_id=instance_id, stop_attempt=row.stop_attempt)
            launch = shipped
        return Assignment(instance_id=instance_id, launch=launch, notice=_loads(row.notice_json),
                          stop_attempt=row.stop_attempt)

    def _with_workdir(self, instance_id: str, launch: WorkerLaunch) -> WorkerLaunch | None:
        """``launch`` with its workdir once shipped (stored, so a restarted controller need not pack
        again), else None."""
        store_uri = launch.env.get(ENV_CHECKPOINT_URI, "")
        ref = self.shipper.ref(launch.job_id, Path(launch.cwd), store_uri) if store_uri else {
            "error": "workdir: the job has no store to ship its workdir to"}
        if is_pending(ref):
            return None
        launch = launch.with_(workdir=ref)
        with self.tables.session() as s:
            row = s.get(AgentAssignment, instance_id)
            if row is not None and row.attempt == launch.attempt and row.job_id == launch.job_id:
                row.launch_json = json.dumps(launch_to_json(launch))
        return launch

    def record_output(self, instance_id: str, chunk: OutputChunk) -> int:
        """Append an agent's chunk of one of its ranks' logs to the controller's copy (the log
        ``spotrain logs`` and ``logs -f`` read); the copy's size, from which the agent sends next.
        Only the instance's own ranks of its latest attempt are taken (``WireError`` otherwise)."""
        la = self.assignment(instance_id).launch
        if la is None or chunk.attempt != la.attempt or chunk.rank not in la.ranks:
            raise WireError(f"output: rank {chunk.rank} of attempt {chunk.attempt} does not run on {instance_id}")
        path = logs_dir(la.job_id) / f"attempt-{la.attempt}-rank-{chunk.rank}.log"
        with self._output_lock:
            # Offsets count every byte received, also those rotated out since (``jobs/log_cap.py``).
            base = log_cap.read_meta(path)["base_bytes"]
            size = base + (path.stat().st_size if path.exists() else 0)
            if chunk.offset > size:
                return size  # a gap: the agent sends again from what is here
            data = chunk.data[size - chunk.offset:]
            if data:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                with os.fdopen(fd, "ab") as f:
                    f.write(data)
                log_cap.enforce(path.parent)  # the job's cap on the controller's disk
            return size + len(data)

    def record_report(self, instance_id: str, report: Report) -> None:
        """Store an agent's report; ``WireError`` (nothing stored) if it fails ``check_report``."""
        check_report(report)
        now = self._clock()
        with self.tables.session() as s:
            row = s.get(AgentReport, instance_id)
            if row is None:
                row = AgentReport(instance_id=instance_id, first_report_at=now)
                s.add(row)
                log.info("agent of %s checked in (%s)", instance_id, report.address or "no address")
            row.attempt, row.state, row.reported_at = report.attempt, report.state, now
            row.exit_codes_json = json.dumps({str(k): v for k, v in report.exit_codes.items()})
            if report.notice is not None and row.notice_json is None:
                row.notice_json = json.dumps(dict(report.notice))
            if report.address:
                row.address = report.address
            assigned = s.get(AgentAssignment, instance_id)
            if report.progress is None or assigned is None or report.state == STATE_IDLE:
                return
            launch = _loads(assigned.launch_json) or {}
            if report.attempt != assigned.attempt or 0 not in launch.get("ranks", []):
                return
            prog = s.get(AgentProgress, assigned.job_id)
            if prog is None:
                prog = AgentProgress(job_id=assigned.job_id, attempt=0)
                s.add(prog)
            if report.attempt >= prog.attempt:
                try:
                    record = parse_progress(dict(report.progress))
                except ProgressError as exc:  # the job's last good record stays
                    log.warning("agent of %s: progress of %s ignored: %s", instance_id, assigned.job_id, exc)
                    return
                prog.attempt, prog.reported_at = report.attempt, now
                prog.progress_json = json.dumps(dict(record))

    def accept_seq(self, decision_id: str, seq: int) -> int | None:
        """Take request counter ``seq`` from ``decision_id``'s agent: None if taken (it is above every
        one taken before), else the highest taken (a replayed or stale request). Atomic in the
        database, so one value is taken once across the fleet's controllers and their restarts."""
        with self.tables.session() as s:
            result = s.execute(update(AgentSeq).where(AgentSeq.decision_id == decision_id, AgentSeq.seq < seq)
                               .values(seq=seq))
            assert isinstance(result, CursorResult)  # an UPDATE's result is its cursor's (rowcount)
            taken = result.rowcount
            if taken:
                return None
            row = s.get(AgentSeq, decision_id)
            if row is not None:
                return int(row.seq)
        try:
            with self.tables.session() as s:
                s.add(AgentSeq(decision_id=decision_id, seq=seq))
            return None
        except IntegrityError:
            return seq  # another request of this decision made the row first: this one is not newer

    def seen(self, instance_ids: Sequence[str]) -> dict[str, AgentSeen]:
        if not instance_ids:
            return {}
        with self.tables.session() as s:
            rows = list(s.scalars(select(AgentReport).where(AgentReport.instance_id.in_(list(instance_ids)))))
        return {r.instance_id: AgentSeen(r.reported_at, _loads(r.notice_json), r.address) for r in rows}


class AgentGatedProvider:
    """A real cloud's provider as the controller should see it when agents run the workers.

    - RUNNING in the cloud, but its agent has not checked in: PENDING (no gang is placed on it yet;
      on a real cloud the agent is still being installed, which takes a minute or two);
    - its agent reported the cloud's spot notice: NOTICE (the controller relays it to the gang and
      counts the preemption), even where the cloud API has no notice to show;
    - no check-in within ``boot_timeout_s`` of its launch: terminated, and reported so (released).

    Everything else is the wrapped provider's (``boot_config`` and other extras pass through).
    """

    def __init__(self, inner: Provider, executor: RemoteExecutor, *, boot_timeout_s: float = 900.0) -> None:
        if boot_timeout_s <= 0:
            raise ValueError(f"boot_timeout_s: must be > 0, got {boot_timeout_s}")
        self.inner = inner
        self.name = inner.name
        self.executor = executor
        self.boot_timeout_s = boot_timeout_s
        self._lock = threading.Lock()
        self._known: dict[str, Instance] = {}
        self._emitted: dict[str, tuple[InstanceState, str | None, float | None]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def now_s(self) -> float:
        return self.inner.now_s()

    def offerings(self) -> Sequence[Offering]:
        return self.inner.offerings()

    def terminate(self, instance_id: str) -> None:
        self.inner.terminate(instance_id)

    def billing(self, instance: Instance) -> Billing:
        return self.inner.billing(instance)

    def address_of(self, instance_id: str) -> str | None:
        with self._lock:
            inst = self._known.get(instance_id)
        return inst.address if inst is not None else None

    def _overlay(self, inst: Instance, seen: AgentSeen | None) -> Instance:
        if inst.state is InstanceState.RUNNING and seen is None:
            return dataclasses.replace(inst, state=InstanceState.PENDING)
        if inst.state in (InstanceState.RUNNING, InstanceState.PENDING) and seen is not None and seen.notice:
            deadline = seen.notice.get("deadline_unix_s")
            return dataclasses.replace(
                inst, state=InstanceState.NOTICE,
                interruption=inst.interruption or str(seen.notice.get("reason") or "preemption"),
                notice_deadline_s=float(deadline) if isinstance(deadline, (int, float)) else self.now_s(),
            )
        return inst

    def _remember(self, instances: Sequence[Instance]) -> list[Instance]:
        seen = self.executor.seen([i.instance_id for i in instances])
        out = []
        with self._lock:
            for inst in instances:
                self._known[inst.instance_id] = inst
                eff = self._overlay(inst, seen.get(inst.instance_id))
                self._emitted[inst.instance_id] = (eff.state, eff.interruption, eff.notice_deadline_s)
                out.append(eff)
        return out

    def launch(self, request: LaunchRequest) -> Instance:
        return self._remember([self.inner.launch(request)])[0]

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        return self._remember(list(self.inner.list_instances(tags)))

    def poll(self) -> Sequence[Instance]:
        changed = list(self.inner.poll())
        with self._lock:
            for inst in changed:
                self._known[inst.instance_id] = inst
            known = dict(self._known)
        seen = self.executor.seen(list(known))
        now = self.now_s()
        out: list[Instance] = []
        for instance_id, inst in known.items():
            eff = self._overlay(inst, seen.get(instance_id))
            if eff.state is InstanceState.PENDING and now - inst.launched_at_s > self.boot_timeout_s:
                log.warning("agent of %s never checked in within %.0f s: terminating it", instance_id, self.boot_timeout_s)
                self.inner.terminate(instance_id)
                eff = dataclasses.replace(inst, state=InstanceState.TERMINATED, terminated_at_s=now,
                                          notice_deadline_s=None)
                inst = eff
            key = (eff.state, eff.interruption, eff.notice_deadline_s)
            with self._lock:
                if self._emitted.get(instance_id) != key:
                    self._emitted[instance_id] = key
                    out.append(eff)
                self._known[instance_id] = inst
                if not eff.alive:
                    del self._known[instance_id]  # its end is reported once; the cloud's own poll stops too
        return out


__all__ = [
    "AgentGatedProvider",
    "AgentLookupError",
    "RemoteExecutor",
    "agent_credential",
    "agent_token_path",
    "check_report",
    "decision_of",
    "ensure_agent_token",
]
