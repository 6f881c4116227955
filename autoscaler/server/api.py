"""The controller's HTTP API (FastAPI, OpenAPI at /docs and /openapi.json), bearer-token protected.

Every request passes ``RequestGuard`` first (issue 14, finding 4: a 300 MB POST without a token was
read whole before its 401). It checks the credential from the headers alone, before any byte of the
body is read: the API token, or on the agents' paths an agent credential; only ``/healthz`` is open,
and it says no more than that the controller is up unless the token comes with it (finding 11). The
schema and its pages (``/docs``, ``/openapi.json``) need the token like everything else. A body is
then read by the guard itself, at most ``max_body_bytes`` (413 past it, announced or not) within
``body_timeout_s`` (408), before any parsing.

The CLI is its main client. With ``--executor remote`` the instance agents call the agent endpoints
(``remote/endpoints.py``) with their per-instance credentials; with the local executor, workers report
through the executor's progress file instead.

Answers are the models of ``server/schemas.py``. Errors are not translated by each endpoint: the controller
raises the types of ``errors.py`` (and the provider's ``ProviderError``), and the exception handlers
installed here turn each into its status (``ERROR_STATUS``, most specific type first) and an
``ErrorBody`` naming the type, which the client maps back to the same type.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autoscaler.client.logs import job_logs, read_output
from autoscaler.controller import Controller
from autoscaler.errors import AuthError, Conflict, DomainError, JobNotFound, SpecError, SpotrainError
from autoscaler.jobs.domain import IllegalTransition, JobState, NotOwner
from autoscaler.jobs.spec import spec_from_dict
from autoscaler.remote.endpoints import AGENT_PATHS, agent_gate_for, agent_router_for
from autoscaler.server.dashboard import LINK_PATH, LOGIN_PATH, PREFIX, cookie_token_ok, dashboard_router
from autoscaler.server.listing import DEFAULT_LIMIT, MAX_LIMIT, job_page
from autoscaler.server.login_links import LoginLinks
from autoscaler.server.schemas import ErrorBody, Health, JobEvent, JobEvents, JobList, JobSummary, LoginLink, SubmitRequest
from autoscaler.state.store import LIVE_SELECTOR
from cloud_providers.errors import ProviderError

# Bounds of one request: the API's bodies (a spec, an agent's report) are a few kB.
MAX_BODY_BYTES = 1024 * 1024
BODY_TIMEOUT_S = 30.0
PUBLIC_PATHS = frozenset({"/healthz", LOGIN_PATH, LINK_PATH})
# The paging headers of ``GET /v1/jobs`` (its OpenAPI says so).
_PAGE_HEADERS = {
    "x-total-count": {"description": "Jobs that match the state selector", "schema": {"type": "integer"}},
    "x-next-offset": {"description": "offset of the next page; absent on the last page", "schema": {"type": "integer"}},
}

# Each error type's HTTP status; a type not listed takes its nearest listed base's.
ERROR_STATUS: dict[type[Exception], int] = {
    SpotrainError: 400,
    AuthError: 401,
    JobNotFound: 404,
    DomainError: 409,
    Conflict: 409,
    SpecError: 422,
    IllegalTransition: 500,
    ProviderError: 503,
}


def status_of(exc: Exception) -> int:
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return 500


def _error_response(status: int, detail: str, error: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(ErrorBody(detail=detail, error=error).model_dump(), status_code=status, headers=headers)


def _on_error(_request: Request, exc: Exception) -> JSONResponse:
    detail = str(exc)
    if isinstance(exc, ProviderError):
        detail = f"the cloud refused: {type(exc).__name__}: {exc}"
    return _error_response(status_of(exc), detail, type(exc).__name__)


def _on_invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors]
    return _error_response(422, "; ".join(parts) or str(exc), "RequestValidationError")


def install_error_handlers(app: FastAPI) -> None:
    """One handler per listed type; Starlette picks the nearest one along the error's MRO."""
    for cls in ERROR_STATUS:
        app.add_exception_handler(cls, _on_error)
    app.add_exception_handler(RequestValidationError, _on_invalid_request)


def _refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI's account of an endpoint's refusals: the token's 401 and ``statuses``."""
    return {s: {"model": ErrorBody} for s in (401, *statuses)}


