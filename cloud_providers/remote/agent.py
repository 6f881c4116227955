"""The instance agent: runs the job's workers on a real cloud instance for the controller.

Started by the instance's user data (``python -m cloud_providers.remote.agent --config PATH``, a systemd
unit restarted on failure). It loops, every ``poll_s``:

1. asks the controller for its assignment (``GET /v1/agent/assignment``); a new attempt starts the
   job's ranks exactly as the local agent does (``Gang``: setup once, one ``bash -c <run>`` per local
   rank with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT and the assignment's environment);
   a stop order (``stop_attempt``) kills them; a directive (preemption, rescale, cancel) is written to
   the workers' notice file;
2. watches the cloud's own notice (AWS IMDSv2 ``spot/instance-action``, polled; GCE ``preempted``,
   long-polled with ``wait_for_change``: ``metadata.py``) when ``notice_sources`` names it, and writes it
   to the notice file too: the runtime then checkpoints at the next minibatch boundary, even if the
   controller is unreachable;
3. reports (``POST /v1/agent/report``) its state, each rank's exit code, rank 0's progress and the
   notice it saw, every ``report_s`` and at once on every change.

A controller that is down does not stop training: the workers go on, and the agent keeps retrying its
report (the latest one, so nothing is lost) until the controller answers. When the controller says the
instance is gone for good (HTTP 410), the agent kills its workers and exits 0. SIGTERM (the instance is
shutting down) is forwarded to the ranks, a notice source of the runtime; the agent exits once they
have and it has reported so.

Files under ``state_dir``: ``attempts/<n>/notice.json`` and ``progress.json`` (the worker protocol's
notice and progress files), ``logs/<job_id>/`` (setup and rank logs), ``setup-<job_id>.done`` (setup
runs once per instance), ``agent-seq.json`` (the request counter's reserved block, ``RequestCounter``)
and ``agent-state.json`` (the last attempt started, so a restarted agent never
starts an attempt twice: its old workers are gone, and it reports them ``stopped``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from ..errors import ProviderError
from ..jobfiles import JobFileReader
from ..launch import WorkerLaunch
from ..local.agent import PHASE_EXITED, PHASE_SETUP, Gang
from ..protocol import ENV_NOTICE_FILE, ENV_PROGRESS_FILE, ProgressError, ProgressRecord, parse_progress
from .config import AgentConfig
from .metadata import MetadataError, NoticeSource, sources_for
from .tls import pinned_context
from .wire import (
    ASSIGNMENT_PATH,
    LAST_SEQ_HEADER,
    MAX_OUTPUT_CHUNK,
    OUTPUT_PATH,
    REPORT_PATH,
    STATE_EXITED,
    STATE_IDLE,
    STATE_RUNNING,
    STATE_SETUP,
    STATE_STOPPED,
    Assignment,
    OutputChunk,
    Report,
    WireError,
    signed_headers,
)
from .workdir import WorkdirError, WorkdirRef, fetch_and_unpack

log = logging.getLogger("spotrain.agent")

# Exit code reported for every rank when the workers cannot be started (workdir missing or refused, no bash).
EXIT_CANNOT_START = 127


class ControllerUnreachable(ProviderError):
    """The controller did not answer (down, restarting, network): keep going, retry later."""


class InstanceGone(ProviderError):
    """The controller says this instance is terminated for good (HTTP 410)."""


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RequestCounter:
    """The agent's request counter (``seq``, wire.py): it only grows, across agent restarts too.

    Values are reserved in blocks in ``path`` (written atomically before a block is used), so a
    restarted agent starts above every value the last one may have sent, at one write per
    ``BLOCK`` requests. Should the file be lost, the controller's 409 says the last value it took,
    and ``advance_past`` carries on from there."""

    BLOCK = 4096

    def __init__(self, path: Path | None, decision_id: str) -> None:
        self._path, self._decision_id = path, decision_id
        self._lock = threading.Lock()
        self._next = self._reserved = 0
        if path is not None:
            try:
                saved = json.loads(path.read_text())
                if isinstance(saved, dict) and saved.get("decision_id") == decision_id:
                    self._next = self._reserved = int(saved.get("reserved") or 0)
            except (OSError, ValueError, TypeError):
                pass

    def _reserve(self) -> None:
        self._reserved = self._next + self.BLOCK
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(self._path, json.dumps({"decision_id": self._decision_id, "reserved": self._reserved}))

    def take(self) -> int:
        with self._lock:
            self._next += 1
            if self._next >= self._reserved:
                self._reserve()
            return self._next

    def advance_past(self, last: int) -> None:
        with self._lock:
            if last >= self._next:
                self._next = last
                self._reserve()


class AgentSigner(httpx.Auth):
    """Signs every request with the agent's credential and the next counter (``wire.signed_headers``):
    the credential itself never travels, and the controller takes each counter once."""

    requires_request_body = True

    def __init__(self, credential: str, counter: RequestCounter) -> None:
        self._credential, self.counter = credential, counter

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        content = request.url.query if request.method == "GET" else request.content
        request.headers.update(signed_headers(self._credential, method=request.method, path=request.url.path,
                                              seq=self.counter.take(), content=content))
        yield request


class ControllerChannel:
    """The agent's HTTP client for the controller (httpx; one short timeout per request)."""

    def __init__(self, config: AgentConfig, *, http: httpx.Client | None = None) -> None:
        """``http``: a client to use instead of a new one (tests pass FastAPI's TestClient). Without it,
        the controller must be ``https://`` with its certificate pinned (ValueError otherwise: ``tls.py``)."""
        if http is None:
            ctx = pinned_context(config.controller_url, config.controller_cert_pem)
            http = httpx.Client(base_url=config.controller_url.rstrip("/"), timeout=config.request_timeout_s, verify=ctx)
        self._http = http
        counter = RequestCounter(Path(config.state_dir) / "agent-seq.json", config.decision_id)
        self._signer = AgentSigner(config.agent_credential, counter)
        self._http.auth = self._signer

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One signed request; once more with a fresh counter if the controller took a higher one
        (409 with ``X-Spotrain-Last-Seq``: this agent's counter file was lost)."""
        try:
            resp = self._http.request(method, path, **kwargs)
            last = resp.headers.get(LAST_SEQ_HEADER, "")
            if resp.status_code == 409 and last.isascii() and last.isdigit():
                self._signer.counter.advance_past(int(last))
                resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ControllerUnreachable(str(exc) or type(exc).__name__) from exc
        return resp

    def _answer(self, resp: httpx.Response) -> Assignment | None:
        if resp.status_code == 404:
            return None  # the controller has not recorded this instance yet
        if resp.status_code == 410:
            raise InstanceGone(resp.text)
        if resp.status_code != 200:
            raise ControllerUnreachable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            return Assignment.from_json(resp.json())
        except (ValueError, WireError) as exc:
            raise ControllerUnreachable(f"bad assignment: {exc}") from exc

    def assignment(self, instance_id: str | None) -> Assignment | None:
        return self._answer(self._request("GET", ASSIGNMENT_PATH, params={"instance_id": instance_id} if instance_id else None))

    def report(self, report: Report) -> Assignment | None:
        return self._answer(self._request("POST", REPORT_PATH, json=report.to_json()))

    def output(self, chunk: OutputChunk) -> int | None:
        """Send one chunk of a rank's log; the controller's next offset (None: refused, not retried
        now: the workers' output is worth less than the loop)."""
        resp = self._request("POST", OUTPUT_PATH, json=chunk.to_json())
        if resp.status_code != 200:
            return None
        try:
            nxt = resp.json().get("next_offset")
        except (ValueError, AttributeError):
            return None
        return nxt if isinstance(nxt, int) and not isinstance(nxt, bool) and nxt >= 0 else None


class CloudNoticeWatcher:
    """Watches the metadata services in background threads, one per source (a slow link-local request
    must not hold up the agent's loop, and GCE's long-poll blocks until ``preempted`` changes); the
    first stop notice sticks."""

    def __init__(self, sources: Sequence[NoticeSource], *, interval_s: float = 0.5) -> None:
        self._sources = list(sources)
        self._interval_s = interval_s
        self._notice: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> CloudNoticeWatcher:
        for source in self._sources:
            thread = threading.Thread(target=self._loop, args=(source,), name=f"spotrain-notices-{source.name}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        self._closing.set()

    def check_once(self) -> None:
        for source in self._sources:
            self._check(source)

    def _check(self, source: NoticeSource) -> None:
        try:
            found = source.check()
        except MetadataError as exc:
            log.debug("notice source %s: %s", source.name, exc)
            return
        if found is not None:
            with self._lock:
                if self._notice is None:
                    self._notice = found
                    log.warning("cloud notice from %s: %s", source.name, found)

    def _loop(self, source: NoticeSource) -> None:
        # After each answer (a long-poll's included) wait a poll interval: an error that returns at
        # once must not become a busy loop.
        while not self._closing.is_set() and self.notice is None:
            self._check(source)
            self._closing.wait(self._interval_s)

    @property
    def notice(self) -> dict[str, Any] | None:
        with self._lock:
            return dict(self._notice) if self._notice is not None else None


def _identity(config: AgentConfig, sources: Sequence[NoticeSource]) -> tuple[str | None, str | None]:
    """(instance id, address) from the config, else from the cloud's metadata service."""
    instance_id, address = config.instance_id, config.advertise_address
    for source in sources:
        try:
            instance_id = instance_id or source.instance_id()
            address = address or source.address()
        except MetadataError as exc:
            log.info("metadata %s: %s", source.name, exc)
    return instance_id, address


class Agent:
    """One instance's agent. ``step()`` is one turn of the loop (tests drive it directly)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        channel: ControllerChannel | None = None,
        sources: Sequence[NoticeSource] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.channel = channel or ControllerChannel(config)
        self._sources = list(sources_for(config) if sources is None else sources)
        self.watcher = CloudNoticeWatcher(self._sources, interval_s=config.poll_s)
        self.instance_id, self.address = _identity(config, self._sources)
        self._clock = clock
        self.state_dir = Path(config.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.gang: Gang | None = None
        self.launch: WorkerLaunch | None = None
        self.attempt = 0
        self.stopped = False
        self.terminating = False
        self._notice_written = False
        self._last_sent: dict[str, Any] | None = None
        self._last_sent_at = float("-inf")
        self._unreachable_since: float | None = None
        self._refused_with = ""  # "HTTP NNN" of the last refusal while unreachable (logged once a run)
        # (attempt, rank) -> how much of that rank's log the controller has (``_ship_output``).
        self._shipped: dict[tuple[int, int], int] = {}
        self._progress_reader = JobFileReader(max_bytes=1024 * 1024)
        self._progress_problem: str | None = None
        self._restore()

    # ----- persistence across agent restarts -----
    def _state_file(self) -> Path:
        return self.state_dir / "agent-state.json"

    def _restore(self) -> None:
        try:
            saved = json.loads(self._state_file().read_text())
        except (OSError, ValueError):
            return
        if isinstance(saved, dict) and saved.get("decision_id") == self.config.decision_id:
            self.attempt = int(saved.get("attempt") or 0)
            # The workers of that attempt died with the previous agent (systemd kills the unit's cgroup).
            self.stopped = self.attempt > 0

    def _save(self) -> None:
        _write_atomic(self._state_file(), json.dumps({"decision_id": self.config.decision_id, "attempt": self.attempt}))

    # ----- paths -----
    def _attempt_dir(self, attempt: int) -> Path:
        return self.state_dir / "attempts" / str(attempt)

    def notice_file(self) -> Path:
        return self._attempt_dir(self.attempt) / "notice.json"

    def progress_file(self) -> Path:
        return self._attempt_dir(self.attempt) / "progress.json"

    # ----- acting on the assignment -----
    def _start(self, la: WorkerLaunch) -> None:
        if self.gang is not None and self.gang.phase != PHASE_EXITED:
            self.gang.kill()  # one gang per instance: the old one must free its ports first
        self.launch, self.attempt, self.stopped, self._notice_written = la, la.attempt, False, False
        adir = self._attempt_dir(la.attempt)
        adir.mkdir(parents=True, exist_ok=True)
        self._save()
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **la.env,
            ENV_NOTICE_FILE: str(adir / "notice.json"),
            ENV_PROGRESS_FILE: str(adir / "progress.json"),
        }
        # `python` in the user's command is the interpreter the agent runs under (the image's).
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        log_dir = self.state_dir / "logs" / la.job_id
        problem: str | None = None
        try:
            cwd = self._workdir(la)
        except WorkdirError as exc:
            cwd, problem = la.cwd, f"spotrain agent: {exc}"
        self.gang = Gang(
            la.with_(cwd=cwd, env=env, log_dir=str(log_dir)),
            setup_marker=self.state_dir / f"setup-{la.job_id}.done",
            setup_log=log_dir / f"setup-{self.instance_id or self.config.decision_id}.log",
            own_process_group=True,
        )
        log.info("attempt %d: starting ranks %s of %d (job %s)", la.attempt, list(la.ranks), la.world_size, la.job_id)
        if problem is not None:
            return self._cannot_start(la, log_dir, problem)
        try:
            # Without a shipped workdir, the spec's path must exist in the image or be made by setup.
            Path(cwd).mkdir(parents=True, exist_ok=True)
            self.gang.start()
        except OSError as exc:
            # As a shell reports a command it cannot run: the controller sees a failed start, not a hang.
            self._cannot_start(la, log_dir, f"spotrain agent: cannot start the workers in {cwd}: {exc}")

    def _workdir(self, la: WorkerLaunch) -> str:
        """Where the ranks run: the shipped workdir, fetched and verified (``workdir.py``), else ``cwd``."""
        if la.workdir is None:
            return la.cwd
        ref = WorkdirRef.from_json(la.workdir)
        path = fetch_and_unpack(ref, self.state_dir / "workdirs")
        log.info("attempt %d: workdir %s (sha256 %s) in %s", la.attempt, ref.uri, ref.sha256, path)
        return str(path)

    def _cannot_start(self, la: WorkerLaunch, log_dir: Path, message: str) -> None:
        """Every local rank fails with EXIT_CANNOT_START, ``message`` as the last line of its log (the
        controller shows it as the failure's reason)."""
        log.error("attempt %d: %s", la.attempt, message)
        log_dir.mkdir(parents=True, exist_ok=True)
        for rank in la.ranks:
            with open(log_dir / f"attempt-{la.attempt}-rank-{rank}.log", "a") as f:
                f.write(message + "\n")
        assert self.gang is not None
        self.gang.fail(EXIT_CANNOT_START)

    def _stop(self) -> None:
        """Kill the running workers. Workers that already exited keep their exit codes."""
        if self.gang is not None and self.gang.phase != PHASE_EXITED:
            log.info("attempt %d: stop order, killing the workers", self.attempt)
            self.gang.kill()
            self.stopped = True

    def _write_notice(self, notice: Mapping[str, Any]) -> None:
        if self._notice_written or self.gang is None or self.gang.phase == PHASE_EXITED:
            return
        _write_atomic(self.notice_file(), json.dumps(dict(notice)))
        self._notice_written = True
        log.info("attempt %d: notice %s", self.attempt, dict(notice))

    def apply(self, assignment: Assignment) -> None:
        la = assignment.launch
        if la is not None and la.attempt > self.attempt and la.attempt > assignment.stop_attempt:
            self._start(la)
        if assignment.stop_attempt >= self.attempt > 0:
            self._stop()
        if assignment.notice is not None and la is not None and la.attempt == self.attempt:
            self._write_notice(assignment.notice)

    # ----- reporting -----
    def state(self) -> str:
        if self.stopped:
            return STATE_STOPPED
        if self.gang is None:
            return STATE_IDLE
        if self.gang.phase == PHASE_EXITED:
            return STATE_EXITED
        return STATE_SETUP if self.gang.phase == PHASE_SETUP else STATE_RUNNING

    def _progress(self) -> ProgressRecord | None:
        if self.launch is None or 0 not in self.launch.ranks:
            return None
        # Rank 0 could leave a FIFO or a link to /dev/zero there: read without blocking, to a cap.
        data = self._progress_reader.read_json(self.progress_file())
        if not isinstance(data, dict):
            return None
        try:
            return parse_progress(data)
        except ProgressError as exc:
            # Logged once per distinct problem: the agent reports every few seconds.
            if self._progress_problem != str(exc):
                self._progress_problem = str(exc)
                log.warning("progress file ignored: %s", exc)
            return None

    def report(self) -> Report:
        return Report(
            attempt=self.attempt, state=self.state(),
            exit_codes=dict(self.gang.exit_codes) if self.gang is not None and not self.stopped else {},
            progress=self._progress(), notice=self.watcher.notice, instance_id=self.instance_id,
            address=self.address,
        )

    def _send(self, report: Report, *, force: bool) -> Assignment | None:
        body = report.to_json()
        now = self._clock()
        if not force and body == self._last_sent and now - self._last_sent_at < self.config.report_s:
            return None
        answer = self.channel.report(report)
        self._last_sent, self._last_sent_at = body, now
        return answer

    def _ship_output(self, *, max_chunks: int = 4) -> None:
        """Send what is new in the current attempt's rank logs (a few chunks a turn), so that the
        controller has them for ``spotrain logs`` and ``logs -f``. A channel without ``output`` (a
        test's fake) ships nothing."""
        send = getattr(self.channel, "output", None)
        if send is None or self.launch is None:
            return
        log_dir = self.state_dir / "logs" / self.launch.job_id
        for rank in self.launch.ranks:
            key = (self.launch.attempt, rank)
            for _ in range(max_chunks):
                offset = self._shipped.get(key, 0)
                try:
                    with open(log_dir / f"attempt-{self.launch.attempt}-rank-{rank}.log", "rb") as f:
                        f.seek(offset)
                        data = f.read(MAX_OUTPUT_CHUNK)
                except OSError:
                    break
                if not data:
                    break
                nxt = send(OutputChunk(attempt=self.launch.attempt, rank=rank, offset=offset, data=data))
                if not isinstance(nxt, int) or nxt <= offset:
                    break
                self._shipped[key] = nxt

    # ----- the loop -----
    def step(self) -> bool:
        """One turn: assignment, notices, workers, report. False once the agent should exit."""
        try:
            if not self.terminating:
                assignment = self.channel.assignment(self.instance_id)
                if assignment is not None:
                    self.apply(assignment)
            cloud_notice = self.watcher.notice
            if cloud_notice is not None:
                self._write_notice(cloud_notice)
            if self.gang is not None:
                self.gang.poll()
            self._ship_output()
            self._send(self.report(), force=False)
            if self._unreachable_since is not None:
                log.warning("controller reachable again after %.0f s", self._clock() - self._unreachable_since)
                self._unreachable_since, self._refused_with = None, ""
        except ControllerUnreachable as exc:
            if self.gang is not None:
                self.gang.poll()
            if self._unreachable_since is None:
                self._unreachable_since = self._clock()
                log.warning("controller unreachable (%s): the workers go on; retrying", exc)
            elif str(exc).startswith("HTTP ") and str(exc)[:8] != self._refused_with:
                # A controller that answers but refuses (a new leader that does not know this agent,
                # say) is worth its own line, even after a connection error was logged.
                log.warning("controller refuses this agent (%s): the workers go on; retrying", exc)
            self._refused_with = str(exc)[:8] if str(exc).startswith("HTTP ") else ""
        except InstanceGone:
            log.info("the controller has terminated this instance: stopping the workers and exiting")
            self._stop()
            return False
        if self.terminating and (self.gang is None or self.gang.phase == PHASE_EXITED):
            # Shutting down and the workers are done: go once the final report is out (or can't be).
            return self._last_sent != self.report().to_json() and self._unreachable_since is None
        return True

    def on_sigterm(self) -> None:
        """The instance is going down: pass SIGTERM to the ranks (the runtime checkpoints on it)."""
        self.terminating = True
        if self.gang is not None:
            self.gang.send_signal(signal.SIGTERM)

    def run(self, *, should_exit: Callable[[], bool] = lambda: False) -> int:
        self.watcher.start()
        try:
            while not should_exit() and self.step():
                time.sleep(self.config.poll_s)
        finally:
            self.watcher.close()
            close = getattr(self.channel, "close", None)
            if close is not None:
                close()
            if self.gang is not None and self.gang.phase != PHASE_EXITED:
                self.gang.kill()
        return 0


def check_version(config: AgentConfig) -> None:
    """ValueError unless this agent is the spotrain version the controller pinned (``agent_version``)."""
    if config.agent_version is None:
        return
    import importlib.metadata

    try:
        have = importlib.metadata.version("spotrain")
    except importlib.metadata.PackageNotFoundError:
        have = "not installed"
    if have != config.agent_version:
        raise ValueError(f"agent_version: this is spotrain {have}, the controller pinned {config.agent_version}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cloud_providers.remote.agent",
                                     description="spotrain instance agent: runs the job's workers for the controller")
    parser.add_argument("--config", required=True, help="agent config JSON (written by the instance's user data)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s spotrain-agent %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the journal
    try:
        config = AgentConfig.load(args.config)
        check_version(config)
        agent = Agent(config)
    except ValueError as exc:
        print(f"spotrain agent: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda _signum, _frame: agent.on_sigterm())
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda _signum, _frame: interrupted.set())
    log.info("agent for decision %s (instance %s) reporting to %s", config.decision_id,
             agent.instance_id or "?", config.controller_url)
    return agent.run(should_exit=interrupted.is_set)


if __name__ == "__main__":
    sys.exit(main())
