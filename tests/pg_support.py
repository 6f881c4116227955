"""A throwaway PostgreSQL server for tests (``postgres_server`` in conftest.py).

The server is Debian's ``postgresql`` package (``.ci/run`` installs it on a fresh CI machine): its
binaries are found on PATH or under ``/usr/lib/postgresql/<version>/bin``. PostgreSQL refuses to run
as root, so under root (CI) the cluster is made and run as an unprivileged user (``nobody``, through
``runuser`` or ``setpriv``) in a temporary directory that user owns, with its unix socket there too;
it listens on a free loopback port with trust authentication and is stopped (and its directory
removed) when the session ends. Each test gets a database of its own (``fresh_database``).

When no server can be started the PostgreSQL tests skip, with the reason, except under ``CI=true``,
where they fail: CI must prove the controller works on PostgreSQL.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

SUPERUSER = "spotrain"


class PostgresUnavailable(Exception):
    pass


def missing(reason: str) -> None:
    """Skip the test, or fail it under CI (where PostgreSQL must have been installed)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL tests cannot run under CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


def pg_bin(name: str) -> str:
    """The path of PostgreSQL's ``name`` (initdb, pg_ctl): PATH first, then Debian's versioned dirs."""
    found = shutil.which(name)
    if found:
        return found
    def version(d: str) -> int:
        v = d.split("/")[-2]
        return int(v) if v.isdigit() else 0

    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    raise PostgresUnavailable(f"{name} not found (on PATH or under /usr/lib/postgresql/*/bin; "
                              "Debian: apt-get install postgresql)")


def _as_user() -> tuple[list[str], int | None, int | None]:
    """The command prefix that runs a program as an unprivileged user (none when not root)."""
    if os.geteuid() != 0:
        return [], None, None
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        raise PostgresUnavailable("running as root and there is no 'nobody' user to run PostgreSQL as") from None
    if shutil.which("runuser"):
        return ["runuser", "-u", "nobody", "--"], pw.pw_uid, pw.pw_gid
    if shutil.which("setpriv"):
        return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"], pw.pw_uid, pw.pw_gid
    raise PostgresUnavailable("running as root and neither runuser nor setpriv is available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """``initdb`` + ``pg_ctl start`` in a temporary directory; ``stop()`` removes it."""

    def __init__(self) -> None:
        self.initdb, self.pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        self.prefix, uid, gid = _as_user()
        self.root = Path(tempfile.mkdtemp(prefix="spotrain-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        if uid is not None and gid is not None:
            os.chown(self.root, uid, gid)
        self.started = False

    def _run(self, *args: str, timeout: float = 60) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.root))
        r = subprocess.run([*self.prefix, *args], capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=self.root)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise PostgresUnavailable(f"{Path(args[0]).name} failed: {' | '.join(tail) or r.returncode}")

    def start(self) -> PostgresServer:
        self._run(self.initdb, "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8")
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", opts, "-w",
                  "-t", "60", "start", timeout=90)
        self.started = True
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self) -> str:
        """A new empty database; its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.started:
            try:
                self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
            except (PostgresUnavailable, subprocess.TimeoutExpired):
                pass
            self.started = False
        for _ in range(3):
            shutil.rmtree(self.root, ignore_errors=True)
            if not self.root.exists():
                break
            time.sleep(0.2)


def start_server() -> PostgresServer:
    """A running server, or ``PostgresUnavailable`` with the reason."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresUnavailable("the psycopg driver is not installed (pip install 'spotrain[test]')") from None
    server = PostgresServer()
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise
