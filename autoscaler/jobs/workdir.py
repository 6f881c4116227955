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

Bounds (issue 21, findings 2 and 10): everything here reads what a job's author controls, at submit
(the API thread) and when the archive is built (a thread of the remote executor, never the tick).
``.spotrainignore`` must be a regular file (not a link, FIFO or device) of at most
``MAX_IGNORE_BYTES``, with at most ``MAX_IGNORE_RULES`` patterns of at most ``MAX_PATTERN_CHARS``
each; patterns are matched by ``jobs/globmatch.py`` in linear time, and one walk may spend at most
``MAX_MATCH_STEPS`` matching steps. At most ``MAX_WORKDIR_ENTRIES`` files and directories are looked
at (``SPOTRAIN_WORKDIR_MAX_FILES``). A shipped path may be at most ``MAX_PATH_BYTES`` long (the
instance unpacks under its own state directory, and PATH_MAX is 4096). A link loop is refused; an
in-tree link (absolute or relative) is shipped as the relative link to its real target, so the
instance's safe unpacking accepts it. Files are read without blocking, regular files only.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

from autoscaler.errors import SpecError
from autoscaler.jobs.globmatch import Budget, BudgetExceeded, Glob
from cloud_providers.errors import ProviderError
from cloud_providers.jobfiles import UnsafeJobFile, read_job_file
from cloud_providers.remote.workdir import WorkdirRef, archive_uri, put_archive

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
MAX_IGNORE_BYTES = 64 * 1024
MAX_IGNORE_RULES = 1000
MAX_PATTERN_CHARS = 1024
MAX_MATCH_STEPS = 4_000_000
MAX_WORKDIR_ENTRIES = 20_000
ENV_MAX_FILES = "SPOTRAIN_WORKDIR_MAX_FILES"
MAX_PATH_BYTES = 1024


def max_workdir_entries() -> int:
    text = os.environ.get(ENV_MAX_FILES)
    if not text:
        return MAX_WORKDIR_ENTRIES
    if not text.strip().isdigit() or int(text) < 1:
        raise SpecError(f"{ENV_MAX_FILES}: {text!r} is not a positive whole number")
    return int(text)


@dataclasses.dataclass(frozen=True)
class _Rule:
    glob: Glob
    negate: bool
    dir_only: bool


def parse_ignore(text: str) -> list[_Rule]:
    rules: list[_Rule] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        if len(line) > MAX_PATTERN_CHARS:
            raise SpecError(f"workdir: {IGNORE_FILE} line {number}: a pattern of {len(line)} characters, over the "
                            f"{MAX_PATTERN_CHARS} limit")
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        if len(rules) >= MAX_IGNORE_RULES:
            raise SpecError(f"workdir: {IGNORE_FILE} has more than {MAX_IGNORE_RULES} patterns")
        anchored = "/" in line
        rules.append(_Rule(Glob.compile(line.lstrip("/"), anchored=anchored), negate, dir_only))
    return rules


def ignored(rules: list[_Rule], rel: str, is_dir: bool, budget: Budget | None = None) -> bool:
    """Whether the path ``rel`` (posix, relative to the workdir) is left out; the last match decides."""
    verdict = False
    for rule in rules:
        if (is_dir or not rule.dir_only) and rule.glob.match(rel, budget):
            verdict = not rule.negate
    return verdict


