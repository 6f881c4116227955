"""A cap on one job's output on the controller's disk, kept by rotating its logs (issue 21, finding 5).

A job's workers can print without end (the agents' output endpoint took 50 MiB in 13 s). Each job may
keep at most ``job_log_max_bytes()`` (``SPOTRAIN_JOB_LOG_MAX_MB``, default 64 MiB) of logs under its
logs directory. With ``n`` logs, each may hold ``cap / 2n`` bytes (at least ``MIN_FILE_BYTES``): past
that, ``rotate`` moves its newest ``cap / 2n`` bytes to ``NAME.1`` (replacing the previous one) and
empties it (copy-and-truncate, as logrotate's ``copytruncate``: local workers keep writing to the same
file, opened for appending). ``NAME.rotated`` counts the rotations and the bytes no longer in
``NAME``; ``spotrain logs`` says so. Local workers' logs are rotated before each tick (outside the
controller's lock), remote agents' copies as their chunks arrive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cloud_providers.jobfiles import UnsafeJobFile, open_regular, read_job_file

DEFAULT_JOB_LOG_MAX_MB = 64
ENV_JOB_LOG_MAX_MB = "SPOTRAIN_JOB_LOG_MAX_MB"
MIN_FILE_BYTES = 64 * 1024
_COPY_CHUNK = 1024 * 1024


def job_log_max_bytes() -> int:
    text = os.environ.get(ENV_JOB_LOG_MAX_MB, "").strip()
    try:
        mb = float(text) if text else float(DEFAULT_JOB_LOG_MAX_MB)
    except ValueError:
        mb = float(DEFAULT_JOB_LOG_MAX_MB)
    return max(MIN_FILE_BYTES, int(mb * 1024 * 1024)) if mb > 0 else DEFAULT_JOB_LOG_MAX_MB * 1024 * 1024


def meta_path(log: Path) -> Path:
    return log.with_name(log.name + ".rotated")


def read_meta(log: Path) -> dict[str, int]:
    """``{"rotations", "base_bytes"}`` of ``log`` (zeros when it was never rotated)."""
    try:
        raw: Any = json.loads(read_job_file(meta_path(log), max_bytes=4096))
    except (OSError, ValueError):  # UnsafeJobFile is a ValueError
        raw = {}
    out = {"rotations": 0, "base_bytes": 0}
    if isinstance(raw, dict):
        for key in out:
            v = raw.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                out[key] = v
    return out


def _create(path: Path) -> int:
    """A new file at ``path`` for writing (whatever a worker left there, a link included, is removed
    first, never followed)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)


def _write_meta(log: Path, meta: dict[str, int]) -> None:
    tmp = meta_path(log).with_name(meta_path(log).name + ".tmp")
    with os.fdopen(_create(tmp), "w") as f:
        f.write(json.dumps(meta))
    os.replace(tmp, meta_path(log))


def rotate(log: Path, keep_bytes: int) -> int:
    """Move the newest ``keep_bytes`` of ``log`` to ``log.1`` and empty ``log``; the bytes it held."""
    with open_regular(log) as src:
        size = src.seek(0, os.SEEK_END)
        src.seek(max(0, size - keep_bytes))
        tmp = log.with_name(log.name + ".1.tmp")
        with os.fdopen(_create(tmp), "wb") as dst:
            while chunk := src.read(_COPY_CHUNK):
                dst.write(chunk)
        os.replace(tmp, log.with_name(log.name + ".1"))
    held = size
    with open_regular(log, write=True) as f:  # what was appended since the copy is lost with the rest: rare, small
        held = max(held, f.seek(0, os.SEEK_END))
        f.truncate(0)
    meta = read_meta(log)
    _write_meta(log, {"rotations": meta["rotations"] + 1, "base_bytes": meta["base_bytes"] + held})
    return held


def per_file_bytes(job_dir: Path, cap_bytes: int | None = None) -> int:
    cap = job_log_max_bytes() if cap_bytes is None else cap_bytes
    n = sum(1 for _ in job_dir.glob("*.log"))
    return max(MIN_FILE_BYTES, cap // (2 * max(1, n)))


def enforce(job_dir: Path, cap_bytes: int | None = None) -> int:
    """Rotate each log of ``job_dir`` that is over its share of the job's cap; how many were rotated."""
    if not job_dir.is_dir():
        return 0
    share = per_file_bytes(job_dir, cap_bytes)
    rotated = 0
    for log in sorted(job_dir.glob("*.log")):
        try:
            st = log.lstat()
            if log.is_symlink() or not log.is_file() or st.st_size <= share:
                continue
            rotate(log, share)
            rotated += 1
        except (OSError, UnsafeJobFile):
            continue
    return rotated


def job_bytes(job_dir: Path) -> int:
    """Bytes of every file under ``job_dir`` (what the cap bounds)."""
    total = 0
    for f in job_dir.glob("*"):
        try:
            total += f.lstat().st_size
        except OSError:
            continue
    return total


__all__ = ["ENV_JOB_LOG_MAX_MB", "enforce", "job_bytes", "job_log_max_bytes", "per_file_bytes", "read_meta", "rotate"]
