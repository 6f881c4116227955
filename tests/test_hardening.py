"""Regression tests of issue 14's findings 1, 4, 6, 8, 9 and 11 (hostile workers, agents, clients, specs
and neighbours). Each test is named after its finding and fails on the code before the fix."""

from __future__ import annotations

import json
import socket
import stat
import sys
import time
import tracemalloc
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoscaler.cli.main import main as cli_main
from autoscaler.client.logs import job_logs
from autoscaler.controller import Controller
from autoscaler.errors import SpecError
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url, ensure_token, home, logs_dir
from autoscaler.jobs.spec import load_spec, parse_spec_text, spec_from_dict
from autoscaler.policy import CheapestPolicy, get_policy
from autoscaler.remote.executor import RemoteExecutor, agent_credential
from autoscaler.server.api import create_app
from autoscaler.simulator.executor import SimWorkload
from autoscaler.simulator.world import World
from autoscaler.state import InstanceRow, Job, Store
from cloud_providers.local.market import HEADER, MarketTrace
from cloud_providers.local.scenario import parse_scenario
from cost_models.scaling import LinearScaling
from support import LiveServer, agent_signer, run_cli, write_pw_spec

TOKEN = "hardening-token"
AGENT_TOKEN = "hardening-agent-token"
MAX_COMMAND_BYTES = 64 * 1024  # autoscaler.jobs.spec's limit on run and setup
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET"}
# What a hostile (or buggy) rank 0 may write to its progress file: JSON as Python writes it.
HOSTILE_PROGRESS = [
    '{"step": Infinity}',
    '{"step": NaN}',
    '{"step": -Infinity, "total_steps": NaN}',
    '{"step": 1180591620717411303424}',  # 2**70
    '{"step": 1e400}',
    '{"step": -5}',
    '{"step": "7"}',
    '{"step": 5, "total_steps": Infinity, "metric": NaN, "loss": -Infinity, '
    '"last_checkpoint_step": 1180591620717411303424, "last_checkpoint_unix_s": NaN, "final_model": 7}',
    '[1, 2]',
]


# ----- helpers -----------------------------------------------------------------------------------
def local_controller(cloud_id: str, scenario_text: str = "", tmp: Path | None = None) -> Controller:
    scenario = parse_scenario(scenario_text, base_dir=tmp or Path(".")) if scenario_text else None
    setup = local_cloud(cloud_id, scenario=scenario)
    return Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                      controller_id=cloud_id, tick_s=0.1, clock_rate=setup.clock_rate)


def hostile_worker(tmp_path: Path) -> Path:
    """A rank 0 that keeps rewriting its progress file with each of HOSTILE_PROGRESS in turn."""
    script = tmp_path / "hostile_worker.py"
    script.write_text(
        "import os, time\n"
        f"bodies = {HOSTILE_PROGRESS!r}\n"
        "p = os.environ['SPOTRAIN_PROGRESS_FILE']\n"
        "for i in range(100000):\n"
        "    with open(p + '.tmp', 'w') as f:\n"
        "        f.write(bodies[i % len(bodies)])\n"
        "    os.replace(p + '.tmp', p)\n"
        "    time.sleep(0.01)\n"
    )
    return script


def run_two_jobs_one_hostile(ctl: Controller, tmp_path: Path) -> tuple[dict, dict, list[str | None]]:
    good_spec, workdir = load_spec(write_pw_spec(tmp_path, name="good", workers="{min: 1, max: 1}"))
    bad_spec = spec_from_dict({**good_spec.to_dict(), "name": "bad", "run": f"{sys.executable} {hostile_worker(tmp_path)}"})
    bad = ctl.submit(bad_spec, workdir)
    good = ctl.submit(good_spec, workdir)
    errors: list[str | None] = []
    deadline = time.time() + 60
    while time.time() < deadline and ctl.job_info(good["job_id"])["state"] not in TERMINAL:
        # Between ticks as well: the controller may read any of the bodies.
        Path(ctl.executor.progress_file(bad["job_id"])).write_text(HOSTILE_PROGRESS[len(errors) % len(HOSTILE_PROGRESS)])
        ctl.tick()
        errors.append(ctl.last_tick_error)
        time.sleep(0.05)
    bad_info = ctl.job_info(bad["job_id"])
    ctl.cancel(bad["job_id"])
    ctl.tick()
    return ctl.job_info(good["job_id"]), bad_info, errors


def one_line(text: str) -> bool:
    return "\n" not in text.strip() and "\r" not in text and "Traceback" not in text and len(text) < 1000


