"""The CLI's client over real HTTP (issue 24): a plain ``http://`` URL is spoken to with the standard
library (``client/plainhttp.py``), and every answer maps to the same typed error as through httpx."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoscaler.client.http import Client
from autoscaler.controller import Controller
from autoscaler.errors import ApiError, AuthError, ControllerUnreachable, JobNotFound
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url
from autoscaler.jobs.domain import JobNameTaken, NotOwner
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.server.api import create_app
from autoscaler.server.schemas import JobSummary
from autoscaler.state import Store
from support import LiveServer, free_port, wait_until, write_pw_spec

TOKEN = "t0ken"




def make_controller(cloud_id: str) -> Controller:
    setup = local_cloud(cloud_id)
    return Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                      controller_id=cloud_id, tick_s=0.1, clock_rate=setup.clock_rate)


def test_plain_http_raises_what_the_controller_raised(spotrain_home: Path, tmp_path: Path) -> None:
    ctl = make_controller("plain-a")
    with LiveServer(create_app(ctl, TOKEN)) as srv, LiveServer(create_app(make_controller("plain-b"), TOKEN)) as other_srv:
        c = Client(srv.url, token=TOKEN)
        spec, workdir = load_spec(write_pw_spec(tmp_path))
        job = c.submit(spec.to_dict(), str(workdir))
        assert isinstance(job, JobSummary) and job.name == "pw" and job.state.value == "PENDING"
        with pytest.raises(JobNameTaken, match="already exists"):
            c.submit(spec.to_dict(), str(workdir))
        with pytest.raises(JobNotFound, match="no job 'nope'"):
            c.job("nope")
        with pytest.raises(JobNotFound, match="no job 'nope'"):
            c.job_json("nope")
        with pytest.raises(JobNotFound, match=re.escape("no job 'no such\\r\\nX: 1'")):  # sent percent-encoded
            c.job_json("no such\r\nX: 1")
        with pytest.raises(AuthError, match=f"the controller at {srv.url} refused the API token"):
            Client(srv.url, token="wrong").jobs()
        with pytest.raises(ApiError, match="not an absolute directory") as bad:
            c.submit(spec.to_dict(), "relative")
        assert bad.value.status == 422 and type(bad.value) is ApiError

        assert [j.job_id for j in c.jobs()] == [job.job_id]
        assert c.events(job.job_id)[0].kind == "submitted"
        assert c.spec(job.job_id)["name"] == "pw" and "submitted" in c.logs(job.job_id)
        assert c.healthz().controller_id == "plain-a"

        with pytest.raises(NotOwner, match="belongs to controller plain-a"):
            Client(other_srv.url, token=TOKEN).cancel(job.job_id)
        done = c.cancel(job.job_id)
        assert done.state.value == "CANCELLED"

        # The JSON reads (`spotrain status`) are what the typed reads give (an ended job: no clock in it).
        assert c.jobs_json() == [j.to_json_dict() for j in c.jobs()] == [done.to_json_dict()]
        assert c.job_json("pw") == c.job(job.job_id).to_json_dict()
        assert c.recent_jobs_json(20) == [j.to_json_dict() for j in c.recent_jobs(20)]
        assert c.jobs_json("live") == [] and c.recent_jobs_json(0) == []

        # `status`'s two reads (live; newest ended), sent at once on two connections, merged oldest first.
        spec2, workdir2 = load_spec(write_pw_spec(tmp_path, name="pw2"))
        live = c.submit(spec2.to_dict(), str(workdir2))
        both = c.recent_jobs_json(20)
        assert [j["job_id"] for j in both] == [job.job_id, live.job_id]
        assert both[0] == done.to_json_dict() and [j["job_id"] for j in c.recent_jobs_json(0)] == [live.job_id]
        with pytest.raises(AuthError, match="refused the API token"):
            Client(srv.url, token="wrong").recent_jobs_json(20)
        c.cancel(live.job_id)


def test_no_controller_at_the_url_is_unreachable(spotrain_home: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ControllerUnreachable, match=f"cannot reach the controller at {url} "):
        Client(url, token=TOKEN).jobs()


def test_a_connection_the_server_closed_while_idle_is_not_reused(spotrain_home: Path, tmp_path: Path) -> None:
    """uvicorn closes an idle keep-alive connection; the next request, a POST too, goes on a new one."""
    ctl = make_controller("plain-idle")
    with LiveServer(create_app(ctl, TOKEN), keep_alive_s=0.1) as srv:
        c = Client(srv.url, token=TOKEN)
        spec, workdir = load_spec(write_pw_spec(tmp_path))
        job = c.submit(spec.to_dict(), str(workdir))
        wait_until(lambda: not srv.server.server_state.connections, 5, "uvicorn to close the idle connection")
        assert [j["job_id"] for j in c.jobs_json()] == [job.job_id]
        wait_until(lambda: not srv.server.server_state.connections, 5, "uvicorn to close the idle connection")
        assert c.cancel(job.job_id).state.value == "CANCELLED"


# (status, body) the canned server answers; "hang" does not answer, "drop" closes the connection.
CANNED: dict[str, tuple[int | str, bytes]] = {
    "not-a-job-list": (200, b"[1, 2]"),
    "no-state": (200, b'[{"job_id": "a"}]'),
    "not-json": (200, b"<html>hello</html>"),
    "server-error": (500, b"Internal Server Error"),
    "fastapi-404": (404, b'{"detail": "Not Found"}'),
    "conflict": (409, b'{"error": "Conflict", "detail": "busy"}'),
    "validation": (422, b'{"detail": [{"msg": "field required"}]}'),
    "chunked": ("chunked", b'{"job_id": "j", "state": "FAILED", "reason": "r\\u00e9"}'),
    "until-close": ("until-close", b'{"job_id": "j", "state": "FAILED", "reason": "x"}'),
    "drop": ("drop", b""),
    "hang": ("hang", b""),
}


class _Canned(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        status, body = CANNED[self.server.case]  # type: ignore[attr-defined]
        if status == "drop":
            self.close_connection = True
            return
        if status == "hang":  # until the test is over (the client's own timeout ends its wait)
            self.server.released.wait(30)  # type: ignore[attr-defined]
            self.close_connection = True
            return
        if status == "chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 7):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]))
            self.wfile.write(b"0\r\n\r\n")
            return
        if status == "until-close":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            return
        assert isinstance(status, int)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def canned(request: pytest.FixtureRequest) -> Iterator[str]:
    """A loopback server giving every request the answer CANNED[case] names."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    server.case = request.node.callspec.params["case"]  # type: ignore[attr-defined]
    server.released = threading.Event()  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.released.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


