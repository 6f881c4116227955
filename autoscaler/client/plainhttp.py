"""A plain-HTTP (``http://``) connection to the controller on the standard library, for the CLI.

Why not httpx here: a CLI command is one process making one to three requests, and httpx costs more
than the request. Importing httpx/httpcore (and trio, which httpcore probes for) and building the SSL
context every ``httpx.Client`` makes, even for an ``http://127.0.0.1`` URL, made ``spotrain status``
7x as slow as ``spotrain --help`` on a loaded machine (1.2 s against 0.17 s), while the API answers in
0.04 s (issue 24; ``benchmarks/cli_startup.py``). Even ``http.client`` took ~20 ms to import (it
brings the ``email`` package), more than the two requests of ``status`` then took, so the little of
HTTP/1.1 a JSON API needs is written out here: a request with ``Content-Length``, an answer framed by
``Content-Length``, chunked encoding or the connection's end.

``https://`` URLs (a controller behind TLS) still go through httpx (``client/http.py``), as do
tests that hand in FastAPI's ``TestClient``. The answer type mimics the part of ``httpx.Response``
the client reads, so ``client/http.py`` treats both alike.

Errors: every failure to connect, send or read (``OSError``, timeouts included) and any answer that
is not HTTP/1.x is raised as ``TransportFailed``; ``client/http.py`` turns it into
``ControllerUnreachable`` as it does httpx's ``TransportError``.
"""

from __future__ import annotations

import json
import select
import socket
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from ..errors import SpotrainError


class TransportFailed(SpotrainError):
    """The request did not get an answer (refused, reset, timed out, or not HTTP)."""


class Headers(dict[str, str]):
    """An answer's headers by lower-case name; ``get`` takes any case, as httpx's ``Headers``."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class _NotHttp(SpotrainError):
    """The peer's answer is not HTTP/1.x as this reader knows it."""


class PlainResponse:
    """The parts of ``httpx.Response`` that ``client/http.py`` reads."""

    def __init__(self, status_code: int, headers: Headers, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        charset = self.headers.get("content-type", "").partition("charset=")[2].split(";")[0].strip(' "') or "utf-8"
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
        self._sock: socket.socket | None = None
        self._rfile: Any = None
        self.headers: dict[str, str] = {"Accept": "*/*", "User-Agent": "spotrain-cli"}

    def twin(self) -> PlainHttp:
        """Another connection to the same place with the same headers (for a request sent alongside)."""
        other = PlainHttp(f"http://{self._host}:{self._port}{self._prefix}", timeout_s=self._timeout_s)
        other.headers = dict(self.headers)
        return other

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                json: Any = None) -> PlainResponse:  # ``json``: the keyword httpx takes
        # The path percent-encoded as httpx does (a job name with a space, or a line break, stays in it).
        target = quote(self._prefix + path, safe="/!$&'()*+,;=:@-._~%") + (("?" + urlencode(params)) if params else "")
        headers = dict(self.headers)
        body: bytes | None = None
        if json is not None:
            body = _json_bytes(json)
            headers["Content-Type"] = "application/json"
        reused = self._sock is not None and not _server_closed(self._sock)
        if not reused:
            self.close()
        try:
            return self._send(method, target, body, headers)
        except (OSError, _NotHttp) as exc:
            self.close()
            if not (reused and method == "GET"):
                raise TransportFailed(str(exc) or type(exc).__name__) from exc
        try:
            return self._send(method, target, body, headers)
        except (OSError, _NotHttp) as exc:
            self.close()
            raise TransportFailed(str(exc) or type(exc).__name__) from exc

    def _send(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> PlainResponse:
        if self._sock is None:
            self._sock = socket.create_connection((self._host, self._port), timeout=self._timeout_s)
            self._rfile = self._sock.makefile("rb")
        head = [f"{method} {target} HTTP/1.1", f"Host: {self._host}:{self._port}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method not in ("GET", "HEAD"):
            head.append(f"Content-Length: {len(body or b'')}")
        self._sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
        status, version, answer_headers = self._read_head()
        content = self._read_body(method, status, answer_headers)
        conn = answer_headers.get("connection", "").lower()
        if "close" in conn or (version == "HTTP/1.0" and "keep-alive" not in conn):
            self.close()
        return PlainResponse(status, answer_headers, content)

    def _read_head(self) -> tuple[int, str, Headers]:
        line = self._rfile.readline(65537)
        if not line:
            raise _NotHttp("the connection closed without an answer")
        version, _, rest = line.decode("latin-1").partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise _NotHttp(f"not an HTTP answer: {line[:80]!r}")
        headers = Headers()
        for _ in range(200):
            raw = self._rfile.readline(65537)
            if raw in (b"\r\n", b"\n", b""):
                return int(code), version, headers
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        raise _NotHttp("too many header lines")

    def _read_body(self, method: str, status: int, headers: Headers) -> bytes:
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size_line = self._rfile.readline(65537).split(b";")[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise _NotHttp(f"bad chunk size {size_line[:20]!r}") from None
                if size == 0:
                    while self._rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self._exactly(size))
                self._rfile.readline(65537)
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise _NotHttp(f"bad Content-Length {length[:20]!r}")
            return self._exactly(int(length))
        content: bytes = self._rfile.read()  # framed by the connection's end
        self.close()
        return content

    def _exactly(self, n: int) -> bytes:
        data: bytes = self._rfile.read(n)
        if len(data) != n:
            raise _NotHttp(f"the answer ended after {len(data)} of {n} bytes")
        return data

    def close(self) -> None:
        if self._rfile is not None:
            self._rfile.close()
            self._rfile = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _json_bytes(value: Any) -> bytes:
    """The body as httpx encodes ``json=``: compact UTF-8, NaN refused."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _server_closed(sock: socket.socket) -> bool:
    """Whether an idle keep-alive connection has become readable: the server closed it (or sent
    something unasked); either way it must not carry the next request."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
