"""Shared fixtures. Every test gets its own SPOTRAIN_HOME; loopback gloo needs GLOO_SOCKET_IFNAME=lo."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import worker_pids

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("OMP_NUM_THREADS", "1")

@pytest.fixture()
def spotrain_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SPOTRAIN_HOME", str(home))
    monkeypatch.delenv("SPOTRAIN_CONTROLLER_URL", raising=False)
    monkeypatch.delenv("SPOTRAIN_DB_URL", raising=False)
    monkeypatch.delenv("SPOTRAIN_TOKEN", raising=False)
    yield home
    # Whatever a failing test left running is killed, so it cannot leak into later tests.
    for pid in worker_pids("", str(home)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture()
def pw_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PW_STEPS", "40")
    monkeypatch.setenv("PW_STEP_S", "0.05")
    yield


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """A throwaway PostgreSQL server for the session (tests/pg_support.py); skips the tests that need
    it when none can be started, but fails them under CI=true."""
    from pg_support import PostgresUnavailable, missing, start_server

    try:
        server = start_server()
    except PostgresUnavailable as exc:
        reason = str(exc)
        server = None
    if server is None:
        missing(reason)
    try:
        yield server
    finally:
        if server is not None:
            server.stop()


@pytest.fixture()
def postgres_url(postgres_server: object) -> str:
    """The SQLAlchemy URL of a new, empty PostgreSQL database for this test."""
    return postgres_server.fresh_database()  # type: ignore[attr-defined]
