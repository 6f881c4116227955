"""Checkpoint stores: a few object-store verbs over ``file://``, ``s3://`` and ``gs://``.

A store writes whole objects atomically: a reader sees either nothing or the complete object. On
``file://`` that is a temporary file in the same directory, ``fsync``, ``rename`` and an ``fsync`` of
the directory (so the object is durable when :meth:`Store.writer` returns); on ``s3://`` a PUT (or
multipart upload) is atomic by itself, and on ``gs://`` an upload (simple, multipart or resumable)
creates a new object generation only once its last byte is in. A checkpoint's manifest is the object
written last, so a checkpoint directory without one is incomplete (DESIGN.md, Checkpoints).

What a store holds is not trusted (issue 14, findings 2, 3 and 10). :func:`make_store` accepts only
URIs that round-trip. ``file://`` opens everything below its root one directory at a time without
following symbolic links, and reads only regular files (a FIFO is refused without blocking on it); a
directory, FIFO, device, link, I/O error or over-limit size at an object's path is
:class:`~runtime.errors.ObjectUnreadable`, which the checkpoint loader takes for a corrupt checkpoint.
A writer killed mid-write leaves a ``.<name>.tmp-<hex>`` file, which
:meth:`Store.remove_partial_writes` removes (the checkpoint manager calls it when it prunes).

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
import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
import uuid
from typing import Any, BinaryIO, Iterator, Protocol

import torch

from cost_models.store_uri import parse_store_uri

from .errors import ObjectUnreadable, StoreError, UnsupportedStore
from .serialization import read_into


class Store(Protocol):
    uri: str

    def writer(self, relpath: str, *, sync_dir: bool = True) -> contextlib.AbstractContextManager[BinaryIO]:
        """Write one object atomically. ``sync_dir=False`` leaves the directory entry's durability to a
        later object's writer in the same directory (a checkpoint's files, before its manifest)."""
        ...

    def read_bytes(self, relpath: str, *, max_bytes: int | None = None) -> bytes:
        """The object's bytes; :class:`ObjectUnreadable` if it is larger than ``max_bytes``."""
        ...

    def read_hashed(self, relpath: str) -> tuple[torch.Tensor, str]:
        """The object as a flat uint8 tensor, with its sha256 hex (one pass over the bytes)."""
        ...

    def exists(self, relpath: str) -> bool: ...

    def list_dir(self, relpath: str) -> list[str]: ...

    def delete_tree(self, relpath: str) -> None: ...

    def remove_partial_writes(self, relpath: str) -> None:
        """Remove what writers killed mid-write left in the directory ``relpath`` (``file://``: their
        temporary files; an upload to ``s3://`` or ``gs://`` leaves no object behind: nothing to do)."""
        ...

    def url(self, relpath: str) -> str: ...


def make_store(uri: str) -> Store:
    """The store for ``uri`` (``file:///abs/path``, ``s3://bucket/prefix``, ``gs://bucket/prefix``).

    A URI the store would read as another one is refused (issue 14, finding 2): the controller gives
    each job ``<store>/<job_id>``, and with a query (``file:///data/ckpt?/job-2``), a fragment, a
    percent-escape or a ``.``/``..``/empty segment in it, two jobs' URIs could name one directory.
    The rule is ``cost_models.store_uri.parse_store_uri``, the one the spec applies at submit (issue 21,
    finding 13). Whatever is accepted round-trips: ``make_store(uri).uri == uri`` up to a trailing ``/``."""
    parts = parse_store_uri(uri)
    store: Store
    if parts.scheme == "file":
        store = FileStore(parts.path)
    else:
        if parts.scheme == "gs":
            _require_gcs(uri)
        store = (S3Store if parts.scheme == "s3" else GcsStore)(parts.bucket, parts.path)
    if store.uri != uri.rstrip("/"):
        raise ValueError(f"checkpoint URI {uri!r}: does not round-trip (it would be read as {store.uri!r})")
    return store


