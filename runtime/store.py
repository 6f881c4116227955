"""Checkpoint stores: a few object-store verbs over ``file://``, ``s3://`` and ``gs://``.

A store writes whole objects atomically: a reader sees either nothing or the complete object. On
``file://`` that is a temporary file in the same directory, ``fsync``, ``rename`` and an ``fsync`` of
the directory (so the object is durable when :meth:`Store.writer` returns); on ``s3://`` a PUT (or
multipart upload) is atomic by itself, and on ``gs://`` an upload (simple, multipart or resumable)
creates a new object generation only once its last byte is in. A checkpoint's manifest is the object
written last, so a checkpoint directory without one is incomplete (DESIGN.md, Checkpoints).

boto3 is imported lazily and honours ``AWS_ENDPOINT_URL`` (moto's server in tests).

``gs://`` runs on Google's own ``google-cloud-storage`` client rather than fsspec/gcsfs: it is
synchronous (gcsfs runs an asyncio loop in a thread behind fsspec's sync wrapper, and pulls in
aiohttp), it lists without a cache (gcsfs's directory cache can hide a manifest written a moment ago
from a resuming reader), it exposes generation preconditions and crc32c checks directly, and it
shares google-auth with the GCP provider, so ``spotrain[gcp]`` is one dependency tree. It honours the
library's own ``STORAGE_EMULATOR_HOST`` (with anonymous credentials there), which is how the tests'
loopback fake of the GCS JSON API is reached without patching anything. Transfers are checked with
crc32c by the client; a download that keeps failing that check is returned as read, so that the
manifest's sha256 decides (and the checkpoint loader falls back), as on the other stores.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from typing import Any, BinaryIO, Iterator, Protocol
from urllib.parse import unquote, urlparse

import torch

from .errors import StoreError, UnsupportedStore
from .serialization import read_into


class Store(Protocol):
    uri: str

    def writer(self, relpath: str, *, sync_dir: bool = True) -> contextlib.AbstractContextManager[BinaryIO]:
        """Write one object atomically. ``sync_dir=False`` leaves the directory entry's durability to a
        later object's writer in the same directory (a checkpoint's files, before its manifest)."""
        ...

    def read_bytes(self, relpath: str) -> bytes: ...

    def read_hashed(self, relpath: str) -> tuple[torch.Tensor, str]:
        """The object as a flat uint8 tensor, with its sha256 hex (one pass over the bytes)."""
        ...

    def exists(self, relpath: str) -> bool: ...

    def list_dir(self, relpath: str) -> list[str]: ...

    def delete_tree(self, relpath: str) -> None: ...

    def url(self, relpath: str) -> str: ...


def make_store(uri: str) -> Store:
    """The store for ``uri`` (``file:///abs/path``, ``s3://bucket/prefix``, ``gs://bucket/prefix``)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"checkpoint URI {uri!r}: file:// URIs must be absolute (file:///path)")
        return FileStore(unquote(parsed.path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"checkpoint URI {uri!r}: missing bucket")
        return S3Store(parsed.netloc, parsed.path.strip("/"))
    if parsed.scheme == "gs":
        if not parsed.netloc:
            raise ValueError(f"checkpoint URI {uri!r}: missing bucket")
        _require_gcs(uri)
        return GcsStore(parsed.netloc, parsed.path.strip("/"))
    raise ValueError(f"checkpoint URI {uri!r}: unsupported scheme (use file://, s3:// or gs://)")


class FileStore:
    def __init__(self, root: str) -> None:
        if not os.path.isabs(root):
            raise ValueError(f"file store root must be absolute, got {root!r}")
        self.root = root
        self.uri = "file://" + root

    def _path(self, relpath: str) -> str:
        return os.path.join(self.root, relpath)

    def url(self, relpath: str) -> str:
        return "file://" + self._path(relpath)

    @contextlib.contextmanager
    def writer(self, relpath: str, *, sync_dir: bool = True) -> Iterator[BinaryIO]:
        path = self._path(relpath)
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
            f = open(tmp, "wb", buffering=0)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc}") from exc
        try:
            yield f  # type: ignore[misc]
            os.fsync(f.fileno())
            f.close()
            os.replace(tmp, path)
            if sync_dir:  # the entry, and the directory's own entry if it was just created
                _fsync_dir(directory)
                _fsync_dir(os.path.dirname(directory))
        except BaseException:
            f.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def read_bytes(self, relpath: str) -> bytes:
        try:
            with open(self._path(relpath), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot read {self._path(relpath)}: {exc}") from exc

    def read_hashed(self, relpath: str) -> tuple[torch.Tensor, str]:
        path = self._path(relpath)
        try:
            with open(path, "rb", buffering=0) as f:
                return read_into(f.readinto, os.fstat(f.fileno()).st_size)
        except FileNotFoundError:
            raise
        except (OSError, EOFError) as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc

    def exists(self, relpath: str) -> bool:
        return os.path.exists(self._path(relpath))

    def list_dir(self, relpath: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(relpath)))
        except FileNotFoundError:
            return []

    def delete_tree(self, relpath: str) -> None:
        shutil.rmtree(self._path(relpath), ignore_errors=True)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class S3Store:
    """``s3://bucket/prefix``; objects are ``prefix/relpath``."""

    def __init__(self, bucket: str, prefix: str, *, client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.uri = f"s3://{bucket}/{prefix}".rstrip("/")
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")
        return self._client

    def _key(self, relpath: str) -> str:
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def url(self, relpath: str) -> str:
        return f"s3://{self.bucket}/{self._key(relpath)}"

    @contextlib.contextmanager
    def writer(self, relpath: str, *, sync_dir: bool = True) -> Iterator[BinaryIO]:
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as buf:
            yield buf  # type: ignore[misc]
            buf.seek(0)
            with self._errors(f"upload {self.url(relpath)}"):
                self.client.upload_fileobj(buf, self.bucket, self._key(relpath))

    def read_bytes(self, relpath: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(relpath))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(self.url(relpath)) from None
            raise StoreError(f"cannot read {self.url(relpath)}: {exc}") from exc

    def read_hashed(self, relpath: str) -> tuple[torch.Tensor, str]:
        data = self.read_bytes(relpath)
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return buffer, hashlib.sha256(data).hexdigest()

    def exists(self, relpath: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(relpath))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise StoreError(f"cannot stat {self.url(relpath)}: {exc}") from exc

    def _list(self, relpath: str, delimiter: bool) -> Iterator[dict[str, Any]]:
        prefix = self._key(relpath).rstrip("/") + "/"
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = "/"
        with self._errors(f"list {self.url(relpath)}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                yield page

    def list_dir(self, relpath: str) -> list[str]:
        prefix = self._key(relpath).rstrip("/") + "/"
        names: set[str] = set()
        for page in self._list(relpath, delimiter=True):
            names.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
            names.update(o["Key"][len(prefix):] for o in page.get("Contents", []))
        return sorted(n for n in names if n)

    def delete_tree(self, relpath: str) -> None:
        keys = [o["Key"] for page in self._list(relpath, delimiter=False) for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            with self._errors(f"delete {self.url(relpath)}"):
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
                )

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            raise StoreError(f"cannot {what}: {exc}") from exc


GCS_EXTRA_HINT = "pip install 'spotrain[gcp]'"
# Attempts at a download whose bytes fail the client's crc32c check (in transit) before they are
# handed over as they are, for the manifest's sha256 to judge (at rest).
GCS_CORRUPT_READ_ATTEMPTS = 3


def _require_gcs(uri: str) -> None:
    try:
        import google.cloud.storage  # noqa: F401
    except ImportError:
        raise UnsupportedStore(
            f"checkpoint URI {uri!r}: gs:// needs the google-cloud-storage client ({GCS_EXTRA_HINT})"
        ) from None


class GcsStore:
    """``gs://bucket/prefix``; objects are ``prefix/relpath``.

    ``client``: a ``google.cloud.storage.Client`` to use (default: one built on first use from the
    standard Google auth chain, or for ``STORAGE_EMULATOR_HOST`` when that is set). ``chunk_size_bytes``:
    the resumable-upload chunk (a multiple of 256 KiB; default the client's 100 MiB); objects up to
    8 MiB go in one multipart request either way.
    """

    def __init__(self, bucket: str, prefix: str, *, client: Any = None, chunk_size_bytes: int | None = None) -> None:
        if client is None:
            _require_gcs(f"gs://{bucket}/{prefix}")
        self.bucket = bucket
        self.prefix = prefix
        self.uri = f"gs://{bucket}/{prefix}".rstrip("/")
        self.chunk_size_bytes = chunk_size_bytes
        self._client = client
        self._bucket: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from google.cloud import storage

            with self._errors("connect to GCS for", self.uri):
                self._client = storage.Client()
        return self._client

    @property
    def _gcs_bucket(self) -> Any:
        if self._bucket is None:
            self._bucket = self.client.bucket(self.bucket)
        return self._bucket

    def _key(self, relpath: str) -> str:
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def _blob(self, relpath: str, *, chunked: bool = False) -> Any:
        """``chunked``: for uploads only (a chunked download is a series of range reads, which the
        client does not check against the object's crc32c)."""
        return self._gcs_bucket.blob(self._key(relpath), chunk_size=self.chunk_size_bytes if chunked else None)

    def url(self, relpath: str) -> str:
        return f"gs://{self.bucket}/{self._key(relpath)}"

    @contextlib.contextmanager
    def writer(self, relpath: str, *, sync_dir: bool = True) -> Iterator[BinaryIO]:
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as buf:
            yield buf  # type: ignore[misc]
            size = buf.tell()
            buf.seek(0)
            # The client's default retry re-sends an upload after a transient error: safe here, where
            # one writer owns each path and every attempt carries the whole object.
            with self._errors("upload", self.url(relpath), missing="bucket"):
                self._blob(relpath, chunked=True).upload_from_file(buf, size=size, checksum="crc32c",
                                                     content_type="application/octet-stream")

    def read_bytes(self, relpath: str) -> bytes:
        from google.cloud.storage.exceptions import DataCorruption

        blob = self._blob(relpath)
        for _ in range(GCS_CORRUPT_READ_ATTEMPTS):
            with self._errors("read", self.url(relpath)):
                try:
                    return bytes(blob.download_as_bytes(checksum="crc32c"))
                except DataCorruption:
                    continue
        with self._errors("read", self.url(relpath)):
            return bytes(blob.download_as_bytes(checksum=None))

    def read_hashed(self, relpath: str) -> tuple[torch.Tensor, str]:
        data = self.read_bytes(relpath)
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return buffer, hashlib.sha256(data).hexdigest()

    def exists(self, relpath: str) -> bool:
        with self._errors("stat", self.url(relpath)):
            return bool(self._blob(relpath).exists())

    def _pages(self, relpath: str, *, delimiter: bool) -> Iterator[Any]:
        prefix = self._key(relpath).rstrip("/") + "/"
        with self._errors("list", self.url(relpath), missing="bucket"):
            blobs = self.client.list_blobs(self.bucket, prefix=prefix, delimiter="/" if delimiter else None)
            yield from blobs.pages

    def list_dir(self, relpath: str) -> list[str]:
        prefix = self._key(relpath).rstrip("/") + "/"
        names: set[str] = set()
        for page in self._pages(relpath, delimiter=True):
            names.update(p[len(prefix):].rstrip("/") for p in page.prefixes)
            names.update(b.name[len(prefix):] for b in page)
        return sorted(n for n in names if n)

    def delete_tree(self, relpath: str) -> None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        listed = [(b.name, b.generation) for page in self._pages(relpath, delimiter=False) for b in page]
        for name, generation in listed:
            # Delete the generation that was listed: an object written again since (a checkpoint of
            # the same step, after a restart) is not pruned by a listing that predates it. The
            # precondition also makes the delete idempotent, so the client retries it safely.
            with self._errors("delete", f"gs://{self.bucket}/{name}"):
                try:
                    self._gcs_bucket.blob(name).delete(if_generation_match=generation)
                except (NotFound, PreconditionFailed):
                    continue

    @contextlib.contextmanager
    def _errors(self, what: str, url: str, *, missing: str = "object") -> Iterator[None]:
        """google-api-core, google-auth, transfer and transport errors, as StoreError. A missing
        object is FileNotFoundError (the checkpoint loader reads it as an incomplete checkpoint); a
        missing bucket (``missing="bucket"``) is a StoreError."""
        from google.api_core.exceptions import GoogleAPIError, NotFound
        from google.auth.exceptions import GoogleAuthError
        from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
        from requests.exceptions import RequestException

        try:
            yield
        except NotFound as exc:
            if missing == "object":
                raise FileNotFoundError(url) from None
            raise StoreError(f"cannot {what} {url}: bucket {self.bucket!r} does not exist") from exc
        except GoogleAuthError as exc:
            raise StoreError(f"cannot {what} {url}: Google credentials: {exc}") from exc
        except (GoogleAPIError, RequestException, DataCorruption, InvalidResponse) as exc:
            raise StoreError(f"cannot {what} {url}: {exc}") from exc
