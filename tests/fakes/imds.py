"""A loopback fake of the AWS instance metadata service (IMDSv2) and the GCE metadata server.

Serves, on 127.0.0.1 and an ephemeral port:

- ``PUT /latest/api/token`` (needs ``X-aws-ec2-metadata-token-ttl-seconds``) -> a session token
- ``GET /latest/meta-data/spot/instance-action`` -> 404, or ``{"action": ..., "time": ...}`` once set
- ``GET /latest/meta-data/events/recommendations/rebalance`` -> 404, or ``{"noticeTime": ...}``
- ``GET /latest/meta-data/instance-id`` -> the instance id
- ``GET /computeMetadata/v1/instance/preempted`` (needs ``Metadata-Flavor: Google``) -> FALSE / TRUE

AWS GETs without a valid token get 401, as IMDSv2 with ``HttpTokens=required`` does. Use as a
context manager; ``endpoint`` is the base URL to put in ``SPOTRAIN_AWS_IMDS_ENDPOINT`` /
``SPOTRAIN_GCE_METADATA_ENDPOINT``. ``requests`` records (method, path) of every request.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeMetadataServer:
    def __init__(self, *, instance_id: str = "i-0123456789abcdef0") -> None:
        self.instance_id = instance_id
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        self.gce_preempted = False
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-imds", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeMetadataServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- scripting the fake
    def notice_spot_interruption(self, *, action: str = "terminate", in_s: float = 120.0) -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + in_s))
        with self._lock:
            self.instance_action = {"action": action, "time": when}

    def recommend_rebalance(self) -> None:
        with self._lock:
            self.rebalance = {"noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def preempt_gce(self) -> None:
        with self._lock:
            self.gce_preempted = True

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, code: int, body: str, content_type: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(code)
                if self.path.startswith("/computeMetadata/"):
                    self.send_header("Metadata-Flavor", "Google")  # as GCE's server answers (clients check it)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                fake.requests.append(("PUT", self.path))
                if self.path != "/latest/api/token":
                    return self._send(404, "not found")
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400, "missing ttl")
                token = uuid.uuid4().hex
                with fake._lock:
                    fake.tokens.add(token)
                self._send(200, token)

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path))
                if self.path.startswith("/computeMetadata/"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403, "missing Metadata-Flavor header")
                    if self.path.split("?")[0] == "/computeMetadata/v1/instance/preempted":
                        return self._send(200, "TRUE" if fake.gce_preempted else "FALSE")
                    return self._send(404, "not found")
                if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                    return self._send(401, "unauthorized")
                with fake._lock:
                    docs = {
                        "/latest/meta-data/spot/instance-action": fake.instance_action,
                        "/latest/meta-data/events/recommendations/rebalance": fake.rebalance,
                    }
                if self.path == "/latest/meta-data/instance-id":
                    return self._send(200, fake.instance_id)
                doc = docs.get(self.path)
                if doc is None:
                    return self._send(404, "not found")
                self._send(200, json.dumps(doc), "application/json")

        return Handler
