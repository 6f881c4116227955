"""The leader lease: several controllers of one fleet share a database, and one of them leads.

A fleet is the controllers started with the same ``--id`` on the same database. Its lease is one row
of ``leases`` (``name`` = the fleet id): the holder, an ``epoch`` (the fencing token: it grows by one
whenever the lease changes hands), a ``version`` (it grows with every renewal), and, for people, the
holder's wall time of its last renewal and of its expiry. Only the holder ticks (launches, releases,
recovery); the others are standbys that serve the read API from the shared database.

Expiry is judged without comparing clocks across machines (as Kubernetes' client-go does): the
holder counts its lease as held for ``ttl_s`` from the *start* of its last successful renewal, on its
own monotonic clock; a standby takes the lease over only once it has seen the row unchanged (same
holder, epoch and version) for the holder's ``ttl_s`` on *its* monotonic clock. Since a standby sees a
renewal only after it committed, the holder always stops counting the lease as held before any
standby may take it. Shortcuts: a released lease (clean shutdown) is taken at once, and so is one
whose holder ran on this machine from this ``SPOTRAIN_HOME`` and whose process is gone (a controller
restarted in place after a crash, as systemd or the chaos tests do).

Takeover and renewal are compare-and-set ``UPDATE``s (on the epoch and version seen), atomic on
PostgreSQL and on SQLite alike. Every commit the leader makes while it ticks is fenced (``fence``):
the same transaction re-checks, with an ``UPDATE`` of the lease row, that this holder still holds the
epoch, so a paused old leader that wakes after a takeover commits nothing (a ``Conflict``). The pure
decision is ``may_take``; ``LeaderLease`` does the I/O.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import BigInteger, CursorResult, Float, Result, String, Text, event, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from ..errors import Conflict
from .models import Base


def _rowcount(result: Result[Any]) -> int:
    """The rows an ``UPDATE`` matched (its result is its cursor's)."""
    assert isinstance(result, CursorResult)
    return result.rowcount

log = logging.getLogger("spotrain.lease")

DEFAULT_TTL_S = 10.0


class LeaseRow(Base):
    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200), default="")
    # The holder's host, pid, process start, SPOTRAIN_HOME and URL (JSON), for the shortcut and status.
    holder_json: Mapped[str] = mapped_column(Text, default="{}")
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    ttl_s: Mapped[float] = mapped_column(Float, default=DEFAULT_TTL_S)
    renewed_at: Mapped[float] = mapped_column(Float, default=0.0)
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)


def _proc_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``; None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