class FaultyExecutor:
    """The world's executor, except that reading one job's progress raises ``failures`` times (a bug in
    the handling of that one job), or for ever when ``failures`` is None."""

    def __init__(self, inner: Any, job_id: str, failures: int | None) -> None:
        self.inner, self.job_id, self.failures = inner, job_id, failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def progress(self, job_id: str) -> Mapping[str, Any] | None:
        if job_id == self.job_id and (self.failures is None or self.failures > 0):
            if self.failures is not None:
                self.failures -= 1
            raise ValueError("corrupt progress record\nsecond line")
        return self.inner.progress(job_id)


def calm_world() -> World:
    row = "0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,4"
    return World(MarketTrace.parse(",".join(HEADER) + "\n" + row + "\n", source="calm"), CheapestPolicy())


def sim_spec(name: str) -> Any:
    return spec_from_dict({"name": name, "run": "python train.py", "resources": {"accelerators": ["V100:1"],
                           "clouds": ["aws"]}})


def sim_workload() -> SimWorkload:
    return SimWorkload(work_s=3600.0, scaling=LinearScaling(), restart_overhead_s=60.0, checkpoint_save_s=10.0,
                       checkpoint_interval_s=600.0)


@pytest.fixture()
def remote_ctl(spotrain_home: Path, tmp_path: Path) -> Iterator[Controller]:
    """A controller with the remote executor, one job and one instance launched for decision d-1."""
    store = Store(db_url())
    with store.session() as s:
        s.add(Job(job_id="job-1", name="job", controller_id="c", cloud="aws", spec_json="{}", workdir=str(tmp_path),
                  checkpoint_uri="file:///tmp/x"))
        s.flush()
        s.add(InstanceRow(instance_id="i-1", job_id="job-1", cloud="aws", offering_key="aws/z/g4dn.xlarge/T4:1",
                          market="spot", state="running", decision_id="d-1", launched_at_s=0.0))
    executor = RemoteExecutor(store, agent_token=AGENT_TOKEN)
    yield Controller(store=store, provider=local_cloud("hard-remote").provider, executor=executor, policy=get_policy(),
                     controller_id="c")
    store.engine.dispose()




