"""A loopback fake of the GCE metadata server (``computeMetadata/v1``), with its long-poll.

Serves, on 127.0.0.1 and an ephemeral port, the instance documents a Spot VM's agent reads:
``instance/preempted`` (``FALSE`` until :meth:`FakeGceMetadata.preempt`), ``instance/name``,
``instance/id``, ``instance/zone``, ``instance/hostname`` and ``instance/network-interfaces/0/ip``.
As the real server does, it

- refuses a request without ``Metadata-Flavor: Google`` (403) or with ``X-Forwarded-For`` (a
  request relayed by a proxy), and answers every request with ``Metadata-Flavor: Google``;
- gives each value an ``ETag``; ``?wait_for_change=true`` holds the request until the value differs
  from ``last_etag`` (at once if it already does) or ``timeout_sec`` passes, then answers with the
  current value and its ETag.

``impostor=True`` answers without the ``Metadata-Flavor`` response header (whatever else might answer
on ``metadata.google.internal``), for the client's check. ``requests`` records (path, query) of each
request; ``waits`` counts the long-polls that are waiting now. Use as a context manager; ``endpoint``
is the base URL for ``SPOTRAIN_GCE_METADATA_ENDPOINT`` / ``AgentConfig.gce_metadata_endpoint``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

PREFIX = "/computeMetadata/v1/instance/"
MAX_WAIT_S = 60.0  # the fake's cap on timeout_sec (the real server allows much longer)


def etag_of(value: str) -> str:
    return hashlib.md5(value.encode()).hexdigest()[:16]  # noqa: S324 - an ETag, not security


class FakeGceMetadata:
    def __init__(self, *, name: str = "spotrain-vm-1", zone: str = "us-central1-a", ip: str = "10.128.0.7",
                 impostor: bool = False) -> None:
        self.values: dict[str, str] = {
            "preempted": "FALSE", "name": name, "id": "4520031799277581759", "hostname": f"{name}.c.test.internal",
            "zone": f"projects/123456789012/zones/{zone}", "network-interfaces/0/ip": ip,
        }
        self.impostor = impostor
        self.requests: list[tuple[str, str]] = []
        self.waits = 0
        self._closing = False
        self._changed = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-gce-metadata", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeGceMetadata:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # --- scripting the fake
    def set(self, key: str, value: str) -> None:
        with self._changed:
            self.values[key] = value
            self._changed.notify_all()

    def preempt(self) -> None:
        """Compute has begun preempting the VM: ``preempted`` turns TRUE (30 s before it stops)."""
        self.set("preempted", "TRUE")

    def wait_for_waiters(self, n: int = 1, timeout_s: float = 5.0) -> None:
        """Block until ``n`` long-polls are waiting (so a test flips a value under a waiting client)."""
        with self._changed:  # a long-poll that starts waiting notifies
            if not self._changed.wait_for(lambda: self.waits >= n, timeout_s):
                raise AssertionError(f"{self.waits} long-polls waiting, expected {n}")

    # --- HTTP
    def _answer(self, key: str, query: dict[str, str]) -> tuple[int, str, str]:
        """(status, body, etag), after the long-poll when one was asked for."""
        with self._changed:
            if key not in self.values:
                return 404, "not found", ""
            if query.get("wait_for_change", "").lower() == "true":
                last = query.get("last_etag") or etag_of(self.values[key])
                timeout_s = min(float(query.get("timeout_sec", MAX_WAIT_S)), MAX_WAIT_S)
                deadline = time.monotonic() + timeout_s
                self.waits += 1
                self._changed.notify_all()  # for wait_for_waiters (a waiting long-poll re-checks, waits on)
                try:
                    while etag_of(self.values[key]) == last and not self._closing:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._changed.wait(left)
                finally:
                    self.waits -= 1
            value = self.values[key]
            return 200, value, etag_of(value)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, code: int, body: str, etag: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                if not fake.impostor:
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                if etag:
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                fake.requests.append((url.path, url.query))
                if self.headers.get("Metadata-Flavor") != "Google" or self.headers.get("X-Forwarded-For"):
                    return self._send(403, "Missing Metadata-Flavor:Google header.")
                if not url.path.startswith(PREFIX):
                    return self._send(404, "not found")
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                self._send(*fake._answer(url.path[len(PREFIX):], query))

        return Handler