class RequestGuard:
    """ASGI middleware: credentials from the headers, then a bounded, timed body, then the app.

    ``authorized(path, headers)`` decides from the headers alone; a refused request gets its 401
    with no byte of its body read (``connection: close``: the rest is never read), or under
    ``login_prefix`` (the dashboard's pages, for a browser) a redirect to ``login_path``. A body is
    read here, whole, at most ``max_body_bytes`` within ``body_timeout_s``, and handed to the app from
    memory, so the app never waits on a slow client or holds more than the limit.
    """

    def __init__(self, app: ASGIApp, *, authorized: Callable[[str, Headers], bool], public_paths: Collection[str],
                 max_body_bytes: int, body_timeout_s: float, login_prefix: str = PREFIX, login_path: str = LOGIN_PATH) -> None:
        if max_body_bytes < 0 or body_timeout_s <= 0:
            raise ValueError("max_body_bytes must be >= 0 and body_timeout_s > 0")
        self.app = app
        self.authorized = authorized
        self.public_paths = frozenset(public_paths)
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.login_prefix, self.login_path = login_prefix, login_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path = scope["path"]
        if path not in self.public_paths and not self.authorized(path, headers):
            if path == self.login_prefix or path.startswith(self.login_prefix + "/"):
                await RedirectResponse(self.login_path, status_code=303, headers={"connection": "close"})(scope, receive, send)
            else:
                await self._refuse(scope, receive, send, 401, "invalid or missing API token", "AuthError")
            return
        length = headers.get("content-length")
        if length is None and "transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body (HTTP/1.1: neither a length nor chunks)
            return
        if length is not None and (not length.strip().isdigit() or int(length) > self.max_body_bytes):
            await self._refuse(scope, receive, send, 413, f"the request body is larger than {self.max_body_bytes} bytes",
                               "RequestTooLarge")
            return
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.body_timeout_s)
        except asyncio.TimeoutError:
            await self._refuse(scope, receive, send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                               "RequestTimeout")
            return
        if body is None:
            return  # the client left
        if len(body) > self.max_body_bytes:
            await self._refuse(scope, receive, send, 413, f"the request body is larger than {self.max_body_bytes} bytes",
                               "RequestTooLarge")
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only the client's disconnect

        await self.app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The body (None if the client left); reading stops at the first chunk past the limit, so
        a longer answer means "too large"."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            chunks.append(chunk)
            if size > self.max_body_bytes or not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str, error: str) -> None:
        response = _error_response(status, detail, error)
        response.headers["connection"] = "close"
        await response(scope, receive, send)


def _install_follow_endpoints(app: FastAPI, controller: Controller, auth: Callable[[Request], None]) -> Callable[[str], bytes]:
    """Resume, a worker's output by offset (``spotrain logs -f``) and the report picture; returns the
    picture's renderer (the dashboard shows it too)."""

    @app.post("/v1/jobs/{ref}/resume", dependencies=[Depends(auth)], response_model=JobSummary,
              responses=_refusals(404, 409, 422))
    def resume(ref: str) -> Any:
        """Submit the continuation of a cancelled or failed job, from its last checkpoint."""
        from autoscaler.server.resume import resume_job

        return resume_job(controller, ref)

    @app.get("/v1/jobs/{ref}/spec", dependencies=[Depends(auth)], responses=_refusals(404))
    def job_spec(ref: str) -> dict[str, Any]:
        """The job's spec as submitted (the follower reads its batch size for samples/s)."""
        with controller.store.session() as s:
            job = controller.store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            spec: dict[str, Any] = json.loads(job.spec_json)
            return spec

    @app.get("/v1/jobs/{ref}/output", dependencies=[Depends(auth)], response_class=Response, responses=_refusals(404))
    def output(ref: str, attempt: int, rank: int = 0, offset: int = 0) -> Response:
        """Bytes of a worker's log from ``offset`` (``x-next-offset``: where to ask from next)."""
        job_id = controller.job_info(ref)["job_id"]
        data, nxt = read_output(job_id, attempt=attempt, rank=rank, offset=offset)
        return Response(data, media_type="application/octet-stream", headers={"x-next-offset": str(nxt)})

    def report_png(ref: str) -> bytes:
        from autoscaler.client.report import report_png as render

        info = controller.job_info(ref)
        own_live = not JobState(info["state"]).terminal and info.get("cloud") == controller.provider.name
        return render(controller.store, info["job_id"], now_clock_s=controller.provider.now_s() if own_live else None)

    @app.get("/v1/jobs/{ref}/report.png", dependencies=[Depends(auth)], response_class=Response, responses=_refusals(404))
    def report(ref: str) -> Response:
        """The job's report picture (PNG): progress against the deadline, workers by market, cost."""
        return Response(report_png(ref), media_type="image/png")

    return report_png


