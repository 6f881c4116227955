"""A home with no live controller record never contacts a default port (issue 24, item 1).

``submit``, ``attach`` and ``cancel`` used to fall back to ``http://127.0.0.1:8470`` and so talk to
whatever listened there (another user's controller: "refused the API token", exit 4), and a record
left by a killed controller sent them to its old port. Now they say "no controller is running for
SPOTRAIN_HOME=..." (exit 3) and connect to nothing; ``attach`` on an ended job shows its outcome from
the database, as ``status`` and ``logs`` do. Real CLI processes, a real SQLite database and real TCP
listeners that count the connections they are offered.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.home import db_url
from autoscaler.state import Event, Job, Store
from support import run_cli, write_pw_spec


class Listener:
    """A TCP listener on 127.0.0.1 that accepts and at once closes every connection, counting them
    (a client that did connect fails fast instead of waiting for an answer)."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT left on 8470 is no owner
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # the timeout: look at the stop flag again
                continue
            self.connections += 1
            conn.close()

    def close(self) -> int:
        """Stop (again: a no-op); the number of connections offered, those still queued included."""
        if self._stop.is_set():
            return self.connections
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.setblocking(False)
        while True:
            try:
                self.sock.accept()[0].close()
            except OSError:
                break
            self.connections += 1
        self.sock.close()
        return self.connections


@pytest.fixture()
def default_port() -> Iterator[Listener]:
    """A listener on 8470, the port the CLI used to fall back to."""
    try:
        lst = Listener(8470)
    except OSError:
        pytest.skip("127.0.0.1:8470 is in use here; test_a_stale_record_is_not_contacted covers the same rule")
    yield lst
    lst.close()


def add_job(job_id: str, state: str, reason: str = "") -> None:
    spec = {"name": job_id, "run": "true", "resources": {"accelerators": ["T4:1"]}}
    ended = state in ("SUCCEEDED", "FAILED", "CANCELLED")
    store = Store(db_url())
    with store.session() as s:
        s.add(Job(job_id=job_id, name=job_id, controller_id="c", cloud="local", spec_json=json.dumps(spec),
                  workdir="/", checkpoint_uri="file:///x", state=state, reason=reason, submitted_at=1000.0,
                  submitted_clock_s=0.0, finished_at=1100.0 if ended else None,
                  finished_clock_s=100.0 if ended else None))
        s.add(Event(job_id=job_id, ts=1100.0, kind="state", from_state="RUNNING", to_state=state, reason=reason))
        s.commit()


def commands(tmp_path: Path) -> list[tuple[str, ...]]:
    return [("submit", str(write_pw_spec(tmp_path))), ("attach", "live-1"), ("cancel", "live-1")]


def assert_no_controller(r: subprocess.CompletedProcess[str], home: Path) -> None:
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"no controller is running for SPOTRAIN_HOME={home}" in lines[0], lines


def test_no_record_contacts_no_default_port(spotrain_home: Path, tmp_path: Path, default_port: Listener) -> None:
    add_job("live-1", "RUNNING")
    for args in commands(tmp_path):
        assert_no_controller(run_cli(*args, timeout=60), spotrain_home)
    assert default_port.close() == 0  # nothing knocked on 8470


def test_a_stale_record_is_not_contacted(spotrain_home: Path, tmp_path: Path) -> None:
    """controller.json of a controller that was killed (its pid gone) names a port someone else may
    listen on now: it is not asked, while SPOTRAIN_CONTROLLER_URL, named on purpose, still is."""
    add_job("live-1", "RUNNING")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lst = Listener()
    try:
        (spotrain_home / "controller.json").write_text(json.dumps({"url": f"http://127.0.0.1:{lst.port}",
                                                                    "pid": gone.pid}))
        for args in commands(tmp_path):
            assert_no_controller(run_cli(*args, timeout=60), spotrain_home)
        status = run_cli("status", "live-1", "--json", timeout=60)  # from the database
        assert status.returncode == 0 and json.loads(status.stdout.splitlines()[-1])["state"] == "RUNNING"
        assert lst.connections == 0
        told = run_cli("cancel", "live-1", env={"SPOTRAIN_CONTROLLER_URL": f"http://127.0.0.1:{lst.port}"},
                       timeout=60)
        assert told.returncode == 3 and "cannot reach the controller" in told.stderr, told.stderr
    finally:
        assert lst.close() >= 1  # the explicit URL was contacted: the listener does see a client


@pytest.mark.parametrize(("state", "code"), [("FAILED", 1), ("SUCCEEDED", 0)])
def test_attach_on_an_ended_job_reads_the_database(spotrain_home: Path, state: str, code: int) -> None:
    add_job("done-1", state, reason="user code failed" if state == "FAILED" else "")
    r = run_cli("attach", "done-1", "--json", timeout=60)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert json.loads(r.stdout.splitlines()[-1])["state"] == state  # --json: the job on the last line
    assert "has ended (from the database" in r.stderr and f"job         done-1  ({state})" in r.stderr
    if state == "FAILED":
        assert "reason      user code failed" in r.stderr
    plain = run_cli("attach", "done-1", timeout=60)
    assert plain.returncode == code and f"job         done-1  ({state})" in plain.stdout and plain.stderr == ""
    missing = run_cli("attach", "no-such-job", timeout=60)
    assert missing.returncode == 5 and "no job 'no-such-job'" in missing.stderr
