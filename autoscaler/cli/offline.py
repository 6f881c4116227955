"""``status`` and ``logs`` without a controller: the database under SPOTRAIN_HOME read with the
standard library's ``sqlite3``, read-only, so that neither imports SQLAlchemy nor the controller (and
through it the policy's scipy): both answer in a fraction of a second (benchmarks/cli_startup.py).

Rows come back as ``Row`` objects with the ORM models' attribute names (the tables' column names) and
go through the same ``summary.summary_dict`` (what ``JobSummary`` is built from) and
``logs.render_logs`` as the controller's. A database
URL that is not a SQLite file (``SPOTRAIN_DB_URL=postgresql://...``) is read through the ``Store``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from ..errors import JobNotFound, SpotrainError

_SQLITE = "sqlite:///"
# The ended states (``domain.TERMINAL``; not imported: this module stays light).
_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET")


class Row:
    """One row, its columns as attributes."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.__dict__.update(data)

    def __getattr__(self, name: str) -> Any:  # only for a column the row lacks
        raise AttributeError(name)


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL; None for any other URL (read through SQLAlchemy)."""
    if not url.startswith(_SQLITE) or len(url) == len(_SQLITE):
        return None
    return Path(url[len(_SQLITE):].split("?", 1)[0])


def _unusable(path: Path, why: str) -> SpotrainError:
    return SpotrainError(f"the state database is not usable ({why}: {path}); check SPOTRAIN_DB_URL and SPOTRAIN_HOME")


class OfflineDb:
    """The state database, read-only; a missing file is an empty database (nothing was ever run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None
        if not path.parent.is_dir():
            raise _unusable(path, "no such directory")
        if path.exists():
            try:
                self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
            except sqlite3.Error as exc:
                raise _unusable(path, f"{type(exc).__name__}: {exc}") from None
            self.conn.row_factory = sqlite3.Row

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
        if self.conn is None:
            return []
        try:
            return [Row(dict(r)) for r in self.conn.execute(sql, args)]
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # a database no controller has written to yet
            raise _unusable(self.path, f"OperationalError: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise _unusable(self.path, f"{type(exc).__name__}: {exc}") from None

    def jobs(self, *, recent_ended: int | None = None, states: list[str] | None = None) -> list[Row]:
        """Every job, oldest first; with ``recent_ended``, the live jobs and that many of the newest
        ended ones (``spotrain status`` without --all; the state index finds them); with ``states``,
        only jobs in those states (``status --state``)."""
        picked = list(states) if states is not None else None
        if recent_ended is None:
            if picked is None:
                return self._rows("SELECT * FROM jobs ORDER BY submitted_at, job_id")
            return self._rows(f"SELECT * FROM jobs WHERE state IN ({_marks(picked)}) ORDER BY submitted_at, job_id",
                              tuple(picked))
        live_states = [s for s in picked if s not in _ENDED] if picked is not None else None
        ended_states = [s for s in picked if s in _ENDED] if picked is not None else list(_ENDED)
        live: list[Row] = []
        if live_states is None:
            live = self._rows(f"SELECT * FROM jobs WHERE state NOT IN ({_marks(_ENDED)}) ORDER BY submitted_at, job_id",
                              _ENDED)
        elif live_states:
            live = self._rows(f"SELECT * FROM jobs WHERE state IN ({_marks(live_states)}) ORDER BY submitted_at, job_id",
                              tuple(live_states))
        done = self._rows(f"SELECT * FROM jobs WHERE state IN ({_marks(ended_states)}) "
                          "ORDER BY submitted_at DESC, job_id DESC LIMIT ?",
                          (*ended_states, recent_ended)) if ended_states and recent_ended > 0 else []
        return sorted(live + done, key=lambda r: (r.submitted_at, r.job_id))

    def instances_of(self, job_ids: list[str]) -> dict[str, list[Row]]:
        """The instances of each job, in ``instances``' order, one query per 500 jobs."""
        out: dict[str, list[Row]] = {j: [] for j in job_ids}
        ids = sorted(out)
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ", ".join("?" * len(chunk))
            for r in self._rows(f"SELECT * FROM instances WHERE job_id IN ({marks}) ORDER BY launched_at_s, instance_id",
                                tuple(chunk)):
                out[r.job_id].append(r)
        return out

    def job(self, ref: str) -> Row:
        """By id, or by name (the newest job of that name), as ``Store.job``."""
        found = self._rows("SELECT * FROM jobs WHERE job_id = ?", (ref,)) or self._rows(
            "SELECT * FROM jobs WHERE name = ? ORDER BY submitted_at DESC LIMIT 1", (ref,))
        if not found:
            raise JobNotFound(f"no job {ref!r}")
        return found[0]

    def instances(self, job_id: str) -> list[Row]:
        return self._rows("SELECT * FROM instances WHERE job_id = ? ORDER BY launched_at_s, instance_id", (job_id,))

    def events(self, job_id: str) -> list[Row]:
        return self._rows("SELECT * FROM events WHERE job_id = ? ORDER BY id", (job_id,))


def _marks(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join("?" * len(values))


def offline_summaries(url: str, job_ref: str | None, *, recent_ended: int | None = None,
                      states: list[str] | None = None) -> Any:
    """The API's JSON of ``job_ref`` (a ``JobSummary``'s fields), or the list (``OfflineDb.jobs``);
    None when ``url`` is not a SQLite file. Plain values: not even pydantic is imported."""
    path = sqlite_path(url)
    if path is None:
        return None
    from autoscaler.jobs.summary import finite_json, summary_dict

    db = OfflineDb(path)
    if job_ref is None:
        jobs = db.jobs(recent_ended=recent_ended, states=states)
        rows = db.instances_of([j.job_id for j in jobs])
        return finite_json([_noted(summary_dict(j, rows[j.job_id]), j) for j in jobs])
    j = db.job(job_ref)
    return finite_json(_noted(summary_dict(j, db.instances(j.job_id)), j))


def _noted(summary: dict[str, Any], job: Any) -> dict[str, Any]:
    """``summary``, saying so when its job's ``spotrain run`` is gone (``fleet/runs.note_abandoned``)."""
    from autoscaler.fleet.runs import note_abandoned

    note_abandoned(summary, job.controller_id, job.submitted_at)
    return summary


def offline_logs(url: str, job_ref: str, rank: int | None) -> str | None:
    """``spotrain logs`` from the database file; None when ``url`` is not a SQLite file."""
    path = sqlite_path(url)
    if path is None:
        return None
    from autoscaler.client.logs import render_logs

    db = OfflineDb(path)
    j = db.job(job_ref)
    return render_logs(j.job_id, db.events(j.job_id), rank=rank)