def _install_list_endpoint(app: FastAPI, controller: Controller, auth: Callable[[Request], None]) -> None:
    """``GET /v1/jobs``: one page of jobs (``server/listing.py``; issue 21, finding 7)."""

    @app.get("/v1/jobs", dependencies=[Depends(auth)], response_model=JobList, responses={
        **_refusals(422), 200: {"headers": _PAGE_HEADERS, "description": "One page of jobs"}})
    def list_jobs(
        response: Response,
        state: str = Query(LIVE_SELECTOR, description="live (default), ended, all, or a comma-separated list of states"),
        limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Jobs on this page"),
        offset: int = Query(0, ge=0, description="Jobs to skip (x-next-offset of the previous page)"),
        order: str = Query("oldest", pattern="^(oldest|newest)$", description="oldest (default) or newest first"),
    ) -> JobList:
        """One page of jobs: the live ones by default, oldest first (``server/listing.py``)."""
        with controller.store.session() as s:
            page = job_page(controller.store, s, state=state, limit=limit, offset=offset, order=order)
        response.headers["x-total-count"] = str(page.total)
        if page.next_offset is not None:
            response.headers["x-next-offset"] = str(page.next_offset)
        return JobList(page.jobs)


def _credentials(controller: Controller, token: str) -> tuple[Callable[[str], bool], Callable[[str, Headers], bool]]:
    """``has_token(authorization)``, and the guard's ``authorized(path, headers)``: the token, an
    agent's credential on the agents' paths, or the dashboard's cookie on the dashboard's pages (and
    there only: it never opens the API)."""
    if not token:
        raise ValueError("the API token must be a non-empty secret")
    expected = f"Bearer {token}".encode()
    agent_gate = agent_gate_for(controller)

    def has_token(authorization: str) -> bool:
        # A bearer with an empty credential never matches, whatever the token (issue 21, finding 4).
        return authorization.startswith("Bearer ") and len(authorization) > 7 and hmac.compare_digest(
            authorization.encode(), expected)

    def authorized(path: str, headers: Headers) -> bool:
        authorization = headers.get("authorization", "")
        if agent_gate is not None and path in AGENT_PATHS:
            return agent_gate(path, headers)
        if has_token(authorization):
            return True
        return (path == PREFIX or path.startswith(PREFIX + "/")) and cookie_token_ok(headers.get("cookie", ""), token)

    return has_token, authorized


def _cancel(controller: Controller, ref: str, token: str) -> Any:
    try:
        return controller.cancel(ref)
    except NotOwner as exc:
        # A job of a `spotrain run` (its own embedded controller): asked of it, over its API; or, when
        # that command is gone, cancelled here in the database (``fleet/runs.py``).
        forwarded = _cancel_at_owner(exc.owner, exc.job_id, token)
        if forwarded is None:
            forwarded = _cancel_abandoned(controller, exc.owner, exc.job_id)
        if forwarded is None:
            raise
        return forwarded


def _cancel_abandoned(controller: Controller, owner: str, job_id: str) -> dict[str, Any] | None:
    from autoscaler.fleet.runs import cancel_abandoned, is_run, owner_alive

    if not is_run(owner) or owner_alive(owner):
        return None
    return cancel_abandoned(controller.store, job_id, owner)


def _cancel_at_owner(owner: str, job_id: str, token: str) -> dict[str, Any] | None:
    """Cancel ``job_id`` at its owner when that is a live ``spotrain run``, which serves its API on
    the URL in its owner file (``cli/run.py``); None when the owner cannot be asked."""
    import httpx

    from autoscaler.home import fleet_dir

    try:
        info = json.loads((fleet_dir() / "localcloud" / owner / "owner.json").read_text())
    except (OSError, ValueError):
        return None
    url = info.get("url") if isinstance(info, dict) and owner.startswith("run-") else None
    if not isinstance(url, str) or not url.startswith("http://127.0.0.1:"):
        return None
    try:
        r = httpx.post(f"{url}/v1/jobs/{job_id}/cancel", headers={"authorization": f"Bearer {token}"}, timeout=10)
    except httpx.TransportError:
        return None
    data = r.json() if r.status_code == 200 else None
    return data if isinstance(data, dict) else None


