"""The Store: sessions over the state database, and the few queries everything needs."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Collection, Iterator
from pathlib import Path

from sqlalchemy import case, create_engine, event, func, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.jobs.domain import LIVE, check_transition
from cloud_providers.base import SPOT, InstanceState

from .migrate import BRANCHES, migrate
from .models import TERMINAL, Decision, Event, InstanceRow, Job, JobState

# pg_advisory_xact_lock key under which a controller migrates the schema on PostgreSQL.
_SCHEMA_LOCK = 0x5350_5452


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    # WAL lets `spotrain status` read while the controller writes; busy_timeout rides out short locks.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _private_sqlite_file(url: str) -> None:
    """Create a SQLite database file mode 0600 (narrow one found wider, and its WAL and shared-memory
    files), before SQLite creates it with the umask's 0644: jobs, costs and the agents' reports are
    the user's alone (issue 14, finding 11). SQLite gives the -wal and -shm files it makes later the
    database file's mode."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.is_dir():
        return  # SQLite's own error says the database cannot be opened
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            os.chmod(p, 0o600)


@contextlib.contextmanager
def _sqlite_schema_lock(url: str) -> Iterator[None]:
    """One process at a time makes or evolves a SQLite file's schema. SQLite's DDL through the driver
    is not one transaction: a second process opening the same new database (`spotrain run` and
    `spotrain status`, say) created a table between this one's check and its CREATE ("table jobs
    already exists"). PostgreSQL has its advisory lock instead (``Database``)."""
    database = make_url(url).database if url.startswith("sqlite") else None
    if not database or database == ":memory:" or database.startswith("file:") or not Path(database).parent.is_dir():
        yield
        return
    fd = os.open(f"{database}.schema-lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Database:
    """An engine and transactional sessions over the state database, its schema brought to the head of
    ``branches`` (Alembic's: ``migrate.py``) as it opens."""

    def __init__(self, url: str, *, branches: Collection[str] = BRANCHES) -> None:
        self.url = url
        sqlite = url.startswith("sqlite")
        if sqlite:
            _private_sqlite_file(url)
        # pre_ping: a server that restarted (or a connection a proxy dropped) costs no failed tick.
        self.engine: Engine = create_engine(url, future=True, pool_pre_ping=not sqlite)
        if sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        with _sqlite_schema_lock(url), self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                # Controllers of one fleet may start together: one at a time migrates the schema
                # (PostgreSQL's DDL is transactional; the lock ends with this transaction).
                conn.execute(text(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})"))
            migrate(conn, branches)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        s = self._sessions()
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()


_LIVE_STATES = sorted(s.value for s in LIVE)
_ALIVE_INSTANCE_STATES = sorted(s.value for s in InstanceState if s is not InstanceState.TERMINATED)

# What a list of jobs may ask for (``Store.job_page``): the live ones, the ended ones, every one.
LIVE_SELECTOR, ENDED_SELECTOR, ALL_SELECTOR = "live", "ended", "all"


def states_of(selector: str) -> list[str] | None:
    """The job states a list's ``state`` selector names: ``live``, ``ended``, ``all`` (None: no
    filter) or a comma-separated list of states (``RUNNING,FAILED``); ValueError naming a bad one."""
    if selector == ALL_SELECTOR:
        return None
    if selector == LIVE_SELECTOR:
        return list(_LIVE_STATES)
    if selector == ENDED_SELECTOR:
        return sorted(t.value for t in TERMINAL)
    names = [n.strip().upper() for n in selector.split(",") if n.strip()]
    bad = [n for n in names if n not in JobState.__members__]
    if not names or bad:
        raise ValueError(f"state: {selector!r} is not live, ended, all or a comma-separated list of "
                         f"{', '.join(s.value for s in JobState)}")
    return sorted(set(names))


class Store(Database):
    """The controller's state: jobs, instances, decisions, events."""

    def __init__(self, url: str) -> None:
        super().__init__(url)

    # ----- queries -----
    def job(self, s: Session, ref: str) -> Job | None:
        """Find a job by id, or by name (the newest job of that name)."""
        j = s.get(Job, ref)
        if j is not None:
            return j
        return s.scalars(select(Job).where(Job.name == ref).order_by(Job.submitted_at.desc())).first()

    def jobs(self, s: Session, *, controller_id: str | None = None, live_only: bool = False) -> list[Job]:
        q = select(Job).order_by(Job.submitted_at)
        if controller_id is not None:
            q = q.where(Job.controller_id == controller_id)
        if live_only:
            q = q.where(Job.state.in_(_LIVE_STATES))  # IN, not NOT IN: the index finds the few live jobs
        return list(s.scalars(q))

    def job_page(self, s: Session, *, states: Collection[str] | None, limit: int, offset: int = 0,
                 newest_first: bool = False) -> list[Job]:
        """One page of jobs in ``states`` (None: any), in submission order (oldest first unless
        ``newest_first``): one query, found by the (state, submitted_at) index however many jobs
        ended before (issue 21, finding 7)."""
        q = select(Job.job_id)
        if states is not None:
            q = q.where(Job.state.in_(sorted(states)))
        order = (Job.submitted_at.desc(), Job.job_id.desc()) if newest_first else (Job.submitted_at, Job.job_id)
        # The page's ids first, from the index alone (several states' ranges are merged by a sort of
        # (submitted_at, job_id) pairs, not of whole rows: 140 ms at 10,000 ended jobs), then its rows.
        ids = list(s.scalars(q.order_by(*order).limit(limit).offset(offset)))
        by_id = {j.job_id: j for j in s.scalars(select(Job).where(Job.job_id.in_(ids)))} if ids else {}
        return [by_id[i] for i in ids if i in by_id]

    def count_jobs(self, s: Session, states: Collection[str] | None = None) -> int:
        q = select(func.count()).select_from(Job)
        if states is not None:
            q = q.where(Job.state.in_(sorted(states)))
        return int(s.scalar(q) or 0)

    def job_counts(self, s: Session) -> dict[str, int]:
        """How many jobs are in each state (one grouped query)."""
        return {state: int(n) for state, n in s.execute(select(Job.state, func.count()).group_by(Job.state))}

    def instances_of(self, s: Session, job_ids: Collection[str]) -> dict[str, list[InstanceRow]]:
        """The instances of each of ``job_ids``, in ``instances``' order, in one query per 500 jobs
        (a list page shows its jobs without one query per job)."""
        out: dict[str, list[InstanceRow]] = {j: [] for j in job_ids}
        ids = sorted(out)
        for i in range(0, len(ids), 500):
            q = (select(InstanceRow).where(InstanceRow.job_id.in_(ids[i:i + 500]))
                 .order_by(InstanceRow.launched_at_s, InstanceRow.instance_id))
            for row in s.scalars(q):
                out[row.job_id].append(row)
        return out

    def job_ids(self, s: Session, controller_id: str) -> set[str]:
        return set(s.scalars(select(Job.job_id).where(Job.controller_id == controller_id)))

    def live_job_named(self, s: Session, name: str) -> Job | None:
        return s.scalars(
            select(Job).where(Job.name == name, Job.state.not_in([t.value for t in TERMINAL]))
        ).first()

    def instances(self, s: Session, job_id: str, *, alive_only: bool = False) -> list[InstanceRow]:
        q = select(InstanceRow).where(InstanceRow.job_id == job_id).order_by(InstanceRow.launched_at_s, InstanceRow.instance_id)
        if alive_only:
            q = q.where(InstanceRow.state != "terminated")
        return list(s.scalars(q))

    def spot_history(self, s: Session, controller_id: str, *, jobs: Collection[str] | None = None,
                     exclude: Collection[str] = ()) -> list[tuple[str, float, int]]:
        """``(offering_key, spot seconds billed, preemptions)`` over the spot instances this
        controller's jobs had (only those of ``jobs`` when given, less those of ``exclude``), summed by
        the database: a controller with 10,000 finished jobs does not load their rows every tick
        (issue 14, finding 5; ``controller.context.SpotHistory`` sums finished jobs once)."""
        interrupted = func.sum(case((func.coalesce(InstanceRow.interruption, "") != "", 1), else_=0))
        q = (select(InstanceRow.offering_key, func.sum(InstanceRow.billed_seconds), interrupted)
             .join(Job, Job.job_id == InstanceRow.job_id)
             .where(Job.controller_id == controller_id, InstanceRow.market == SPOT)
             .group_by(InstanceRow.offering_key).order_by(InstanceRow.offering_key))
        if jobs is not None:
            q = q.where(InstanceRow.job_id.in_(sorted(jobs)))
        if exclude:
            q = q.where(InstanceRow.job_id.not_in(sorted(exclude)))
        return [(k, float(held or 0.0), int(pre or 0)) for k, held, pre in s.execute(q)]

    def unsettled_jobs(self, s: Session, controller_id: str) -> set[str]:
        """This controller's jobs whose instances may still change: live ones, and ended ones that
        still have an alive instance or a pending launch decision. Each part is found by an index,
        so the cost follows these jobs, not the finished ones."""
        held = set(s.scalars(select(InstanceRow.job_id).where(InstanceRow.state.in_(_ALIVE_INSTANCE_STATES)).union(
            select(Decision.job_id).where(Decision.status == "pending"))))
        # The few held jobs are looked up by id (joined on the controller, SQLite would walk every
        # job of the controller instead).
        live = select(Job.job_id).where(Job.controller_id == controller_id, Job.state.in_(_LIVE_STATES))
        if not held:
            return set(s.scalars(live))
        return set(s.scalars(live.union(
            select(Job.job_id).where(Job.job_id.in_(sorted(held)), Job.controller_id == controller_id))))

    def events(self, s: Session, job_id: str) -> list[Event]:
        return list(s.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)))

    @staticmethod
    def transition(s: Session, job: Job, to: JobState, reason: str, *, ts: float | None = None) -> None:
        """Move a job to ``to`` and record the event (no-op if already there). A move the lifecycle
        table (``domain.TRANSITIONS``) does not allow raises ``IllegalTransition``. ``ts``: the
        controller's clock (default: the wall clock)."""
        if job.state == to.value:
            return
        check_transition(job.job_id, job.state, to)
        ts = time.time() if ts is None else ts
        s.add(Event(job_id=job.job_id, ts=ts, kind="state", from_state=job.state, to_state=to.value, reason=reason))
        job.state = to.value
        job.reason = reason
        if to in TERMINAL:
            job.finished_at = ts

    @staticmethod
    def note(s: Session, job: Job, kind: str, reason: str, *, ts: float | None = None) -> None:
        s.add(Event(job_id=job.job_id, ts=time.time() if ts is None else ts, kind=kind, from_state=job.state,
                    to_state=job.state, reason=reason))
