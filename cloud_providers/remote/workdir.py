"""The job's workdir on the instance: the archive the controller shipped, fetched, verified, unpacked.

The controller (``autoscaler/jobs/workdir.py``) packs the job's ``workdir`` into a deterministic tar.gz named
by its SHA-256, puts it in the job's store (``<store>/<job_id>/workdir/<sha256>.tar.gz``) and sends the
archive's URI, hash and size in the instance's assignment. Here the agent:

1. downloads it (``file://``, ``s3://`` with boto3, ``gs://`` with google-cloud-storage: the same stores
   the checkpoints use, reached with the instance's own credentials), refusing one larger than the
   size the controller announced;
2. checks its SHA-256 against the one in the assignment and refuses to run anything on a mismatch
   (``WorkdirError``, one line: the agent writes it to the ranks' logs and reports them failed);
3. unpacks it with ``tarfile``'s ``data`` filter (no absolute paths, no ``..``, no links leaving the
   tree, no devices, no set-uid bits) into ``<state_dir>/workdirs/<sha256>/``, once per hash: a later
   attempt of the same job on the same instance reuses it.

Only the archive's hash is trusted, and it comes over the agent's TLS channel from the controller
(``tls.py``), never from the store.

Why this is not the workers' store layer (``runtime/store.py``, the same three kinds of store through
the same clients), although issue 22 asks for one: the dependency rule leaves no package both may
import that may do I/O (cloud_providers and runtime import nothing of each other; cost_models, which
both could share, is pure), and fsspec reaches ``s3://`` only through s3fs, whose aiobotocore pins
botocore to versions other than boto3's (s3fs 2026.9.0 would move botocore 1.43.11 to 1.43.117).
What this module needs of a store is two calls (write an object unless it exists; read one up to
a size), each a few lines per scheme.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

from ..errors import ProviderError

ARCHIVE_DIR = "workdir"
ARCHIVE_SUFFIX = ".tar.gz"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1024 * 1024


class WorkdirError(ProviderError):
    """The workdir archive cannot be used (unreachable, too large, wrong hash, unsafe): one line."""


@dataclasses.dataclass(frozen=True)
class WorkdirRef:
    """Where the controller put a job's workdir archive, and what it must hash to."""

    uri: str
    sha256: str
    size: int

    def __post_init__(self) -> None:
        if not _SHA256.match(self.sha256):
            raise WorkdirError(f"workdir: {self.sha256!r} is not a SHA-256 hex digest")
        if self.size < 0:
            raise WorkdirError(f"workdir: size {self.size} must be >= 0")
        if urlparse(self.uri).scheme not in ("file", "s3", "gs"):
            raise WorkdirError(f"workdir: {self.uri!r} is not a file://, s3:// or gs:// URI")

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WorkdirRef:
        if "error" in d:
            raise WorkdirError(str(d["error"]))
        uri, sha, size = d.get("uri"), d.get("sha256"), d.get("size")
        if not isinstance(uri, str) or not isinstance(sha, str) or isinstance(size, bool) or not isinstance(size, int):
            raise WorkdirError("workdir: expected {uri, sha256, size}")
        return cls(uri, sha, size)


def archive_uri(job_store_uri: str, sha256: str) -> str:
    """``<job store>/workdir/<sha256>.tar.gz``: the archive's place in the job's store."""
    return f"{job_store_uri.rstrip('/')}/{ARCHIVE_DIR}/{sha256}{ARCHIVE_SUFFIX}"


def _boto3() -> Any:
    from ..aws._boto import _sdk_module  # the one module that imports boto3 (tests/test_layout.py)

    return _sdk_module("boto3")


def _gcs() -> Any:
    from ..gcp._google import _sdk_module  # the one module that imports the Google SDK

    return _sdk_module("google.cloud.storage")


def put_archive(uri: str, data: bytes) -> None:
    """The controller's side: write ``data`` at ``uri`` unless an object is already there (its name is
    its hash). ValueError for a URI that is not file://, s3:// or gs://; the store's errors as they come."""
    u = urlparse(uri)
    if u.scheme == "file":
        path = Path(unquote(u.path))
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    elif u.scheme == "s3":
        client, key = _boto3().client("s3"), u.path.lstrip("/")
        try:
            client.head_object(Bucket=u.netloc, Key=key)
            return
        except client.exceptions.ClientError:
            pass
        client.put_object(Bucket=u.netloc, Key=key, Body=data)
    elif u.scheme == "gs":
        blob = _gcs().Client().bucket(u.netloc).blob(u.path.lstrip("/"))
        if not blob.exists():
            blob.upload_from_string(data, content_type="application/gzip")
    else:
        raise ValueError(f"cannot ship the workdir to {uri!r} (file://, s3:// or gs:// only)")


def _bucket_key(uri: str) -> tuple[str, str]:
    u = urlparse(uri)
    return u.netloc, u.path.lstrip("/")


def _download(ref: WorkdirRef, out: IO[bytes]) -> None:
    """Write the archive's bytes to ``out``, at most ``ref.size`` of them (WorkdirError past it)."""
    scheme = urlparse(ref.uri).scheme
    written = 0

    def put(chunk: bytes) -> None:
        nonlocal written
        written += len(chunk)
        if written > ref.size:
            raise WorkdirError(f"workdir archive {ref.uri} is larger than the {ref.size} bytes the controller sent")
        out.write(chunk)

    try:
        if scheme == "file":
            with open(unquote(urlparse(ref.uri).path), "rb") as f:
                while chunk := f.read(_CHUNK):
                    put(chunk)
        elif scheme == "s3":  # the aws extra, installed on the instance with the agent
            bucket, key = _bucket_key(ref.uri)
            body = _boto3().client("s3").get_object(Bucket=bucket, Key=key)["Body"]
            for chunk in body.iter_chunks(_CHUNK):
                put(chunk)
        else:
            bucket, key = _bucket_key(ref.uri)
            put(_gcs().Client().bucket(bucket).blob(key).download_as_bytes(end=ref.size))
    except WorkdirError:
        raise
    except Exception as exc:  # noqa: BLE001 - any store error is one line for the agent's report
        raise WorkdirError(f"workdir archive {ref.uri} could not be read: {type(exc).__name__}: {exc}") from None


def fetch_and_unpack(ref: WorkdirRef, root: Path) -> Path:
    """The directory the job's ranks run in: ``root/<sha256>``, unpacked from the verified archive (or
    already there from an earlier attempt). WorkdirError (nothing unpacked) on any failure."""
    target = root / ref.sha256
    if (root / f"{ref.sha256}.complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
        archive = Path(tmp) / "workdir.tar.gz"
        with open(archive, "wb") as out:
            _download(ref, out)
        digest = hashlib.sha256()
        with open(archive, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != ref.sha256:
            raise WorkdirError(f"workdir archive {ref.uri} has SHA-256 {digest.hexdigest()}, not the {ref.sha256} "
                               "the controller sent: refusing to run it")
        tree = Path(tmp) / "tree"
        tree.mkdir()
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(tree, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise WorkdirError(f"workdir archive {ref.uri} cannot be unpacked safely: {exc}") from None
        if target.exists():
            shutil.rmtree(target)  # a half-made one from an agent that died while unpacking
        os.replace(tree, target)
    (root / f"{ref.sha256}.complete").touch()
    return target


__all__ = ["ARCHIVE_DIR", "ARCHIVE_SUFFIX", "WorkdirError", "WorkdirRef", "archive_uri", "fetch_and_unpack",
           "put_archive"]
