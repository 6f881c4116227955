"""Checkpoint stores: a few object-store verbs over ``file://`` and ``s3://``.

A store writes whole objects atomically: a reader sees either nothing or the complete object. On
``file://`` that is a temporary file in the same directory, ``fsync``, ``rename`` and an ``fsync`` of
the directory (so the object is durable when :meth:`Store.writer` returns); on ``s3://`` a PUT (or
multipart upload) is atomic by itself. A checkpoint's manifest is the object written last, so a
checkpoint directory without one is incomplete (DESIGN.md, Checkpoints).

``gs://`` raises :class:`UnsupportedStore` for now: the GCS client is not a dependency yet.
boto3 is imported lazily and honours ``AWS_ENDPOINT_URL`` (moto's server in tests).
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
    """The store for ``uri`` (``file:///abs/path``, ``s3://bucket/prefix``)."""
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
        raise UnsupportedStore(f"checkpoint URI {uri!r}: gs:// stores are not implemented yet; use file:// or s3://")
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
