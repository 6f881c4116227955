"""Shipping each job's workdir on a thread of its own, never on the tick's (issue 21, finding 2).

Packing a workdir reads whatever its author left there (200,000 files took 68 s), so the remote
executor does not pack in ``start``: ``ref`` starts a build in the background the first time a job
asks and answers ``PENDING`` until it is done; the agent is not given its launch until then (it waits,
checking in as usual, as during a slow boot). A build that ends in a ``SpotrainError`` (the workdir
cannot be shipped) is kept as ``{"error": ...}``: the agent fails the ranks with that one line. One
that ends in a ``ProviderError`` (the store refused the archive) is the cloud's trouble: the next
ask after ``RETRY_S`` builds again, up to ``MAX_TRIES`` builds; then the last error is the outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoscaler.errors import SpotrainError
from cloud_providers.errors import ProviderError

log = logging.getLogger("spotrain.remote")

# What ``ref`` answers while the archive is being built (never sent to an agent).
PENDING: dict[str, Any] = {"pending": True}
RETRY_S = 10.0
MAX_TRIES = 5


def is_pending(workdir: Any) -> bool:
    return isinstance(workdir, dict) and workdir.get("pending") is True


class WorkdirShipper:
    """One build per job at a time, its outcome kept in memory (a restarted controller builds again:
    the archive is content-addressed, so the same tree gives the same URI)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._done: dict[str, dict[str, Any]] = {}
        self._running: dict[str, threading.Thread] = {}
        self._failed_at: dict[str, float] = {}
        self._tries: dict[str, int] = {}
        self._clock = clock

    def ref(self, job_id: str, workdir: Path, store_uri: str) -> dict[str, Any]:
        """``{uri, sha256, size}``, ``{error}``, or ``PENDING`` (a build runs: ask again later)."""
        with self._lock:
            done = self._done.get(job_id)
            if done is not None:
                return done
            failed = self._failed_at.get(job_id)
            if job_id not in self._running and (failed is None or self._clock() - failed >= RETRY_S):
                thread = threading.Thread(target=self._build, args=(job_id, workdir, store_uri),
                                          name=f"workdir-{job_id}", daemon=True)
                self._running[job_id] = thread
                thread.start()
        return PENDING

    def wait(self, job_id: str, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for a running build of ``job_id``: for tests and tools, never the tick."""
        with self._lock:
            thread = self._running.get(job_id)
        if thread is not None:
            thread.join(timeout_s)

    def _build(self, job_id: str, workdir: Path, store_uri: str) -> None:
        from autoscaler.jobs.workdir import ship

        outcome: dict[str, Any] | None
        try:
            ref = ship(workdir, store_uri)
            outcome = ref.to_json()
            log.info("job %s: workdir %s shipped as %s (%d bytes)", job_id, workdir, ref.uri, ref.size)
        except SpotrainError as exc:
            log.error("job %s: %s", job_id, exc)
            outcome = {"error": str(exc)}
        except ProviderError as exc:
            with self._lock:
                tries = self._tries[job_id] = self._tries.get(job_id, 0) + 1
            if tries < MAX_TRIES:
                log.warning("job %s: %s (try %d of %d; again in %.0f s)", job_id, exc, tries, MAX_TRIES, RETRY_S)
                outcome = None
            else:
                log.error("job %s: %s (after %d tries)", job_id, exc, tries)
                outcome = {"error": f"{exc} (after {tries} tries)"}
        except Exception as exc:  # noqa: BLE001 - a bug here must not leave the job waiting for ever
            log.exception("job %s: packing the workdir failed", job_id)
            outcome = {"error": f"workdir: packing failed: {type(exc).__name__}: {exc}"}
        with self._lock:
            self._running.pop(job_id, None)
            if outcome is None:
                self._failed_at[job_id] = self._clock()
            else:
                self._done[job_id] = outcome
                self._failed_at.pop(job_id, None)


__all__ = ["MAX_TRIES", "PENDING", "RETRY_S", "WorkdirShipper", "is_pending"]
