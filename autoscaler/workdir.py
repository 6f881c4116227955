"""Shipping the job's ``workdir`` to real instances: a content-hashed archive in the job's store.

With ``--executor remote`` the controller packs the job's workdir (the directory on the controller's
machine that the spec's ``workdir`` names) into a **deterministic** tar.gz: entries sorted, mtimes,
owners and groups zeroed, modes normalised to 0755 / 0644, gzip header without a name or a time. The
same tree always gives the same bytes, so its SHA-256 names it: the archive goes to
``<store>/<job_id>/workdir/<sha256>.tar.gz`` (``file://``, ``s3://`` or ``gs://``, the job's
``checkpoint.store``), and each instance's assignment carries its URI, hash and size. The agent
(``cloud_providers/remote/workdir.py``) downloads it, refuses it unless it hashes to that value, and
unpacks it safely before running the job's ``setup`` and ``run`` in it.

What is left out: ``.spotrainignore`` at the workdir's top, gitignore-like (below); without one,
``.git/`` and ``__pycache__/``. The files that remain may add up to at most ``MAX_WORKDIR_BYTES``
(100 MiB; ``SPOTRAIN_WORKDIR_MAX_MB`` changes it); larger data belongs in the store, fetched by the
job. Symbolic links are kept when they point inside the workdir and refused when they point out.

``.spotrainignore``: one pattern a line; blank lines and ``#`` comments are skipped; ``!pattern``
re-includes what an earlier pattern left out (not below a left-out directory: it is never entered);
``dir/`` matches directories only; a pattern with a ``/`` other than a trailing one is anchored at
the workdir's top, one without matches at any depth; ``*`` and ``?`` do not cross ``/``, ``**``
does (``**/x``, ``a/**``, ``a/**/b``); the last matching pattern wins.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
from pathlib import Path

from cloud_providers.errors import ProviderError
from cloud_providers.remote.workdir import WorkdirRef, archive_uri, put_archive

from .errors import SpecError

IGNORE_FILE = ".spotrainignore"
DEFAULT_IGNORES = (".git/", "__pycache__/")
MAX_WORKDIR_BYTES = 100 * 1024 * 1024
ENV_MAX_MB = "SPOTRAIN_WORKDIR_MAX_MB"


def max_workdir_bytes() -> int:
    text = os.environ.get(ENV_MAX_MB)
    if not text:
        return MAX_WORKDIR_BYTES
    try:
        mb = float(text)
    except ValueError:
        raise SpecError(f"{ENV_MAX_MB}: {text!r} is not a number of MiB") from None
    if not mb > 0:
        raise SpecError(f"{ENV_MAX_MB}: must be > 0, got {text!r}")
    return int(mb * 1024 * 1024)


# ----- .spotrainignore ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _glob_to_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def parse_ignore(text: str) -> list[_Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _glob_to_regex(line.lstrip("/"))
        rules.append(_Rule(re.compile(("^" if anchored else "^(?:.*/)?") + body + "$"), negate, dir_only))
    return rules


def ignored(rules: list[_Rule], rel: str, is_dir: bool) -> bool:
    """Whether the path ``rel`` (posix, relative to the workdir) is left out; the last match decides."""
    verdict = False
    for rule in rules:
        if (is_dir or not rule.dir_only) and rule.regex.match(rel):
            verdict = not rule.negate
    return verdict


def ignore_rules(workdir: Path) -> list[_Rule]:
    path = workdir / IGNORE_FILE
    try:
        return parse_ignore(path.read_text())
    except FileNotFoundError:
        return parse_ignore("\n".join(DEFAULT_IGNORES))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"workdir: cannot read {path}: {exc}") from None


# ----- the archive ----------------------------------------------------------------------------------
def _entries(workdir: Path, limit: int) -> list[tuple[str, os.stat_result, Path]]:
    """(relative path, lstat, path) of everything shipped, sorted; SpecError past the size limit."""
    rules = ignore_rules(workdir)
    out: list[tuple[str, os.stat_result, Path]] = []
    total = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(workdir / rel_dir) as it:
            for entry in sorted(it, key=lambda e: e.name):
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                st = entry.stat(follow_symlinks=False)
                is_dir = stat.S_ISDIR(st.st_mode)
                if ignored(rules, rel, is_dir):
                    continue
                path = Path(entry.path)
                if stat.S_ISLNK(st.st_mode):
                    target = (path.parent / os.readlink(path)).resolve()
                    if not target.is_relative_to(workdir.resolve()):
                        raise SpecError(f"workdir: {rel} is a link out of the workdir (to {target}); "
                                            f"leave it out in {IGNORE_FILE}")
                elif is_dir:
                    stack.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                else:
                    continue  # sockets, fifos, devices: nothing a job ships
                out.append((rel, st, path))
    if total > limit:
        raise SpecError(f"workdir: {workdir} holds {total / 2**20:.1f} MiB to ship, over the {limit / 2**20:g} MiB "
                              f"limit ({ENV_MAX_MB}): leave files out in {IGNORE_FILE}, or put data in the store")
    out.sort(key=lambda e: e[0])
    return out


def check_workdir(workdir: Path) -> int:
    """The bytes of the files ``workdir`` would ship, without packing them: the checks of
    ``build_archive`` (a directory, no link out of it, under the size limit) at submission, so a job
    that cannot be shipped is refused then, not when its first gang starts on instances."""
    if not workdir.is_dir():
        raise SpecError(f"workdir: {workdir} is not a directory on the controller's machine")
    try:
        return sum(st.st_size for _, st, _ in _entries(workdir, max_workdir_bytes()) if stat.S_ISREG(st.st_mode))
    except OSError as exc:
        raise SpecError(f"workdir: cannot read {exc.filename or workdir}: {exc.strerror}") from None


def build_archive(workdir: Path, *, max_bytes: int | None = None) -> tuple[bytes, str]:
    """The workdir's deterministic tar.gz and its SHA-256 (hex). SpecError, one line, for a
    missing or unreadable workdir, a link out of it, or files over the size limit."""
    if not workdir.is_dir():
        raise SpecError(f"workdir: {workdir} is not a directory on the controller's machine")
    limit = max_workdir_bytes() if max_bytes is None else max_bytes
    try:
        entries = _entries(workdir, limit)
    except OSError as exc:
        raise SpecError(f"workdir: cannot read {exc.filename or workdir}: {exc.strerror}") from None
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, st, path in entries:
                info = tarfile.TarInfo(rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if stat.S_ISLNK(st.st_mode):
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                    tar.addfile(info)
                elif stat.S_ISDIR(st.st_mode):
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                    with open(path, "rb") as f:
                        data = f.read()
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    blob = raw.getvalue()
    return blob, hashlib.sha256(blob).hexdigest()


# ----- the store ------------------------------------------------------------------------------------
def ship(workdir: Path, job_store_uri: str, *, max_bytes: int | None = None) -> WorkdirRef:
    """Pack ``workdir`` and put it in the job's store; where it is and what it hashes to. SpecError (one
    line) for a workdir that cannot be shipped; ProviderError when the store cannot be written."""
    data, sha = build_archive(workdir, max_bytes=max_bytes)
    uri = archive_uri(job_store_uri, sha)
    try:
        put_archive(uri, data)
    except ValueError as exc:
        raise SpecError(f"checkpoint.store: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the store's errors are the cloud's: retried on the next tick
        raise ProviderError(f"workdir: cannot put the archive at {uri}: {type(exc).__name__}: {exc}") from None
    return WorkdirRef(uri=uri, sha256=sha, size=len(data))


__all__ = ["IGNORE_FILE", "MAX_WORKDIR_BYTES", "build_archive", "ignored", "parse_ignore", "ship"]