def read_response(c: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (raises on a 5 s silence)."""
    data = b""
    while True:
        try:
            chunk = c.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def send_quietly(c: socket.socket, data: bytes) -> bool:
    """Send; False once the server has stopped reading (closed or reset)."""
    try:
        c.sendall(data)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False


@pytest.fixture()
def api_ctl(spotrain_home: Path) -> Controller:
    return local_controller("hard-api")


# ----- finding 1: one job's progress report freezes every job -----------------------------------
@pytest.mark.e2e
def test_finding1_hostile_progress_file_breaks_neither_the_tick_nor_other_jobs(
        spotrain_home: Path, tmp_path: Path, pw_env: None) -> None:
    """Finding 1 (progress file): a rank 0 writing Infinity, NaN, 2**70, negative or mistyped values to
    its progress file; every tick completes and the other job runs to SUCCEEDED."""
    ctl = local_controller("hard-progress")
    good, bad, errors = run_two_jobs_one_hostile(ctl, tmp_path)
    assert good["state"] == "SUCCEEDED" and good["step"] == 40, good
    assert errors and set(errors) == {None}, [e for e in errors if e][:3]
    assert isinstance(bad["step"], int) and 0 <= bad["step"] <= 2**53
    assert bad["total_steps"] is None or 0 <= bad["total_steps"] <= 2**53


@pytest.mark.e2e
def test_finding1_hostile_progress_file_with_an_at_step_scenario(
        spotrain_home: Path, tmp_path: Path, pw_env: None) -> None:
    """Finding 1 (progress file), with a scenario whose events fire at a step: the local cloud reads
    the progress file itself."""
    ctl = local_controller("hard-progress-scn", "events:\n  - {at_step: 100000, preempt: 1}\n", tmp_path)
    good, _, errors = run_two_jobs_one_hostile(ctl, tmp_path)
    assert good["state"] == "SUCCEEDED" and set(errors) == {None}, [e for e in errors if e][:3]


def test_finding1_agent_reports_with_non_finite_or_huge_values_are_422(remote_ctl: Controller) -> None:
    """Finding 1 (agent API): reports carrying Infinity / NaN are refused with 422 (they were stored
    with 200), ``attempt = 2**70`` is a 422, not a 500 (SQLite overflow); nothing is stored."""
    http = TestClient(create_app(remote_ctl, TOKEN), raise_server_exceptions=False)
    auth = {"Content-Type": "application/json"}
    signer = agent_signer(agent_credential(AGENT_TOKEN, "d-1"))
    bodies = [
        '{"attempt": 1, "state": "running", "progress": {"step": Infinity}}',
        '{"attempt": 1, "state": "running", "progress": {"step": 3, "loss": NaN}}',
        '{"attempt": 1, "state": "running", "progress": {"nested": {"x": [1, -Infinity]}}}',
        '{"attempt": 1, "state": "running", "notice": {"deadline_unix_s": Infinity}}',
        '{"attempt": 1180591620717411303424, "state": "running"}',
        '{"attempt": 1, "state": "exited", "exit_codes": {"0": 1180591620717411303424}}',
        '{"attempt": 1, "state": "running", "progress": {"step": 1180591620717411303424}}',
    ]
    for body in bodies:
        r = http.post("/v1/agent/report", content=body, headers=auth, auth=signer)
        assert r.status_code == 422, (body, r.status_code, r.text)
        assert one_line(r.json()["detail"])
    assert remote_ctl.executor.seen(["i-1"]) == {}  # nothing was recorded
    ok = http.post("/v1/agent/report", content='{"attempt": 1, "state": "running", "progress": {"step": 3}}',
                   headers=auth, auth=signer)
    assert ok.status_code == 200, ok.text


def test_finding1_one_jobs_handling_error_is_contained_and_fails_it_after_three_in_a_row() -> None:
    """Finding 1 (containment): an error in one job's handling (here its progress cannot be read) is
    noted on that job, the tick goes on for the others, and the third error in a row fails the job
    with a one-line reason; the other job succeeds."""
    w = calm_world()
    bad = w.submit(sim_spec("bad"), sim_workload())
    good = w.submit(sim_spec("good"), sim_workload())
    w.controller.ctx.executor = FaultyExecutor(w.executor, bad, failures=None)  # type: ignore[assignment]
    w.run(horizon_s=86400.0)
    assert w.outcome(good).state == "SUCCEEDED"
    events = w.events(bad)
    errors = [e for e in events if e[1] == "handling-error"]
    assert len(errors) == 3 and all(one_line(e[3]) and "corrupt progress record" in e[3] for e in errors)
    assert events[-1][2] == "FAILED"
    with w.store.session() as s:
        job = s.get(Job, bad)
        assert job is not None and job.state == "FAILED" and one_line(job.reason)
        assert "3 times in a row" in job.reason
        assert all(r.state == "terminated" for r in w.store.instances(s, bad))
    assert w.controller.last_tick_error is None


def test_finding1_a_job_whose_handling_recovers_before_three_errors_runs_on() -> None:
    """Finding 1 (containment): two errors, then none: the job is not failed and succeeds."""
    w = calm_world()
    job = w.submit(sim_spec("flaky"), sim_workload())
    w.controller.ctx.executor = FaultyExecutor(w.executor, job, failures=2)  # type: ignore[assignment]
    w.run(horizon_s=86400.0)
    assert w.outcome(job).state == "SUCCEEDED"
    assert len([e for e in w.events(job) if e[1] == "handling-error"]) == 2


# ----- finding 4: unauthenticated bodies read whole before the 401 ------------------------------
def test_finding4_unauthenticated_large_body_is_refused_before_it_is_read(api_ctl: Controller) -> None:
    """Finding 4: a 300 MB POST without a token gets its 401 after 64 kB were sent, and the server
    closes the connection without reading the rest."""
    with LiveServer(create_app(api_ctl, TOKEN)) as srv:
        for path in ("/v1/jobs", "/v1/agent/report", "/healthz/../v1/jobs"):
            c = srv.connect()
            c.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {300 * 1024 * 1024}\r\n\r\n".encode() + b"x" * 65536)
            answer = read_response(c)
            assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
            assert b'"error":"AuthError"' in answer
            # The server has closed: the rest of the 300 MB is never read.
            sent = sum(65536 for _ in range(64) if send_quietly(c, b"x" * 65536))
            assert sent < 300 * 1024 * 1024
            c.close()


def test_finding4_body_size_limit_and_timeout_before_parsing(api_ctl: Controller) -> None:
    """Finding 4: with the token, a body announced over the limit is a 413 before any of it is read;
    a chunked body is cut at the limit (413); a body that does not arrive in time is a 408."""
    auth = f"Authorization: Bearer {TOKEN}\r\n"
    with LiveServer(create_app(api_ctl, TOKEN, max_body_bytes=1024 * 1024, body_timeout_s=0.5)) as srv:
        c = srv.connect()
        c.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {2 * 1024 * 1024}\r\n\r\n".encode())
        assert read_response(c).startswith(b"HTTP/1.1 413")

        c = srv.connect()
        c.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}Transfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        for _ in range(64):  # up to 4 MiB, past the 1 MiB limit
            if not send_quietly(c, chunk):
                break
        answer = read_response(c)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]

        c = srv.connect()
        c.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 100\r\n\r\n{{".encode())
        t0 = time.monotonic()
        assert read_response(c).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - t0 < 4.0


# ----- finding 6: logs reads whole files to return a 64 kB tail ---------------------------------
def test_finding6_logs_of_a_50_mb_file_read_only_its_tail(spotrain_home: Path, tmp_path: Path) -> None:
    """Finding 6: the tail of a 50 MB rank log is returned, and no more than about the tail is ever
    held in memory (tracemalloc peak), where the whole file was read before."""
    ctl = local_controller("hard-logs")
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job_id = ctl.submit(spec, workdir)["job_id"]
    log = logs_dir(job_id) / "attempt-1-rank-0.log"
    size = 50 * 1024 * 1024
    with open(log, "wb") as f:
        f.truncate(size - 64)
        f.seek(size - 64)
        f.write(b"a" * 47 + b"\nTHE-LAST-LINE\n\n")
    tracemalloc.start()
    try:
        text = job_logs(ctl.store, job_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text.rstrip().endswith("THE-LAST-LINE")
    assert "== worker output: attempt 1, rank 0\n...\n" in text
    assert len(text) < 70_000
    assert peak < 2 * 1024 * 1024, peak


# ----- finding 8: hostile YAML ------------------------------------------------------------------
BASE = "name: yj\nrun: python train.py\nresources: {accelerators: [T4:1]}\n"
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
HOSTILE_SPECS = {
    "alias-bomb": (LAUGHS + "name: *i\nrun: x\nresources: {accelerators: [T4:1]}\n", "aliases"),
    "deep-flow-nesting": (BASE + "simulate: {scaling: " + "[" * 1000 + "]" * 1000 + "}\n", "nested deeper"),
    "deep-block-nesting": (BASE + "".join("  " * i + f"k{i}:\n" for i in range(1000)), "nested deeper"),
    "5000-digit-integer": (BASE + "training: {seed: " + "9" * 5000 + "}\n", "too large"),
    "key-with-newline": (BASE + '"x\\nspotrain: job succeeded": 1\n', "unknown field"),
    "duplicate-key": (BASE + "name: other\n", "duplicate key 'name'"),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", list(HOSTILE_SPECS))
def test_finding8_hostile_yaml_is_one_line_spec_error(case: str, tmp_path: Path) -> None:
    """Finding 8: an alias bomb, 1,000-deep nesting, a 5,000-digit integer, a key holding a newline and
    a duplicate key are each one SpecError line, at once (the bomb took 1.9 GB and 60 s; the nesting
    a 3,000-line RecursionError; the integer a ValueError traceback; the key a two-line message;
    duplicates were silently accepted)."""
    text, expected = HOSTILE_SPECS[case]
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert one_line(message) and len(message) <= 400, message[:500]
    assert expected in message and message.startswith("spec error: ")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["alias-bomb", "deep-flow-nesting", "5000-digit-integer", "key-with-newline"])
def test_finding8_spotrain_run_with_hostile_yaml_exits_2_with_one_line(case: str, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 8, through the CLI: ``spotrain run SPEC`` exits 2 with one line on stderr."""
    path = tmp_path / "job.yaml"
    path.write_text(HOSTILE_SPECS[case][0])
    with pytest.raises(SystemExit) as exited:
        cli_main(["run", str(path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert one_line(err) and err.startswith("spotrain: spec error: "), err[:500]


@pytest.mark.timeout(60)
def test_finding8_the_real_entry_point_refuses_an_alias_bomb(spotrain_home: Path, tmp_path: Path) -> None:
    """Finding 8, the installed entry point in a process of its own: exit 2, one line, no traceback."""
    path = tmp_path / "bomb.yaml"
    path.write_text(HOSTILE_SPECS["alias-bomb"][0])
    r = run_cli("run", str(path), timeout=50)
    assert r.returncode == 2 and one_line(r.stderr) and "aliases" in r.stderr, r.stderr[-500:]


def test_finding8_a_spec_from_the_api_has_the_same_bounds() -> None:
    """Finding 8, the JSON path (``spec_from_dict``): deep nesting and huge integers are one line."""
    base = {"name": "j", "run": "x", "resources": {"accelerators": ["T4:1"]}}
    deep: Any = 1
    for _ in range(1000):
        deep = [deep]
    for data in ({**base, "simulate": {"scaling": deep}}, {**base, "training": {"seed": 10**5000}},
                 {**base, "x\ny": 1}, {**base, "name": 10**400}):
        with pytest.raises(SpecError) as err:
            spec_from_dict(data)
        assert one_line(str(err.value)) and len(str(err.value)) <= 400, str(err.value)[:500]


# ----- finding 9: a run longer than the OS argument limit -----------------------------------------
def test_finding9_run_longer_than_the_argument_limit_is_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 9: a ``run`` over 64 KiB is a one-line spec error naming ``run`` and the limit (it was
    accepted, then failed as "workers were lost 5 times")."""
    long_run = "echo " + "x" * MAX_COMMAND_BYTES
    with pytest.raises(SpecError, match=rf"^spec error: run: .*limit of {MAX_COMMAND_BYTES} bytes"):
        parse_spec_text(f"name: j\nrun: {long_run}\nresources: {{accelerators: [T4:1]}}\n")
    with pytest.raises(SpecError, match=r"^spec error: setup: "):
        parse_spec_text(f"name: j\nrun: x\nsetup: {long_run}\nresources: {{accelerators: [T4:1]}}\n")
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nrun: {long_run}\nresources: {{accelerators: [T4:1]}}\n")
    with pytest.raises(SystemExit) as exited:
        cli_main(["run", str(path)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and one_line(err) and "run:" in err and str(MAX_COMMAND_BYTES) in err
    assert parse_spec_text("name: j\nrun: " + "x" * 60_000 + "\nresources: {accelerators: [T4:1]}\n")


# ----- finding 11: files readable by others, /healthz, /docs and /openapi.json open ---------------
def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_finding11_home_database_logs_and_token_are_the_users_alone(spotrain_home: Path) -> None:
    """Finding 11: SPOTRAIN_HOME 0700 (a 0755 one is narrowed), the database and its WAL files 0600,
    logs directories 0700, the token 0600 (they were 0755 and 0644)."""
    spotrain_home.chmod(0o755)
    store = Store(db_url())
    with store.session() as s:
        s.add(Job(job_id="j-1", name="j", controller_id="c", cloud="local", spec_json="{}", workdir="/",
                  checkpoint_uri="file:///x"))
    ensure_token()
    logs = logs_dir("j-1")
    assert home() == spotrain_home and mode(spotrain_home) == 0o700
    db = spotrain_home / "spotrain.db"
    assert mode(db) == 0o600
    for extra in ("spotrain.db-wal", "spotrain.db-shm"):
        if (spotrain_home / extra).exists():
            assert mode(spotrain_home / extra) == 0o600, extra
    assert mode(spotrain_home / "token") == 0o600
    assert mode(logs) == 0o700 and mode(logs.parent) == 0o700
    store.engine.dispose()
    # A database a wider umask made is narrowed when opened.
    db.chmod(0o644)
    Store(db_url()).engine.dispose()
    assert mode(db) == 0o600


def test_finding11_healthz_says_only_up_without_the_token(api_ctl: Controller) -> None:
    """Finding 11: /healthz without the token is ``{"ok": true}`` only (it told the controller id and
    the last tick error's text); with the token, the details."""
    api_ctl.last_tick_error = "Throttled: secret-ish detail"
    anon = TestClient(create_app(api_ctl, TOKEN))
    r = anon.get("/healthz")
    assert r.status_code == 200 and r.json() == {"ok": True}
    r = anon.get("/healthz", headers={"Authorization": "Bearer wrong"})
    assert r.json() == {"ok": True}
    r = anon.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.json()["controller_id"] == "hard-api" and r.json()["last_tick_error"] == "Throttled: secret-ish detail"


def test_finding11_docs_and_openapi_need_the_token(api_ctl: Controller) -> None:
    """Finding 11: /docs, /redoc and /openapi.json answer 401 without the token, 200 with it."""
    anon = TestClient(create_app(api_ctl, TOKEN))
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        r = anon.get(path)
        assert r.status_code == 401 and r.json()["error"] == "AuthError", path
        assert anon.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path
    doc = anon.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert "/v1/jobs" in doc["paths"]
    assert json.dumps(doc)  # the schema itself is unchanged JSON


def test_the_guard_passes_ordinary_requests(api_ctl: Controller, tmp_path: Path) -> None:
    """Not a finding: with the token, a normal submit and list still work through the guard."""
    http = TestClient(create_app(api_ctl, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    r = http.post("/v1/jobs", json={"spec": spec.to_dict(), "workdir": str(workdir)})
    assert r.status_code == 200, r.text
    assert [j["name"] for j in http.get("/v1/jobs").json()] == ["pw"]