def ignore_rules(workdir: Path) -> list[_Rule]:
    path = workdir / IGNORE_FILE
    try:
        data = read_job_file(path, max_bytes=MAX_IGNORE_BYTES)
    except FileNotFoundError:
        return parse_ignore("\n".join(DEFAULT_IGNORES))
    except UnsafeJobFile as exc:
        raise SpecError(f"workdir: {IGNORE_FILE} must be a regular file of at most {MAX_IGNORE_BYTES} bytes: "
                        f"{exc}") from None
    except OSError as exc:
        raise SpecError(f"workdir: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return parse_ignore(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(f"workdir: {IGNORE_FILE} is not UTF-8 text") from None


# ----- the archive ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Entry:
    rel: str
    st: os.stat_result
    path: Path
    linkname: str | None = None  # links: the relative link to the real target, as shipped


def _show(rel: str) -> str:
    """A path for a one-line message: shortened, and quoted when it holds a control character (a
    newline shows as \\n)."""
    short = rel if len(rel) <= 80 else rel[:60] + "..." + rel[-15:]
    return short if short.isprintable() else repr(short)


def _link(workdir_real: str, rel: str, path: Path) -> str:
    """The relative link to ``path``'s real target, which must be inside the workdir; SpecError else."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpecError(f"workdir: {_show(rel)} is a symbolic link loop; remove it or leave it out in "
                            f"{IGNORE_FILE}") from None
        if exc.errno != errno.ENOENT:
            raise
    target = os.path.realpath(path)
    if os.path.commonpath([workdir_real, target]) != workdir_real:
        raise SpecError(f"workdir: {_show(rel)} is a link out of the workdir (to {_show(target)}); "
                        f"leave it out in {IGNORE_FILE}")
    return os.path.relpath(target, os.path.realpath(path.parent))


def _entries(workdir: Path, limit: int) -> list[_Entry]:
    """Everything shipped, sorted by path; SpecError past a limit (size, entries, path length,
    matching cost), for a link loop or a link out of the workdir."""
    rules = ignore_rules(workdir)
    workdir_real = os.path.realpath(workdir)
    max_entries = max_workdir_entries()
    budget = Budget(MAX_MATCH_STEPS)
    out: list[_Entry] = []
    total = seen = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(workdir / rel_dir) as it:
            for entry in sorted(it, key=lambda e: e.name):
                seen += 1
                if seen > max_entries:
                    raise SpecError(f"workdir: {workdir} holds more than {max_entries} files and directories "
                                    f"({ENV_MAX_FILES}): leave directories out in {IGNORE_FILE}, or put data in the store")
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                st = entry.stat(follow_symlinks=False)
                is_dir = stat.S_ISDIR(st.st_mode)
                try:
                    if ignored(rules, rel, is_dir, budget):
                        continue
                except BudgetExceeded:
                    raise SpecError(f"workdir: the patterns of {IGNORE_FILE} cost more than {MAX_MATCH_STEPS} "
                                    "matching steps over this workdir: use fewer '*' per pattern, or fewer "
                                    "patterns") from None
                if len(os.fsencode(rel)) > MAX_PATH_BYTES:
                    raise SpecError(f"workdir: the path {_show(rel)} is {len(os.fsencode(rel))} bytes long, over "
                                    f"the {MAX_PATH_BYTES}-byte limit for instances; shorten it or leave it out "
                                    f"in {IGNORE_FILE}")
                path = Path(entry.path)
                linkname = None
                if stat.S_ISLNK(st.st_mode):
                    linkname = _link(workdir_real, rel, path)
                elif is_dir:
                    stack.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                else:
                    continue  # sockets, fifos, devices: nothing a job ships
                out.append(_Entry(rel, st, path, linkname))
    if total > limit:
        raise SpecError(f"workdir: {workdir} holds {total / 2**20:.1f} MiB to ship, over the {limit / 2**20:g} MiB "
                              f"limit ({ENV_MAX_MB}): leave files out in {IGNORE_FILE}, or put data in the store")
    out.sort(key=lambda e: e.rel)
    return out


def check_workdir(workdir: Path) -> int:
    """The bytes of the files ``workdir`` would ship, without packing them: the checks of
    ``build_archive`` (a directory, no link out of it, under the size limit) at submission, so a job
    that cannot be shipped is refused then, not when its first gang starts on instances."""
    if not workdir.is_dir():
        raise SpecError(f"workdir: {workdir} is not a directory on the controller's machine")
    try:
        return sum(e.st.st_size for e in _entries(workdir, max_workdir_bytes()) if stat.S_ISREG(e.st.st_mode))
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
    try:
        return _pack(entries, limit)
    except OSError as exc:
        raise SpecError(f"workdir: cannot read {exc.filename or workdir}: {exc.strerror}") from None


def _read_member(e: _Entry, left: int) -> bytes:
    """A file's bytes, read without blocking and only while it is still a regular file within what is
    left of the size limit (it may have changed since the walk: a FIFO now would hang a plain read)."""
    try:
        return read_job_file(e.path, max_bytes=max(0, left))
    except UnsafeJobFile as exc:
        raise SpecError(f"workdir: {_show(e.rel)} changed while being packed: {exc}") from None


def _pack(entries: list[_Entry], limit: int) -> tuple[bytes, str]:
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            left = limit
            for e in entries:
                info = tarfile.TarInfo(e.rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if e.linkname is not None:
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.linkname, 0o777
                    tar.addfile(info)
                elif stat.S_ISDIR(e.st.st_mode):
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    info.mode = 0o755 if e.st.st_mode & 0o111 else 0o644
                    data = _read_member(e, left)
                    left -= len(data)
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
