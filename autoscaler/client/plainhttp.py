"""A plain-HTTP (``http://``) connection to the controller on the standard library, for the CLI.

Why not httpx here: a CLI command is one process making one to three requests, and httpx costs more
than the request. Importing httpx/httpcore (and trio, which httpcore probes for) and building the SSL
context every ``httpx.Client`` makes, even for an ``http://127.0.0.1`` URL, made ``spotrain status``
7x as slow as ``spotrain --help`` on a loaded machine (1.2 s against 0.17 s), while the API answers in
0.04 s (issue 24; ``benchmarks/cli_startup.py``). ``http.client`` costs ~15 ms to import and builds
no SSL context for plain HTTP.

``https://`` URLs (a controller behind TLS) still go through httpx (``client/http.py``), as do
tests that hand in FastAPI's ``TestClient``. The answer type mimics the part of ``httpx.Response``
the client reads, so ``client/http.py`` treats both alike.

Errors: every failure to connect, send or read (``OSError``, timeouts included, and
``http.client.HTTPException``) is raised as ``TransportFailed``; ``client/http.py`` turns it into
``ControllerUnreachable`` as it does httpx's ``TransportError``.
"""

from __future__ import annotations

import http.client
import json
import select
from typing import Any
from urllib.parse import urlencode, urlsplit


class TransportFailed(Exception):
    """The request did not get an answer (refused, reset, timed out, or not HTTP)."""


class PlainResponse:
    """The parts of ``httpx.Response`` that ``client/http.py`` reads."""

    def __init__(self, status_code: int, headers: http.client.HTTPMessage, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers  # case-insensitive ``get``, as httpx's Headers
        self.content = content

    @property
    def text(self) -> str:
        charset = self.headers.get_content_charset() or "utf-8"
        try:
            return self.content.decode(charset, errors="replace")
        except LookupError:  # a charset Python does not know
            return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class PlainHttp:
    """One keep-alive HTTP/1.1 connection to ``base_url`` (``http://host[:port][/prefix]``).

    A connection the server has closed while idle (uvicorn closes after 5 s; ``spotrain logs -f``
    polls slower than that at times) is noticed before it is reused, and a GET that fails on a
    reused connection is sent once more on a fresh one; other methods are never resent.
    """

    def __init__(self, base_url: str, *, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http:// URL: {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self.headers: dict[str, str] = {"Accept": "*/*", "User-Agent": "spotrain-cli"}

    def twin(self) -> PlainHttp:
        """Another connection to the same place with the same headers (for a request sent alongside)."""
        other = PlainHttp(f"http://{self._host}:{self._port}{self._prefix}", timeout_s=self._timeout_s)
        other.headers = dict(self.headers)
        return other

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                json: Any = None) -> PlainResponse:  # ``json``: the keyword httpx takes
        target = self._prefix + path + (("?" + urlencode(params)) if params else "")
        headers = dict(self.headers)
        body: bytes | None = None
        if json is not None:
            body = _json_bytes(json)
            headers["Content-Type"] = "application/json"
        reused = self._conn is not None and not _server_closed(self._conn)
        if not reused:
            self.close()
        try:
            return self._send(method, target, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            if not (reused and method == "GET"):
                raise TransportFailed(str(exc) or type(exc).__name__) from exc
        try:
            return self._send(method, target, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise TransportFailed(str(exc) or type(exc).__name__) from exc

    def _send(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> PlainResponse:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        self._conn.request(method, target, body=body, headers=headers)
        r = self._conn.getresponse()
        content = r.read()
        if r.will_close:
            self.close()
        return PlainResponse(r.status, r.headers, content)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _json_bytes(value: Any) -> bytes:
    """The body as httpx encodes ``json=``: compact UTF-8, NaN refused."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _server_closed(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle keep-alive connection has become readable: the server closed it (or sent
    something unasked); either way it must not carry the next request."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
