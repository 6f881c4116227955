"""SPOTRAIN_HOME: where the database, API token, logs and the default checkpoint store live.

Layout (default ``~/.spotrain``)::

    spotrain.db            SQLite database (jobs, instances, events, decisions)
    token                  API bearer token, mode 0600, created on the controller's first start
    controller.json        address of the running controller service (url, pid)
    logs/<job_id>/...      worker logs
    checkpoints/<job_id>/  default checkpoint store (file://)
    localcloud/<id>/       the local cloud's own state (its "machines")

``SPOTRAIN_FLEET_DIR`` (default: SPOTRAIN_HOME) moves what the controllers of one fleet share on one
machine, ``logs/``, ``checkpoints/`` and ``localcloud/``, out of the home: two controllers with one
``--id`` on one database (a leader and its standby, each with a SPOTRAIN_HOME of its own for its
``controller.json``, log and token) then see one local cloud, one set of worker logs and one default
checkpoint store.

SPOTRAIN_HOME and every directory made in it are mode 0700 (a home found wider is narrowed), so the
database, logs and checkpoints are the user's alone whatever mode a writer gives its files; the
database (``state/store.py``) and the secrets are 0600 themselves (issue 14, finding 11).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

from .errors import SpotrainError


def private_dir(p: Path) -> Path:
    """``p`` as a directory of mode 0700: made so (with its missing parents), narrowed if found wider."""
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = p.stat()
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        os.chmod(p, 0o700)
    return p


def home() -> Path:
    return private_dir(Path(os.environ.get("SPOTRAIN_HOME") or Path.home() / ".spotrain").expanduser())


def fleet_dir() -> Path:
    """Where a fleet's shared logs, default checkpoint store and local clouds live (see the module doc)."""
    shared = os.environ.get("SPOTRAIN_FLEET_DIR")
    return private_dir(Path(shared).expanduser()) if shared else home()


def db_url() -> str:
    return os.environ.get("SPOTRAIN_DB_URL") or f"sqlite:///{home() / 'spotrain.db'}"


def token_path() -> Path:
    return home() / "token"


def ensure_token() -> str:
    """Read the API token, creating it (mode 0600) if absent; ``SecretError`` for an empty or
    unreadable one (issue 21, finding 4)."""
    return ensure_secret(token_path())


class SecretError(SpotrainError):
    """A secret file (the API token, the agents' key) exists but is empty or unreadable: the
    controller refuses to start rather than accept an empty credential."""


def _read_secret(p: Path) -> str:
    try:
        tok = p.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretError(f"{p}: cannot read the secret ({type(exc).__name__}: {exc}); "
                          "fix or delete it and start again") from None
    if not tok:
        raise SecretError(f"{p}: the secret is empty (a first start on a full disk?); delete it and start again")
    return tok


def publish_secret(p: Path, value: str) -> bool:
    """Put ``value`` at ``p`` whole, mode 0600, unless a file is there already: True if this one won.
    It is written to a temporary file, flushed to disk and then hard-linked into place, which is
    atomic and never replaces a file a concurrent writer linked first; so a full disk or a crash
    leaves no file or a whole one, never an empty secret. ``OSError`` as the system gives it."""
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, p)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def ensure_secret(p: Path) -> str:
    """Read a secret file, creating it with a fresh random token (mode 0600, never wider) if absent.

    It is written to a temporary file, flushed to disk and then linked into place, so a full disk or
    a crash leaves either no file or a whole one, never an empty secret; an empty or unreadable one
    found raises ``SecretError`` (an empty token must never mean "no password")."""
    if os.path.lexists(p):
        with contextlib.suppress(OSError):  # an unreadable one is refused by _read_secret
            if p.stat().st_mode & 0o077:
                os.chmod(p, 0o600)  # a secret readable by others is narrowed, not used as found
        return _read_secret(p)
    tok = secrets.token_urlsafe(32)
    try:
        if not publish_secret(p, tok):  # a concurrent start made one first
            return _read_secret(p)
    except OSError as exc:
        raise SecretError(f"{p}: cannot write a new secret ({type(exc).__name__}: {exc})") from None
    return tok


def read_token() -> str | None:
    p = token_path()
    return p.read_text().strip() if p.exists() else None


def controller_file() -> Path:
    return home() / "controller.json"


def write_controller_info(url: str, pid: int, **extra: object) -> None:
    """Record the running controller (``extra``: e.g. ``embedded``, the ``spotrain run`` that serves it)."""
    tmp = controller_file().with_suffix(f".tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"url": url, "pid": pid, **extra}))
    os.replace(tmp, controller_file())


def read_controller_info() -> dict[str, object] | None:
    """The record in ``controller.json`` as found, live or stale (``live_controller_info``: only a live one)."""
    try:
        data = json.loads(controller_file().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def live_controller_info() -> dict[str, object] | None:
    """The controller record if its process still runs, else None: the only address a CLI contacts
    without being told one (``SPOTRAIN_CONTROLLER_URL``).

    Live means the recorded pid is a process of this user that has not exited (not a zombie). A
    record left by a controller that was killed is stale, and so is one whose pid now names another
    user's process: contacting its URL would hand this home's token to whatever listens there now,
    perhaps another user's controller on the same port (issue 24). Checked locally, in well under a
    millisecond, so that commands with no controller answer at once."""
    info = read_controller_info()
    pid = info.get("pid") if info else None
    if info is None or not isinstance(pid, int) or pid <= 0 or not isinstance(info.get("url"), str):
        return None
    try:
        os.kill(pid, 0)
    except OSError:  # ProcessLookupError: gone; PermissionError: another user's process has the pid
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return None
    except (OSError, IndexError):
        pass  # no /proc (not Linux): the signal's answer stands
    return info


def no_controller_message() -> str:
    """What a command that needs a controller says when this home has no live one (exit 3)."""
    return (f"no controller is running for SPOTRAIN_HOME={home()} "
            "(start one with `spotrain controller start --daemon`, or set SPOTRAIN_CONTROLLER_URL)")


def logs_dir(job_id: str) -> Path:
    return private_dir(private_dir(fleet_dir() / "logs") / job_id)


def default_store() -> str:
    return "file://" + str(private_dir(fleet_dir() / "checkpoints"))


def localcloud_dir(cloud_id: str) -> Path:
    return private_dir(private_dir(fleet_dir() / "localcloud") / cloud_id)