@dataclasses.dataclass(frozen=True)
class Holder:
    """One controller process as a lease holder."""

    id: str
    host: str
    pid: int
    pid_start: int | None
    home: str
    url: str = ""

    @staticmethod
    def here(home: str, url: str = "") -> Holder:
        host, pid = socket.gethostname(), os.getpid()
        return Holder(id=f"{host}/{pid}/{uuid.uuid4().hex[:8]}", host=host, pid=pid, pid_start=_proc_start(pid),
                      home=home, url=url)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a standby saw of the lease row."""

    holder: str
    epoch: int
    version: int
    ttl_s: float
    info: dict[str, Any]


def holder_gone(info: dict[str, Any], me: Holder, proc_start: Callable[[int], int | None] = _proc_start) -> bool:
    """True when the recorded holder ran on this machine from this home and its process is gone."""
    if info.get("host") != me.host or info.get("home") != me.home or not isinstance(info.get("pid"), int):
        return False
    start = proc_start(info["pid"])
    return start is None or (info.get("pid_start") is not None and start != info.get("pid_start"))


def may_take(seen: Seen | None, *, unchanged_s: float, me: Holder,
             proc_start: Callable[[int], int | None] = _proc_start) -> bool:
    """Whether a standby may take the lease: there is none, it was released, its holder is known to be
    gone, or the row has not changed for the holder's ``ttl_s`` (``unchanged_s``, on this machine's
    monotonic clock)."""
    if seen is None or not seen.holder or seen.holder == me.id:
        return True
    if holder_gone(seen.info, me, proc_start):
        return True
    return unchanged_s >= seen.ttl_s


class LeaderLease:
    """The fleet's lease as seen by one controller process (``step`` every ``poll_s``)."""

    def __init__(self, engine: Any, name: str, holder: Holder, *, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if not ttl_s > 0:
            raise ValueError("the lease's TTL must be positive")
        self.engine, self.name, self.me, self.ttl_s = engine, name, holder, float(ttl_s)
        self.clock, self.wall = clock, wall
        self.epoch: int | None = None  # the epoch held (None: standby)
        self._deadline = 0.0
        self._observed: tuple[str, int, int] | None = None
        self._observed_at = 0.0
        self.leader: dict[str, Any] = {}  # the holder's info, as last seen
        self._fenced = threading.local()

    @property
    def poll_s(self) -> float:
        return max(0.05, self.ttl_s / 4)

    def held(self) -> bool:
        """Whether this controller holds the lease now (by its own clock: no database call)."""
        return self.epoch is not None and self.clock() < self._deadline

    # ----- acquire / renew / release -----
    def step(self) -> str:
        """Renew the lease if held, else try to take it: ``renewed``, ``acquired``, ``lost`` (held
        until now, taken by another) or ``standby``."""
        if self.epoch is not None:
            if self._renew():
                return "renewed"
            self.epoch = None
            return "lost"
        return "acquired" if self._try_take() else "standby"

    def _values(self, t_wall: float) -> dict[str, Any]:
        return {"renewed_at": t_wall, "expires_at": t_wall + self.ttl_s, "ttl_s": self.ttl_s}

    def _renew(self) -> bool:
        t0, t_wall = self.clock(), self.wall()
        with self.engine.begin() as conn:
            result = conn.execute(update(LeaseRow).where(LeaseRow.name == self.name, LeaseRow.holder == self.me.id,
                                                         LeaseRow.epoch == self.epoch)
                                  .values(version=LeaseRow.version + 1, **self._values(t_wall)))
            n = _rowcount(result)
        if n == 1:
            self._deadline = t0 + self.ttl_s
        return n == 1

    def _try_take(self) -> bool:
        t0, t_wall = self.clock(), self.wall()
        with self.engine.begin() as conn:
            row = conn.execute(select(LeaseRow).where(LeaseRow.name == self.name)).first()
        mine = {"holder": self.me.id, "holder_json": self.me.to_json(), **self._values(t_wall)}
        if row is None:
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(LeaseRow).values(name=self.name, epoch=1, version=1, **mine))
            except IntegrityError:
                return False  # another controller made it first
            return self._took(1, t0)
        seen = Seen(row.holder, int(row.epoch), int(row.version), float(row.ttl_s), _info(row.holder_json))
        self.leader = seen.info
        key = (seen.holder, seen.epoch, seen.version)
        if key != self._observed:
            self._observed, self._observed_at = key, t0
        if not may_take(seen, unchanged_s=t0 - self._observed_at, me=self.me):
            return False
        with self.engine.begin() as conn:
            n = _rowcount(conn.execute(update(LeaseRow).where(LeaseRow.name == self.name, LeaseRow.epoch == seen.epoch,
                                                              LeaseRow.version == seen.version)
                                       .values(epoch=seen.epoch + 1, version=seen.version + 1, **mine)))
        return n == 1 and self._took(seen.epoch + 1, t0)

    def _took(self, epoch: int, t0: float) -> bool:
        self.epoch, self._deadline, self.leader = epoch, t0 + self.ttl_s, json.loads(self.me.to_json())
        return True

    def release(self) -> None:
        """Give the lease up (clean shutdown): a standby takes it at once."""
        if self.epoch is None:
            return
        with self.engine.begin() as conn:
            conn.execute(update(LeaseRow).where(LeaseRow.name == self.name, LeaseRow.holder == self.me.id,
                                                LeaseRow.epoch == self.epoch)
                         .values(holder="", version=LeaseRow.version + 1, expires_at=self.wall()))
        self.epoch = None

    # ----- fencing -----
    @contextmanager
    def fenced(self) -> Iterator[None]:
        """Every commit made in this thread meanwhile is fenced on the epoch held (``install_fence``)."""
        self._fenced.on = True
        try:
            yield
        finally:
            self._fenced.on = False

    def fence(self, s: Session) -> None:
        """In ``s``'s transaction: raise ``Conflict`` (and stop holding) unless this holder still holds its epoch. The
        ``UPDATE`` locks the lease row until ``s`` commits, so no takeover can come in between."""
        epoch = self.epoch
        if epoch is None:
            raise Conflict(f"controller fleet {self.name}: this controller is not the leader")
        n = _rowcount(s.execute(update(LeaseRow).where(LeaseRow.name == self.name, LeaseRow.holder == self.me.id,
                                                       LeaseRow.epoch == epoch).values(epoch=LeaseRow.epoch)))
        if n != 1:
            self.epoch = None
            raise Conflict(f"controller fleet {self.name}: the lease of epoch {epoch} was taken over")

    def install_fence(self, sessions: Any) -> None:
        """Fence every commit of ``sessions`` (a sessionmaker) made inside ``fenced()``."""

        def before_commit(s: Session) -> None:
            if getattr(self._fenced, "on", False):
                self.fence(s)

        event.listen(sessions, "before_commit", before_commit)


def _info(text: str) -> dict[str, Any]:
    try:
        info = json.loads(text or "{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def read_lease(engine: Any, name: str) -> dict[str, Any] | None:
    """The lease row of fleet ``name`` as plain data (status, tests); None when there is none."""
    with engine.begin() as conn:
        row = conn.execute(select(LeaseRow).where(LeaseRow.name == name)).first()
    if row is None:
        return None
    return {"name": row.name, "holder": row.holder, "holder_info": _info(row.holder_json), "epoch": int(row.epoch),
            "version": int(row.version), "ttl_s": float(row.ttl_s), "renewed_at": float(row.renewed_at),
            "expires_at": float(row.expires_at)}
