"""Notice sources: the controller's notice file, SIGTERM, AWS IMDS and GCE metadata.

A *stop* notice (preemption, rescale directive, cancel, SIGTERM) makes every rank stop at the same
next minibatch boundary, checkpoint and exit with ``EXIT_RESCHEDULE``. An AWS *rebalance
recommendation* is an early warning, not a reclaim: it asks for a checkpoint now and training goes on.

Metadata servers are link-local addresses; they are polled only when ``SPOTRAIN_NOTICE_SOURCES``
names them (``aws-imds``, ``gce-metadata``), from a background thread. What the documents are and
mean (IMDSv2 tokens, the spot and rebalance documents, GCE's ``preempted``, the deadlines, what counts
as a failure) is ``cost_models/spot_notices.py``, the one pure client; this module gives it a urllib
transport that ignores proxy settings, and polls GCE with plain reads (one thread serves every source
here, so it must not sit in a long-poll). Where an agent runs, it writes what it sees into the notice
file too.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any, Callable

from cost_models.spot_notices import SOURCE_AWS, SOURCE_GCE, Answer, AwsImds, GceMetadata, Notice

from . import protocol
from .config import NoticeConfig
from .errors import NoticeSourceError

__all__ = ["Notice", "NoticeWatcher", "UrllibTransport", "read_notice_file"]

log = logging.getLogger(__name__)


class UrllibTransport:
    """The runtime's HTTP for :mod:`cost_models.spot_notices`: stdlib only, proxies ignored."""

    def __init__(self) -> None:
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(self, method: str, url: str, headers: Mapping[str, str], timeout_s: float) -> Answer:
        req = urllib.request.Request(url, method=method, headers=dict(headers))
        try:
            with self._opener.open(req, timeout=timeout_s) as resp:
                return resp.status, resp.read().decode(errors="replace"), _lower(resp.headers.items())
        except urllib.error.HTTPError as exc:  # an answer, with a status other than 2xx
            return exc.code, exc.read().decode(errors="replace"), _lower(exc.headers.items())
        except http.client.HTTPException as exc:  # a garbled answer is no answer
            raise OSError(f"{type(exc).__name__}: {exc}") from exc

    def failure(self, message: str) -> Exception:
        return NoticeSourceError(message)


def _lower(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers}


def read_notice_file(path: str) -> Notice | None:
    """The notice in ``path`` if the file exists; an unreadable body still counts as a preemption."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return Notice(reason=protocol.NOTICE_PREEMPTION, source="file")
    try:
        body = json.loads(raw or b"{}")
        reason = str(body.get("reason") or protocol.NOTICE_PREEMPTION)
        deadline = body.get("deadline_unix_s")
        return Notice(reason=reason, source="file", deadline_unix_s=float(deadline) if deadline is not None else None)
    except (ValueError, AttributeError, TypeError):
        return Notice(reason=protocol.NOTICE_PREEMPTION, source="file")


class NoticeWatcher:
    """Merges every configured source; :meth:`poll` is cheap enough to call every step."""

    def __init__(self, config: NoticeConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._stop_notice: Notice | None = None
        self._pending_checkpoint: Notice | None = None
        self._rebalance_seen = False
        self._sigterm = False  # set by the SIGTERM handler, read by poll()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._old_handler: Callable[[int, FrameType | None], Any] | int | None = None
        self._pollers: list[AwsImds | GceMetadata] = []
        transport = UrllibTransport()
        if SOURCE_AWS in config.sources:
            self._pollers.append(AwsImds(transport, config.aws_imds_endpoint, rebalance=True))
        if SOURCE_GCE in config.sources:
            self._pollers.append(GceMetadata(transport, config.gce_metadata_endpoint, wait_for_change=False))

    def start(self) -> "NoticeWatcher":
        if self.config.handle_sigterm and threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        if self._pollers:
            self._thread = threading.Thread(target=self._poll_loop, name="spotrain-notices", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        if self._old_handler is not None:
            signal.signal(signal.SIGTERM, self._old_handler)
            self._old_handler = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Signal handlers run on the main thread between bytecodes, possibly while it holds
        # ``self._lock`` (in ``poll``): taking the lock here could deadlock. Only set a flag;
        # ``poll`` turns it into the notice.
        self._sigterm = True

    def _record(self, notice: Notice) -> None:
        with self._lock:
            if notice.stop:
                if self._stop_notice is None:
                    self._stop_notice = notice
            elif not self._rebalance_seen:
                self._rebalance_seen = True
                self._pending_checkpoint = notice

    def _poll_loop(self) -> None:
        while not self._closing.is_set():
            for poller in self._pollers:
                try:
                    for notice in poller.check():
                        self._record(notice)
                except NoticeSourceError as exc:
                    # A flaky metadata server (a reset, a short read) must not end the watch.
                    log.debug("notice source %s unavailable: %s", poller.name, exc)
            self._closing.wait(self.config.poll_interval_s)

    def poll(self) -> tuple[Notice | None, Notice | None]:
        """(stop notice, checkpoint-only notice); the latter is returned once."""
        if self._sigterm and self._stop_notice is None:
            self._record(Notice(reason=protocol.NOTICE_PREEMPTION, source="sigterm"))
        if self._stop_notice is None and self.config.notice_file and os.path.exists(self.config.notice_file):
            found = read_notice_file(self.config.notice_file)
            if found is not None:
                self._record(found)
        with self._lock:
            pending, self._pending_checkpoint = self._pending_checkpoint, None
            return self._stop_notice, pending
