"""Helpers shared by tests (importable as ``support``; tests/ is on sys.path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
PROTOCOL_WORKER = REPO / "tests" / "workers" / "protocol_worker.py"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 240,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``spotrain`` entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd,
    )


def worker_pids(marker: str, home: str | None = None) -> list[int]:
    """PIDs of live (non-zombie) processes whose command line contains ``marker`` and that belong to
    the test's SPOTRAIN_HOME (so parallel or earlier runs do not interfere)."""
    home = home if home is not None else os.environ.get("SPOTRAIN_HOME", "")
    tag = f"SPOTRAIN_HOME={home}".encode()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker not in cmd or state == "Z" or int(p.name) == os.getpid():
            continue
        try:
            if home and tag not in (p / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        out.append(int(p.name))
    return out


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, *, interval_s: float = 0.02) -> T:
    """The first truthy value of ``predicate``, polled every ``interval_s`` (AssertionError naming
    ``what`` after ``timeout_s``). For a condition the test can observe, instead of a fixed sleep that
    guesses how long it takes: as fast as the system is, and no flake when a loaded machine is slower."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def assert_no_workers(marker: str, home: str | None = None, *, timeout_s: float = 10.0) -> None:
    """Every process of ``marker`` (``worker_pids``) is gone within ``timeout_s`` of a job's end: a leak
    is one that stays."""
    try:
        wait_until(lambda: not worker_pids(marker, home), timeout_s, f"no {marker} processes left")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still running: {worker_pids(marker, home)}") from None


def write_pw_spec(dir_: Path, *, name: str = "pw", extra: str = "", workers: str = "{min: 1, max: 2}") -> Path:
    """A job spec whose workers are the torch-free protocol worker."""
    spec = dir_ / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\n"
        f"run: {sys.executable} {PROTOCOL_WORKER}\n"
        "resources: {accelerators: [T4:1], clouds: [aws, gcp]}\n"
        f"workers: {workers}\n"
        "training: {logical_workers: 4, global_batch_size: 64}\n" + extra
    )
    return spec


def start_controller(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start `spotrain controller start --port 0` in a subprocess; wait until it has written its address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--port", "0", "--tick", "0.2", *args],
        env={**os.environ, **(env or {}), "SPOTRAIN_HOME": str(home)}, stdout=subprocess.DEVNULL,
        stderr=open(home / "controller.log", "ab"), text=True,
    )
    info = home / "controller.json"
    for _ in range(300):  # 30 s: a loaded 2-core CI machine has taken over 10 s to import and bind
        if info.exists() and json.loads(info.read_text())["pid"] == proc.pid:
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"controller exited: {(home / 'controller.log').read_text()[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("controller did not start")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_SIGNERS: dict[str, object] = {}


def agent_signer(credential: str) -> Any:
    """An ``httpx.Auth`` that signs requests as the agent holding ``credential`` does (one counter per
    credential for the whole test session, so no two requests reuse a ``seq``)."""
    from cloud_providers.remote.agent import AgentSigner, RequestCounter

    if credential not in _SIGNERS:
        _SIGNERS[credential] = AgentSigner(credential, RequestCounter(None, credential.rpartition(":")[0]))
    return _SIGNERS[credential]


class LiveServer:
    """An ASGI app (the controller's API) served by uvicorn on a loopback port, in a thread: real HTTP
    for tests of clients and of the server's own limits."""

    def __init__(self, app: Any, *, keep_alive_s: float = 5) -> None:
        import socket
        import threading

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=keep_alive_s)  # type: ignore[arg-type]
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            time.sleep(0.01)
        raise AssertionError("the server did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def connect(self) -> Any:
        """A raw socket to the server (5 s timeouts), for requests no client would send."""
        import socket

        c = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        c.settimeout(5)
        return c