def _outcome(call: Any, client: Client) -> tuple[str, str, int | None]:
    try:
        call(client)
    except Exception as exc:  # noqa: BLE001 (the outcome is what is compared)
        return type(exc).__name__, str(exc), getattr(exc, "status", None)
    return "ok", "", None


@pytest.mark.parametrize("case", sorted(CANNED))
def test_odd_answers_map_as_through_httpx(spotrain_home: Path, canned: str, case: str) -> None:
    """The same answer gives the same exception, message and status through either transport."""
    plain = Client(canned, token=TOKEN, timeout_s=0.3)
    via_httpx = Client(token=TOKEN, http=httpx.Client(base_url=canned, timeout=0.3))
    if case in ("not-a-job-list", "no-state"):
        calls = [lambda c: c.jobs(), lambda c: c.jobs_json(), lambda c: c.recent_jobs_json(20)]
    else:
        calls = [lambda c: c.job("j"), lambda c: c.job_json("j"), lambda c: c.recent_jobs_json(20)]
    expected = {
        "not-a-job-list": "ApiError", "no-state": "ApiError", "not-json": "ApiError", "server-error": "ApiError",
        "fastapi-404": "JobNotFound", "conflict": "Conflict", "validation": "ApiError",
        "drop": "ControllerUnreachable", "hang": "ControllerUnreachable", "chunked": "ok", "until-close": "ok",
    }[case]
    if expected == "ok":  # a job's JSON framed otherwise than by Content-Length; the typed read finds it short
        calls = [lambda c: c.job_json("j"), lambda c: c.job_json("j")["reason"]]
        for call in calls:
            assert call(plain) == call(via_httpx)
        assert plain.job_json("j") == json.loads(CANNED[case][1])
        assert _outcome(lambda c: c.job("j"), plain)[0] == _outcome(lambda c: c.job("j"), via_httpx)[0] == "ApiError"
        return
    for call in calls:
        got_plain, got_httpx = _outcome(call, plain), _outcome(call, via_httpx)
        assert got_plain[0] == expected, (case, got_plain)
        assert got_httpx[0] == expected, (case, got_httpx)
        if expected != "ApiError" or case in ("server-error", "validation"):
            assert got_plain == got_httpx, case  # the refusal's message and status, word for word
    if case == "conflict":
        assert _outcome(lambda c: c.job("j"), plain) == ("Conflict", "busy", None)
    if case == "validation":
        assert _outcome(lambda c: c.job("j"), plain) == ("ApiError", "field required", 422)
    if case == "server-error":
        assert _outcome(lambda c: c.job("j"), plain) == ("ApiError", "HTTP 500", 500)


def test_the_plain_transport_leaves_httpx_aside_for_https(spotrain_home: Path) -> None:
    """``https://`` (a controller behind TLS) keeps httpx; plain ``http://`` does not build it."""
    assert Client("http://127.0.0.1:1", token="x")._http is None
    tls = Client("https://127.0.0.1:1", token="x")
    assert isinstance(tls._http, httpx.Client) and tls._plain is None