# Directories below a FileStore's root are opened one component at a time, never through a symbolic
# link (issue 14, finding 10): a planted link cannot lead reads, the CORRUPT marker or pruning outside
# the store. The root itself is the user's configuration and may be (or sit under) a link.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TEMPORARY = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")  # FileStore.writer's temporary names


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

    @staticmethod
    def _parts(relpath: str) -> list[str]:
        parts = [p for p in relpath.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"store path {relpath!r}: '.' and '..' are not allowed")
        return parts

    def _open_dir(self, parts: list[str], *, create: bool = False) -> int:
        """An fd of the directory ``root/parts``, each component opened without following a link.
        FileNotFoundError when one is missing (unless ``create``); ObjectUnreadable when one is a
        link, not a directory or cannot be opened."""
        if create:
            os.makedirs(self.root, exist_ok=True)
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for i, name in enumerate(parts):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=fd)
                try:
                    child = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    raise
                except OSError as exc:
                    where = os.path.join(self.root, *parts[: i + 1])
                    # O_NOFOLLOW | O_DIRECTORY on a link fails with ENOTDIR: say which it was
                    link = OSError(errno.ELOOP, "a symbolic link") if _is_link(name, fd) else exc
                    raise ObjectUnreadable(_unreadable(where, link, directory=True)) from None
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    @contextlib.contextmanager
    def _parent(self, relpath: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """(fd of the object's directory, the object's name)."""
        parts = self._parts(relpath)
        if not parts:
            raise ValueError("store path is empty")
        fd = self._open_dir(parts[:-1], create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def writer(self, relpath: str, *, sync_dir: bool = True) -> Iterator[BinaryIO]:
        path = self._path(relpath)
        with contextlib.ExitStack() as stack:
            try:
                dir_fd, name = stack.enter_context(self._parent(relpath, create=True))
                tmp = f".{name}.tmp-{uuid.uuid4().hex}"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                             dir_fd=dir_fd)
            except OSError as exc:
                raise StoreError(f"cannot write {path}: {exc}") from exc
            f = open(fd, "wb", buffering=0)
            try:
                yield f
                os.fsync(f.fileno())
                f.close()
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a link, never follows it
                if sync_dir:  # the entry, and the directory's own entry if it was just created
                    os.fsync(dir_fd)
                    _fsync_dir(os.path.dirname(os.path.dirname(path)))
            except BaseException:
                f.close()
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise

    def _open_object(self, relpath: str) -> int:
        """A blocking fd of the regular file at ``relpath``. A FIFO is opened without waiting for a
        writer, then refused, as are directories, devices and symbolic links."""
        path = self._path(relpath)
        try:
            with self._parent(relpath) as (dir_fd, name):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ObjectUnreadable(_unreadable(path, exc)) from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise ObjectUnreadable(f"{path} is not a regular file ({_kind(mode)})")
            os.set_blocking(fd, True)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def read_bytes(self, relpath: str, *, max_bytes: int | None = None) -> bytes:
        path = self._path(relpath)
        with open(self._open_object(relpath), "rb", buffering=0) as f:
            try:
                size = os.fstat(f.fileno()).st_size
                if max_bytes is not None and size > max_bytes:
                    raise ObjectUnreadable(f"{path} is {size} bytes, larger than the limit of {max_bytes}")
                data = f.read()
            except OSError as exc:
                raise ObjectUnreadable(f"cannot read {path}: {exc}") from exc
        if max_bytes is not None and len(data) > max_bytes:
            raise ObjectUnreadable(f"{path} grew larger than the limit of {max_bytes} bytes while it was read")
        return bytes(data)

    def read_hashed(self, relpath: str) -> tuple[torch.Tensor, str]:
        path = self._path(relpath)
        with open(self._open_object(relpath), "rb", buffering=0) as f:
            try:
                return read_into(f.readinto, os.fstat(f.fileno()).st_size)
            except (OSError, EOFError) as exc:
                raise ObjectUnreadable(f"cannot read {path}: {exc}") from exc

    def exists(self, relpath: str) -> bool:
        try:
            with self._parent(relpath) as (dir_fd, name):
                os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                return True
        except (FileNotFoundError, ObjectUnreadable):
            return False
        except OSError as exc:
            raise StoreError(f"cannot stat {self._path(relpath)}: {exc}") from exc

    def list_dir(self, relpath: str) -> list[str]:
        try:
            fd = self._open_dir(self._parts(relpath))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self._path(relpath)}: {exc}") from exc
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def delete_tree(self, relpath: str) -> None:
        """Remove ``relpath`` and everything under it; a symbolic link is removed, not followed."""
        try:
            with self._parent(relpath) as (dir_fd, name):
                if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    shutil.rmtree(name, ignore_errors=True, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)
        except (OSError, ObjectUnreadable):  # gone already, or under a link: nothing of the store's to delete
            pass

    def remove_partial_writes(self, relpath: str) -> None:
        try:
            fd = self._open_dir(self._parts(relpath))
        except (OSError, ObjectUnreadable):
            return
        try:
            for name in os.listdir(fd):
                if _TEMPORARY.match(name):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _kind(mode: int) -> str:
    kinds = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFLNK: "a symbolic link",
             stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}
    return kinds.get(stat.S_IFMT(mode), "not a file")


def _unreadable(path: str, exc: OSError, *, directory: bool = False) -> str:
    if exc.errno == errno.ELOOP:
        return f"{path} is a symbolic link (never followed inside a store)"
    if directory and exc.errno == errno.ENOTDIR:
        return f"{path} is not a directory"
    return f"cannot read {path}: {exc}"


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

    def read_bytes(self, relpath: str, *, max_bytes: int | None = None) -> bytes:
        from botocore.exceptions import ClientError

        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self._key(relpath))
            size = got.get("ContentLength")
            if max_bytes is not None and isinstance(size, int) and size > max_bytes:
                got["Body"].close()
                raise ObjectUnreadable(f"{self.url(relpath)} is {size} bytes, larger than the limit of {max_bytes}")
            data: bytes = got["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(self.url(relpath)) from None
            raise StoreError(f"cannot read {self.url(relpath)}: {exc}") from exc
        return data

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

    def remove_partial_writes(self, relpath: str) -> None:
        """Nothing to do: an object exists once its upload completed (a multipart upload killed
        midway leaves parts that listing does not show; a bucket lifecycle rule aborts them)."""

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

    def read_bytes(self, relpath: str, *, max_bytes: int | None = None) -> bytes:
        """``max_bytes`` is checked once the object is in (the manifest it guards is small)."""
        data = self._download(relpath)
        if max_bytes is not None and len(data) > max_bytes:
            raise ObjectUnreadable(f"{self.url(relpath)} is {len(data)} bytes, larger than the limit of {max_bytes}")
        return data

    def _download(self, relpath: str) -> bytes:
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

    def remove_partial_writes(self, relpath: str) -> None:
        """Nothing to do: an object generation exists only once its upload's last byte is in (an
        abandoned resumable upload session leaves no object and expires after a week)."""

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