def _install_dashboard(app: FastAPI, controller: Controller, token: str, auth: Callable[[Request], None],
                       report_png: Callable[[str], bytes], links: LoginLinks) -> None:
    """The dashboard's pages (``/ui``) and the API's door to them: ``POST /v1/dashboard/links``."""

    @app.post("/v1/dashboard/links", dependencies=[Depends(auth)], response_model=LoginLink, responses=_refusals())
    def dashboard_link() -> LoginLink:
        """A one-time login link to the dashboard (``spotrain dashboard``): its path on this
        controller, valid once within ``expires_in_s``."""
        return LoginLink(path=f"{LINK_PATH}?t={links.issue()}", expires_in_s=links.ttl_s)

    app.include_router(dashboard_router(controller, token, report_png, cancel=lambda ref: _cancel(controller, ref, token),
                                        links=links))


def create_app(controller: Controller, token: str, *, max_body_bytes: int = MAX_BODY_BYTES,
               body_timeout_s: float = BODY_TIMEOUT_S, refuse_submit: str | None = None,
               login_links: LoginLinks | None = None) -> FastAPI:
    """The controller's app. ``max_body_bytes`` and ``body_timeout_s`` bound each request's body.
    ``refuse_submit``: why this controller takes no new jobs (the embedded one of ``spotrain run``,
    which ends with that command), or None. ``login_links``: the dashboard's one-time links (tests
    pass one on a fake clock; default: a fresh one)."""
    links = login_links or LoginLinks()
    app = FastAPI(title="spotrain controller", version="1")
    install_error_handlers(app)
    started = time.time()
    has_token, authorized = _credentials(controller, token)

    app.add_middleware(RequestGuard, authorized=authorized, public_paths=PUBLIC_PATHS, max_body_bytes=max_body_bytes,
                       body_timeout_s=body_timeout_s)

    def auth(request: Request) -> None:
        if not has_token(request.headers.get("authorization", "")):
            raise AuthError("invalid or missing API token")

    @app.get("/healthz", response_model=Health)
    def healthz(request: Request) -> Any:
        """Up, to anyone; the controller's id, uptime and last tick error only with the token."""
        if not has_token(request.headers.get("authorization", "")):
            return JSONResponse(Health(ok=True).model_dump(exclude_none=True))
        return Health(ok=True, controller_id=controller.controller_id, uptime_s=time.time() - started,
                      last_tick_error=controller.last_tick_error, role=controller.role)

    @app.post("/v1/jobs", dependencies=[Depends(auth)], response_model=JobSummary, responses=_refusals(409, 422))
    def submit(req: SubmitRequest) -> Any:
        if refuse_submit:
            raise Conflict(refuse_submit)
        spec = spec_from_dict(req.spec)
        workdir = Path(req.workdir)
        if not workdir.is_absolute() or not workdir.is_dir():
            raise SpecError(f"workdir: {req.workdir!r} is not an absolute directory")
        return controller.submit(spec, workdir)

    _install_list_endpoint(app, controller, auth)

    @app.get("/v1/jobs/{ref}", dependencies=[Depends(auth)], response_model=JobSummary, responses=_refusals(404))
    def get_job(ref: str) -> Any:
        return controller.job_info(ref)

    @app.get("/v1/jobs/{ref}/events", dependencies=[Depends(auth)], response_model=JobEvents, responses=_refusals(404))
    def events(ref: str) -> JobEvents:
        store = controller.store
        with store.session() as s:
            job = store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            return JobEvents([JobEvent(ts=e.ts, kind=e.kind, from_state=e.from_state, to_state=e.to_state, reason=e.reason)
                              for e in store.events(s, job.job_id)])

    @app.get("/v1/jobs/{ref}/logs", dependencies=[Depends(auth)], response_class=PlainTextResponse,
             responses=_refusals(404, 422))
    def logs(ref: str, rank: int | None = None) -> str:
        return job_logs(controller.store, ref, rank=rank)

    @app.post("/v1/jobs/{ref}/cancel", dependencies=[Depends(auth)], response_model=JobSummary,
              responses=_refusals(404, 409, 503))
    def cancel(ref: str) -> Any:
        return _cancel(controller, ref, token)

    # Job ids and costs are not for anyone on the network (``--host 0.0.0.0`` for remote agents):
    # scrape with the token (Prometheus: ``authorization: {credentials_file: ~/.spotrain/token}``).
    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(auth)], responses=_refusals())
    def metrics() -> str:
        from autoscaler.server.metrics import render_metrics

        return render_metrics(controller.store)

    report_png = _install_follow_endpoints(app, controller, auth)
    app.include_router(agent_router_for(controller))
    _install_dashboard(app, controller, token, auth, report_png, links)
    return app
