"""The one rule for checkpoint store URIs (``file:///abs``, ``s3://bucket/prefix``, ``gs://bucket/prefix``).

The spec (``autoscaler/jobs/spec.py``, at submit) and the runtime (``runtime/store.py``, in every rank) both
call :func:`parse_store_uri`, so a URI that passes submit is one the workers can open (issue 21,
finding 13: 22 of 37 odd URIs used to pass submit and fail later in a rank with a traceback). It lives
here because it is pure string checking and ``cost_models`` is the one package both may import.

Refused, each with one line naming the URI and the reason:

- a query (``?``), fragment (``#``), percent-escape (``%``), control character, or an empty, ``.`` or
  ``..`` path segment: with any of them two jobs' ``<store>/<job_id>`` could name one directory
  (issue 14, finding 2), or the store would read the URI as another one;
- ``file://`` that is not absolute (``file://host/x``) or is the filesystem root; a path segment over
  ``MAX_SEGMENT_BYTES`` or a path over ``MAX_FILE_PATH_BYTES`` (the rank's files go below it, and
  Linux's ``PATH_MAX`` is 4,096 bytes);
- a bucket name S3 or GCS would refuse: S3's rules for general purpose buckets
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html: 3-63 characters of
  ``a-z 0-9 . -``, starting and ending with a letter or digit, no ``..``, not an IPv4 address, not the
  reserved prefixes ``xn--``, ``sthree-``, ``amzn-s3-demo-`` or suffixes ``-s3alias``, ``--ol-s3``,
  ``.mrap``, ``--x-s3``, ``--table-s3``) and GCS's (https://cloud.google.com/storage/docs/buckets#naming:
  ``a-z 0-9 - _ .``, 3-63 characters, or up to 222 with dots and each dot-separated part at most 63,
  starting and ending with a letter or digit, not an IPv4 address, not starting with ``goog``, not
  containing ``google`` or a misspelling such as ``g00gle``); no user or port in the authority;
- an object prefix over ``MAX_OBJECT_PREFIX_BYTES`` (keys are at most 1,024 bytes on both clouds, and the
  job id, ``checkpoints/<step>/`` and a file name follow the prefix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlparse

SCHEMES = ("file", "s3", "gs")
MAX_SEGMENT_BYTES = 255
MAX_FILE_PATH_BYTES = 2048
MAX_OBJECT_PREFIX_BYTES = 512

_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
# "google" and the close misspellings GCS refuses (0 for o, 9 for g, 1 for l).
_GOOGLE_LIKE = re.compile(r"g[o0][o0]g[l1]e|9[o0][o0]9[l1]e|g[o0][o0]9[l1]e|9[o0][o0]g[l1]e")


@dataclass(frozen=True)
class StoreUri:
    """A checked store URI: ``scheme``, ``bucket`` ("" for ``file``) and ``path`` (for ``file``: the
    absolute directory without a trailing ``/``; for buckets: the prefix without leading or trailing ``/``)."""

    scheme: Literal["file", "s3", "gs"]
    bucket: str
    path: str

    @property
    def uri(self) -> str:
        if self.scheme == "file":
            return "file://" + self.path
        return f"{self.scheme}://{self.bucket}/{self.path}".rstrip("/")


def parse_store_uri(uri: str) -> StoreUri:
    """The parts of ``uri``; ``ValueError`` (one line, naming the URI) if it is not one the stores accept.
    What is accepted round-trips: ``parse_store_uri(uri).uri == uri`` up to a trailing ``/``."""
    if not isinstance(uri, str):
        raise ValueError(f"checkpoint URI must be a string, got {type(uri).__name__}")
    _check_text(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc or not parsed.path.startswith("/"):
            raise ValueError(f"checkpoint URI {_show(uri)}: file:// URIs must be absolute (file:///path)")
        path = parsed.path.rstrip("/")
        if not path:
            raise ValueError(f"checkpoint URI {_show(uri)}: the filesystem root cannot be a checkpoint store")
        if len(path.encode()) > MAX_FILE_PATH_BYTES:
            raise ValueError(f"checkpoint URI {_show(uri)}: the path is longer than {MAX_FILE_PATH_BYTES} bytes")
        result = StoreUri("file", "", path)
    elif parsed.scheme in ("s3", "gs"):
        bucket = parsed.netloc
        if not bucket:
            raise ValueError(f"checkpoint URI {_show(uri)}: missing bucket")
        problem = (_s3_bucket_problem if parsed.scheme == "s3" else _gcs_bucket_problem)(bucket)
        if problem:
            raise ValueError(f"checkpoint URI {_show(uri)}: {bucket[:80]!r} is not a valid "
                             f"{'S3' if parsed.scheme == 's3' else 'GCS'} bucket name ({problem})")
        prefix = parsed.path.strip("/")
        if len(prefix.encode()) > MAX_OBJECT_PREFIX_BYTES:
            raise ValueError(f"checkpoint URI {_show(uri)}: the prefix is longer than {MAX_OBJECT_PREFIX_BYTES} bytes")
        result = StoreUri("s3" if parsed.scheme == "s3" else "gs", bucket, prefix)
    else:
        raise ValueError(f"checkpoint URI {_show(uri)}: unsupported scheme (use file:///path, s3://bucket/prefix "
                         "or gs://bucket/prefix)")
    if result.uri != uri.rstrip("/"):
        raise ValueError(f"checkpoint URI {_show(uri)}: does not round-trip (it would be read as {_show(result.uri)})")
    return result


def _check_text(uri: str) -> None:
    if "?" in uri:
        raise ValueError(f"checkpoint URI {_show(uri)}: a query ('?') is not allowed (it is not part of the path, "
                         "so the job's checkpoints would not live under it)")
    if "#" in uri:
        raise ValueError(f"checkpoint URI {_show(uri)}: a fragment ('#') is not allowed (it is not part of the path)")
    if "%" in uri:
        raise ValueError(f"checkpoint URI {_show(uri)}: percent-escapes ('%') are not supported")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in uri):
        raise ValueError(f"checkpoint URI {_show(uri)}: control characters are not allowed")
    _, sep, rest = uri.partition("://")
    segments = rest.split("/")[1:] if sep else []  # after the bucket (or the empty host of file:///)
    if segments and segments[-1] == "":
        segments.pop()  # one trailing '/'
    if any(seg in ("", ".", "..") for seg in segments):
        raise ValueError(f"checkpoint URI {_show(uri)}: empty, '.' and '..' path segments are not allowed")
    if any(len(seg.encode()) > MAX_SEGMENT_BYTES for seg in segments):
        raise ValueError(f"checkpoint URI {_show(uri)}: a path segment is longer than {MAX_SEGMENT_BYTES} bytes")


def _s3_bucket_problem(name: str) -> str:
    if not 3 <= len(name) <= 63:
        return "3 to 63 characters"
    if not _S3_BUCKET.match(name):
        return "lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
    if ".." in name:
        return "no two adjacent dots"
    if _IPV4.match(name):
        return "not an IP address"
    if name.startswith(_S3_RESERVED_PREFIXES) or name.endswith(_S3_RESERVED_SUFFIXES):
        return "a prefix or suffix S3 reserves"
    return ""


def _gcs_bucket_problem(name: str) -> str:
    if not 3 <= len(name) <= 222 or ("." not in name and len(name) > 63):
        return "3 to 63 characters, or up to 222 with dots"
    if not _GCS_BUCKET.match(name):
        return "lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    if any(not part or len(part) > 63 for part in name.split(".")):
        return "each dot-separated part 1 to 63 characters"
    if _IPV4.match(name):
        return "not an IP address"
    if name.startswith("goog") or _GOOGLE_LIKE.search(name):
        return "no 'goog' prefix and no 'google' or a misspelling of it"
    return ""


def _show(uri: str) -> str:
    """The URI for a message: repr (escapes control characters), at most 200 characters."""
    text = repr(uri)
    return text if len(text) <= 200 else text[:197] + "..."
