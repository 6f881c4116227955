"""A loopback fake of the Google Cloud Storage JSON API, for the real ``google-cloud-storage`` client.

Plain HTTP on 127.0.0.1 and an ephemeral port; point the client at it the library's own way,
``STORAGE_EMULATOR_HOST=<endpoint>`` (the client then uses anonymous credentials and no project). No
method of the client is patched: what the tests exercise is the client's own wire protocol. The
subset served is what ``runtime/store.py``'s ``GcsStore`` and the tests use:

- buckets: ``POST /storage/v1/b`` (insert), ``GET /storage/v1/b/{bucket}``
- uploads: ``POST /upload/storage/v1/b/{bucket}/o?uploadType=media|multipart|resumable``; a resumable
  session takes ``PUT`` chunks with ``Content-Range: bytes a-b/total`` (``*`` while the total is
  unknown), answers ``308`` with ``Range`` until the last one, and a status query
  (``Content-Range: bytes */total``) says how much it has. A multipart upload that carries
  ``crc32c`` / ``md5Hash`` is checked against them (400 on a mismatch), as GCS does.
- objects: ``GET /storage/v1/b/{bucket}/o/{name}`` (metadata, or the bytes with ``alt=media``; also
  under ``/download/storage/v1/...``), with ``Range`` and an ``x-goog-hash`` header the client checks;
  ``DELETE``; ``GET /storage/v1/b/{bucket}/o`` lists with ``prefix``, ``delimiter``, ``maxResults`` and
  ``pageToken``.
- preconditions: ``ifGenerationMatch`` / ``ifGenerationNotMatch`` / ``ifMetagenerationMatch`` on
  uploads, reads and deletes (412 ``conditionNotMet``); ``ifGenerationMatch=0`` means "must not exist".

An object becomes visible only when its upload completes, which is the atomicity GCS gives. Scripting
for tests: ``create_bucket``, ``put`` / ``get`` (bypassing HTTP), ``corrupt`` (flip a byte in place,
keeping the stored hashes, as bit rot would: the client's download check or the store's sha256 must
catch it), ``truncate``, ``fail_next(n, status, match=...)`` (transient errors: 429, 503), and
``requests`` (method, path, query) of every request.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import json
import re
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlparse

import google_crc32c


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def crc32c_b64(data: bytes) -> str:
    return _b64(struct.pack(">I", google_crc32c.value(data)))


def md5_b64(data: bytes) -> str:
    return _b64(hashlib.md5(data).digest())  # noqa: S324 - GCS's own integrity field, not security


@dataclass
class FakeObject:
    bucket: str
    name: str
    data: bytes
    generation: int
    content_type: str = "application/octet-stream"
    metageneration: int = 1
    created: float = field(default_factory=time.time)
    # Hashes as stored at upload; ``corrupt`` changes the bytes but not these (bit rot).
    crc32c: str = ""
    md5: str = ""

    def resource(self, endpoint: str) -> dict[str, Any]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(self.created))
        path = f"b/{self.bucket}/o/{quote(self.name, safe='')}"
        return {
            "kind": "storage#object", "id": f"{self.bucket}/{self.name}/{self.generation}",
            "selfLink": f"{endpoint}/storage/v1/{path}",
            "mediaLink": f"{endpoint}/download/storage/v1/{path}?generation={self.generation}&alt=media",
            "name": self.name, "bucket": self.bucket, "generation": str(self.generation),
            "metageneration": str(self.metageneration), "contentType": self.content_type,
            "storageClass": "STANDARD", "size": str(len(self.data)), "md5Hash": self.md5, "crc32c": self.crc32c,
            "etag": _b64(f"{self.generation}".encode()), "timeCreated": stamp, "updated": stamp,
        }


@dataclass
class _Session:
    bucket: str
    name: str
    content_type: str
    preconditions: dict[str, str]
    data: bytearray = field(default_factory=bytearray)


@dataclass
class _Fault:
    remaining: int
    status: int
    match: str  # substring of "METHOD path"


class GcsError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class FakeGcs:
    """Use as a context manager; ``endpoint`` goes into ``STORAGE_EMULATOR_HOST``."""

    def __init__(self, *, page_size: int = 1000) -> None:
        self.page_size = page_size  # the most items a list page returns (the client's maxResults may lower it)
        self.buckets: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str], FakeObject] = {}
        self.requests: list[tuple[str, str, str]] = []
        self._sessions: dict[str, _Session] = {}
        self._faults: list[_Fault] = []
        self._generation = int(time.time() * 1e6)
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-gcs", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeGcs:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- scripting
    def create_bucket(self, name: str) -> None:
        with self._lock:
            self.buckets.setdefault(name, {"kind": "storage#bucket", "id": name, "name": name,
                                           "location": "US", "storageClass": "STANDARD", "metageneration": "1"})

    def put(self, bucket: str, name: str, data: bytes) -> FakeObject:
        with self._lock:
            self._need_bucket(bucket)
            return self._store(bucket, name, data, "application/octet-stream")

    def get(self, bucket: str, name: str) -> bytes:
        with self._lock:
            return self.objects[(bucket, name)].data

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(n for (b, n) in self.objects if b == bucket and n.startswith(prefix))

    def corrupt(self, bucket: str, name: str, *, offset: int = -3) -> None:
        """Flip one bit of the stored bytes; the stored crc32c/md5 stay those of the upload."""
        with self._lock:
            obj = self.objects[(bucket, name)]
            data = bytearray(obj.data)
            data[offset] ^= 0x01
            obj.data = bytes(data)

    def truncate(self, bucket: str, name: str) -> None:
        with self._lock:
            obj = self.objects[(bucket, name)]
            obj.data = obj.data[: len(obj.data) // 2]

    def fail_next(self, n: int, status: int = 503, *, match: str = "") -> None:
        """The next ``n`` requests whose "METHOD path" contains ``match`` get ``status``."""
        with self._lock:
            self._faults.append(_Fault(n, status, match))

    def count(self, method: str, path_part: str = "") -> int:
        return sum(1 for m, p, _ in self.requests if m == method and path_part in p)

    # ----------------------------------------------------------------- model
    def _need_bucket(self, bucket: str) -> None:
        if bucket not in self.buckets:
            raise GcsError(404, "notFound", f"The specified bucket does not exist: {bucket}")

    def _store(self, bucket: str, name: str, data: bytes, content_type: str) -> FakeObject:
        self._generation += 1
        obj = FakeObject(bucket=bucket, name=name, data=bytes(data), generation=self._generation,
                         content_type=content_type or "application/octet-stream",
                         crc32c=crc32c_b64(data), md5=md5_b64(data))
        self.objects[(bucket, name)] = obj
        return obj

    def _check(self, bucket: str, name: str, query: dict[str, str]) -> FakeObject | None:
        """The current object (or None), after the request's preconditions (412 when one fails)."""
        obj = self.objects.get((bucket, name))
        current = obj.generation if obj is not None else 0
        if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != current:
            raise GcsError(412, "conditionNotMet", "At least one of the pre-conditions you specified did not hold.")
        if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"]) == current:
            raise GcsError(304 if obj is not None else 412, "notModified", "not modified")
        if "ifMetagenerationMatch" in query and (obj is None or int(query["ifMetagenerationMatch"]) != obj.metageneration):
            raise GcsError(412, "conditionNotMet", "At least one of the pre-conditions you specified did not hold.")
        if "generation" in query and obj is not None and int(query["generation"]) != obj.generation:
            return None  # an older generation: not kept (no versioning)
        return obj

    def _fault_for(self, method: str, path: str) -> int | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.match in f"{method} {path}":
                    fault.remaining -= 1
                    return fault.status
        return None

    def _list(self, bucket: str, query: dict[str, str]) -> dict[str, Any]:
        self._need_bucket(bucket)
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        limit = min(int(query.get("maxResults", self.page_size)), self.page_size)
        entries: list[tuple[str, FakeObject | None]] = []  # (name or prefix, object or None for a prefix)
        seen_prefixes: set[str] = set()
        for (b, name), obj in sorted(self.objects.items()):
            if b != bucket or not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0] + delimiter
                if common not in seen_prefixes:
                    seen_prefixes.add(common)
                    entries.append((common, None))
                continue
            entries.append((name, obj))
        entries.sort(key=lambda e: e[0])
        token = query.get("pageToken")
        if token:
            after = base64.urlsafe_b64decode(token.encode()).decode()
            entries = [e for e in entries if e[0] > after]
        page, more = entries[:limit], len(entries) > limit
        out: dict[str, Any] = {"kind": "storage#objects"}
        items = [obj.resource(self.endpoint) for _, obj in page if obj is not None]
        prefixes = [key for key, obj in page if obj is None]
        if items:
            out["items"] = items
        if prefixes:
            out["prefixes"] = prefixes
        if more:
            out["nextPageToken"] = base64.urlsafe_b64encode(page[-1][0].encode()).decode()
        return out

    # ----------------------------------------------------------------- HTTP
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the client's requests session expects
            disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms stalls

            def log_message(self, format: str, *args: Any) -> None:
                pass

            # --- plumbing
            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None,
                      content_type: str = "application/json; charset=UTF-8") -> None:
                self.send_response(code)
                if body or code not in (204, 304):
                    self.send_header("Content-Type", content_type)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body and self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, code: int, doc: Any, headers: dict[str, str] | None = None) -> None:
                self._send(code, json.dumps(doc).encode(), headers)

            def _error(self, err: GcsError) -> None:
                if err.status == 304:
                    return self._send(304)
                self._json(err.status, {"error": {"code": err.status, "message": err.message,
                                                  "errors": [{"domain": "global", "reason": err.reason,
                                                              "message": err.message}]}})

            def _dispatch(self) -> None:
                url = urlparse(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
                fake.requests.append((self.command, url.path, url.query))
                body = self._body() if self.command in ("POST", "PUT", "PATCH") else b""
                status = fake._fault_for(self.command, url.path)
                if status is not None:
                    reason = {429: "rateLimitExceeded", 503: "backendError"}.get(status, "injected")
                    return self._error(GcsError(status, reason, f"injected HTTP {status}"))
                try:
                    with fake._lock:
                        self._route(url.path, query, body)
                except GcsError as err:
                    self._error(err)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _dispatch

            # --- routes
            def _route(self, path: str, query: dict[str, str], body: bytes) -> None:
                m = re.fullmatch(r"/(?:download/)?storage/v1/b/([^/]+)/o/(.+)", path)
                if m:
                    bucket, name = unquote(m.group(1)), unquote(m.group(2))
                    return self._object(bucket, name, query)
                m = re.fullmatch(r"/storage/v1/b/([^/]+)/o", path)
                if m and self.command == "GET":
                    return self._json(200, fake._list(unquote(m.group(1)), query))
                m = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", path)
                if m:
                    return self._upload(unquote(m.group(1)), query, body)
                m = re.fullmatch(r"/storage/v1/b/([^/]+)", path)
                if m and self.command == "GET":
                    bucket = unquote(m.group(1))
                    fake._need_bucket(bucket)
                    return self._json(200, fake.buckets[bucket])
                if path == "/storage/v1/b" and self.command == "POST":
                    name = json.loads(body or b"{}").get("name", "")
                    if name in fake.buckets:
                        raise GcsError(409, "conflict", f"bucket {name} already exists")
                    fake.create_bucket(name)
                    return self._json(200, fake.buckets[name])
                raise GcsError(404, "notFound", f"no such route: {self.command} {path}")

            def _object(self, bucket: str, name: str, query: dict[str, str]) -> None:
                fake._need_bucket(bucket)
                obj = fake._check(bucket, name, query)
                if obj is None:
                    raise GcsError(404, "notFound", f"No such object: {bucket}/{name}")
                if self.command == "DELETE":
                    del fake.objects[(bucket, name)]
                    return self._send(204)
                if self.command != "GET":
                    raise GcsError(405, "methodNotAllowed", f"{self.command} on an object")
                if query.get("alt") != "media":
                    return self._json(200, obj.resource(fake.endpoint))
                data, code = obj.data, 200
                headers = {"x-goog-generation": str(obj.generation), "x-goog-metageneration": str(obj.metageneration),
                           "x-goog-hash": f"crc32c={obj.crc32c},md5={obj.md5}",
                           "x-goog-stored-content-length": str(len(obj.data))}
                rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if rng:
                    start = int(rng.group(1))
                    end = int(rng.group(2)) if rng.group(2) else len(data) - 1
                    if start >= len(data) and len(data) > 0:
                        raise GcsError(416, "requestedRangeNotSatisfiable", "range not satisfiable")
                    end = min(end, len(data) - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    data, code = data[start : end + 1], 206
                self._send(code, data, headers, obj.content_type)

            def _upload(self, bucket: str, query: dict[str, str], body: bytes) -> None:
                kind = query.get("uploadType")
                if self.command == "PUT" and kind == "resumable" and "upload_id" in query:
                    return self._resume(query["upload_id"], body)
                if self.command != "POST":
                    raise GcsError(405, "methodNotAllowed", f"{self.command} upload")
                fake._need_bucket(bucket)
                if kind == "media":
                    name = query.get("name", "")
                    fake._check(bucket, name, query)
                    obj = fake._store(bucket, name, body, self.headers.get("Content-Type", ""))
                    return self._json(200, obj.resource(fake.endpoint))
                if kind == "multipart":
                    meta, data, content_type = self._parts(body)
                    name = meta.get("name") or query.get("name", "")
                    fake._check(bucket, name, query)
                    for key, want in (("crc32c", crc32c_b64(data)), ("md5Hash", md5_b64(data))):
                        if key in meta and meta[key] != want:
                            raise GcsError(400, "invalid", f"Provided {key} {meta[key]!r} doesn't match calculated {want!r}.")
                    obj = fake._store(bucket, name, data, meta.get("contentType") or content_type)
                    return self._json(200, obj.resource(fake.endpoint))
                if kind == "resumable":
                    meta = json.loads(body or b"{}")
                    name = meta.get("name") or query.get("name", "")
                    fake._check(bucket, name, query)
                    upload_id = uuid.uuid4().hex
                    keep = {k: v for k, v in query.items() if k.startswith("if")}
                    fake._sessions[upload_id] = _Session(bucket, name, meta.get("contentType", ""), keep)
                    location = f"{fake.endpoint}/upload/storage/v1/b/{quote(bucket)}/o?uploadType=resumable&upload_id={upload_id}"
                    return self._send(200, b"", {"Location": location})
                raise GcsError(400, "invalid", f"uploadType {kind!r} is not supported by the fake")

            def _parts(self, body: bytes) -> tuple[dict[str, Any], bytes, str]:
                head = f"Content-Type: {self.headers.get('Content-Type', '')}\r\n\r\n".encode()
                msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
                parts = list(msg.iter_parts())
                if len(parts) != 2:
                    raise GcsError(400, "invalid", f"multipart upload with {len(parts)} parts")
                meta = json.loads(parts[0].get_payload(decode=True) or b"{}")
                data = parts[1].get_payload(decode=True) or b""
                return meta, data, parts[1].get_content_type()

            def _resume(self, upload_id: str, body: bytes) -> None:
                session = fake._sessions.get(upload_id)
                if session is None:
                    raise GcsError(404, "notFound", "no such upload session")
                m = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", self.headers.get("Content-Range", "bytes */*"))
                if not m:
                    raise GcsError(400, "invalid", f"bad Content-Range {self.headers.get('Content-Range')!r}")
                if m.group(1) is not None:
                    start = int(m.group(1))
                    if start > len(session.data):
                        raise GcsError(400, "invalid", f"chunk starts at {start}, have {len(session.data)}")
                    session.data[start:] = body  # a resent chunk overwrites what came before
                total = m.group(3)
                if total == "*" or int(total) > len(session.data):
                    headers = {"Range": f"bytes=0-{len(session.data) - 1}"} if session.data else {}
                    return self._send(308, b"", headers)
                del fake._sessions[upload_id]
                fake._check(session.bucket, session.name, session.preconditions)
                obj = fake._store(session.bucket, session.name, bytes(session.data), session.content_type)
                self._json(200, obj.resource(fake.endpoint))

        return Handler


def gcs_fake() -> Iterator[FakeGcs]:
    """Generator for a pytest fixture: ``yield from gcs_fake()``."""
    with FakeGcs() as fake:
        yield fake
