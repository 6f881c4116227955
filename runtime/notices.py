"""Notice sources: the controller's notice file, SIGTERM, AWS IMDS and GCE metadata.

A *stop* notice (preemption, rescale directive, cancel, SIGTERM) makes every rank stop at the same
next minibatch boundary, checkpoint and exit with ``EXIT_RESCHEDULE``. An AWS *rebalance
recommendation* is an early warning, not a reclaim: it asks for a checkpoint now and training goes on.

Metadata servers are link-local addresses; they are polled only when ``SPOTRAIN_NOTICE_SOURCES``
names them (``aws-imds``, ``gce-metadata``), from a background thread, through a urllib opener that
ignores proxy settings. IMDSv2 is used (a session token from ``PUT /latest/api/token`` first):
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html and
https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted.

The agent (``cloud_providers/remote/metadata.py``) reads the same documents for the controller: its
classes are ``AwsImds`` and ``GceMetadata``, these are the workers' own pollers, named apart so that
an import cannot pick the wrong one. The dependency rule (runtime imports only cost_models,
cloud_providers nothing of ours) keeps the two HTTP clients apart; where an agent runs, it writes what
it sees into the notice file, and the workers need no metadata source of their own.
"""

from __future__ import annotations

import calendar
import http.client
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable

from . import protocol
from .config import NOTICE_SOURCE_AWS, NOTICE_SOURCE_GCE, NoticeConfig

log = logging.getLogger(__name__)

GCE_NOTICE_S = 30.0
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Notice:
    reason: str
    source: str
    deadline_unix_s: float | None = None
    stop: bool = True


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


def _parse_iso_utc(text: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, TypeError):
        return None


class ImdsNoticePoller:
    """Polls the spot instance-action and rebalance-recommendation documents (IMDSv2)."""

    TOKEN_TTL_S = 21600

    def __init__(self, endpoint: str, timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s
        self._token: str | None = None
        self._token_expiry = 0.0

    def _get_token(self) -> str:
        if self._token is None or time.time() > self._token_expiry:
            req = urllib.request.Request(
                f"{self.endpoint}/latest/api/token", method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)},
            )
            with _HTTP.open(req, timeout=self.timeout_s) as resp:
                self._token = resp.read().decode().strip()
            self._token_expiry = time.time() + self.TOKEN_TTL_S / 2
        return self._token

    def _get(self, path: str) -> Any | None:
        req = urllib.request.Request(f"{self.endpoint}{path}", headers={"X-aws-ec2-metadata-token": self._get_token()})
        try:
            with _HTTP.open(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                self._token = None
            if exc.code in (401, 404):
                return None
            raise

    def check(self) -> list[Notice]:
        notices = []
        action = self._get("/latest/meta-data/spot/instance-action")
        if isinstance(action, dict) and action.get("action"):
            notices.append(Notice(reason=protocol.NOTICE_PREEMPTION, source=NOTICE_SOURCE_AWS,
                                  deadline_unix_s=_parse_iso_utc(action.get("time", ""))))
        rebalance = self._get("/latest/meta-data/events/recommendations/rebalance")
        if isinstance(rebalance, dict) and rebalance.get("noticeTime"):
            notices.append(Notice(reason=protocol.NOTICE_REBALANCE, source=NOTICE_SOURCE_AWS, stop=False))
        return notices


class GcePreemptedPoller:
    """Polls ``instance/preempted`` (``TRUE`` once the instance is being preempted)."""

    def __init__(self, endpoint: str, timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s

    def check(self) -> list[Notice]:
        req = urllib.request.Request(f"{self.endpoint}/computeMetadata/v1/instance/preempted",
                                     headers={"Metadata-Flavor": "Google"})
        with _HTTP.open(req, timeout=self.timeout_s) as resp:
            body = resp.read().decode().strip().upper()
        if body == "TRUE":
            return [Notice(reason=protocol.NOTICE_PREEMPTION, source=NOTICE_SOURCE_GCE,
                           deadline_unix_s=time.time() + GCE_NOTICE_S)]
        return []


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
        self._pollers: list[ImdsNoticePoller | GcePreemptedPoller] = []
        if NOTICE_SOURCE_AWS in config.sources:
            self._pollers.append(ImdsNoticePoller(config.aws_imds_endpoint))
        if NOTICE_SOURCE_GCE in config.sources:
            self._pollers.append(GcePreemptedPoller(config.gce_metadata_endpoint))

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
                except (OSError, ValueError, http.client.HTTPException) as exc:
                    # A flaky metadata server (a reset, a short read) must not end the watch.
                    log.debug("notice source %s unavailable: %s", type(poller).__name__, exc)
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
