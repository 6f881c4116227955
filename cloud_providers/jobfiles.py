"""Reading files a job can write (its progress file, exit records, a workdir's ignore file) safely.

A job's code runs as the controller's user, so anything it can reach it can replace: with a FIFO (an
``open`` for reading blocks until a writer comes, which may be never), a link to ``/dev/zero`` (a read
that never ends) or a 300 MB file (read again on every tick). Issue 21, finding 1: any of these stalled
the reconcile loop while it held the controller's lock. Here a job file is opened with ``O_NONBLOCK``
(a FIFO opens at once and is refused) and ``O_NOFOLLOW`` (a link as the last component is refused),
is used only when ``fstat`` says it is a regular file no larger than the caller's cap, and is read
to at most that cap (a file that grows after ``fstat`` is still refused, not read on).

``JobFileReader`` adds a cache keyed on the file's identity and change marks (device, inode, size,
mtime): a file that did not change is not read or parsed again.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any, BinaryIO

from .errors import FileRefused

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | \
    getattr(os, "O_NOCTTY", 0)


class UnsafeJobFile(FileRefused):
    """A job file that is not a regular file, is a link, or is over its size cap: one line."""


def read_job_file(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them, read without blocking.
    ``FileNotFoundError`` when it is absent, ``UnsafeJobFile`` when it is not a regular file (a FIFO,
    a device, a socket, a directory), is a symbolic link, or holds more than ``max_bytes``; other
    ``OSError`` as the system gives it."""
    fd, st = _open_regular_fd(path, _FLAGS)
    try:
        if st.st_size > max_bytes:
            raise UnsafeJobFile(f"{path} holds {st.st_size} bytes, over the {max_bytes}-byte limit (refused)")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise UnsafeJobFile(f"{path} grew past the {max_bytes}-byte limit while read (refused)")
        return data
    finally:
        os.close(fd)


def open_regular(path: str | os.PathLike[str], *, write: bool = False) -> BinaryIO:
    """``path`` opened as a binary file (for reading; ``write``: reading and writing), only if it is a
    regular file and not a link (a FIFO would block ``open``; a device could be read without end; a
    link could lead anywhere the user may write). Meant for logs the workers write, read in part
    (their tails): the caller bounds what it reads. ``UnsafeJobFile`` or ``OSError``."""
    fd, _ = _open_regular_fd(path, (_FLAGS & ~os.O_RDONLY) | os.O_RDWR if write else _FLAGS)
    return os.fdopen(fd, "r+b" if write else "rb")


def _open_regular_fd(path: str | os.PathLike[str], flags: int) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` (opened without following a link or blocking) and its ``fstat``, only
    if it is a regular file; ``UnsafeJobFile`` (nothing left open) otherwise."""
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeJobFile(f"{path} is a symbolic link (refused)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeJobFile(f"{path} is not a regular file (refused)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def file_key(path: str | os.PathLike[str]) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime in ns) of ``path`` itself (a link is not followed); None if absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class JobFileReader:
    """Reads small JSON files a job writes, each at most ``max_bytes``, re-reading one only when it
    changed. ``problem(path)`` says why the last read of ``path`` was refused (None: it was not)."""

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._cache: dict[str, tuple[tuple[int, int, int, int], Any]] = {}
        self._problems: dict[str, str] = {}
        self._lock = threading.Lock()

    def read_json(self, path: str | os.PathLike[str]) -> Any:
        """The parsed JSON of ``path``; None when it is absent, unsafe or not JSON."""
        name = str(path)
        key = file_key(name)
        if key is None:
            with self._lock:
                self._cache.pop(name, None)
                self._problems.pop(name, None)
            return None
        with self._lock:
            hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        try:
            value: Any = json.loads(read_job_file(name, max_bytes=self.max_bytes))
            problem = None
        except UnsafeJobFile as exc:
            value, problem = None, str(exc)
        except (OSError, ValueError):
            value, problem = None, None  # absent, or caught mid-write: the next read sees the new file
        with self._lock:
            self._cache[name] = (key, value)
            if problem is None:
                self._problems.pop(name, None)
            else:
                self._problems[name] = problem
        return value

    def problem(self, path: str | os.PathLike[str]) -> str | None:
        with self._lock:
            return self._problems.get(str(path))

    def forget(self, path: str | os.PathLike[str]) -> None:
        with self._lock:
            self._cache.pop(str(path), None)
            self._problems.pop(str(path), None)


def read_small_text(path: Path, *, max_bytes: int = 4096) -> str | None:
    """A small record a job could tamper with (an exit code, a pid): its text, or None when it is
    absent, unsafe or unreadable."""
    try:
        return read_job_file(path, max_bytes=max_bytes).decode("utf-8", errors="replace")
    except (OSError, UnsafeJobFile):
        return None


__all__ = ["JobFileReader", "UnsafeJobFile", "file_key", "open_regular", "read_job_file", "read_small_text"]
