"""The controller's HTTP API (FastAPI, OpenAPI at /docs and /openapi.json), bearer-token protected.

The CLI is its main client. With ``--executor remote`` the instance agents call the agent endpoints
(``api_agents.py``) with their per-instance credentials; with the local executor, workers report
through the executor's progress file instead.

Answers are the models of ``schemas.py``. Errors are not translated by each endpoint: the controller
raises the types of ``errors.py`` (and the provider's ``ProviderError``), and the exception handlers
installed here turn each into its status (``ERROR_STATUS``, most specific type first) and an
``ErrorBody`` naming the type, which the client maps back to the same type.
"""

from __future__ import annotations

import hmac
import time
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from cloud_providers.errors import ProviderError

from .api_agents import agent_router_for
from .controller import Controller, job_summary
from .domain import IllegalTransition
from .errors import AuthError, Conflict, DomainError, JobNotFound, SpecError, SpotrainError
from .logs import job_logs
from .schemas import ErrorBody, Health, JobEvent, JobEvents, JobList, JobSummary, SubmitRequest
from .spec import spec_from_dict

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


def create_app(controller: Controller, token: str) -> FastAPI:
    app = FastAPI(title="spotrain controller", version="1")
    install_error_handlers(app)
    started = time.time()

    def auth(request: Request) -> None:
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            raise AuthError("invalid or missing API token")

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return Health(ok=True, controller_id=controller.controller_id, uptime_s=time.time() - started,
                      last_tick_error=controller.last_tick_error)

    @app.post("/v1/jobs", dependencies=[Depends(auth)], response_model=JobSummary, responses=_refusals(409, 422))
    def submit(req: SubmitRequest) -> Any:
        spec = spec_from_dict(req.spec)
        workdir = Path(req.workdir)
        if not workdir.is_absolute() or not workdir.is_dir():
            raise SpecError(f"workdir: {req.workdir!r} is not an absolute directory")
        return controller.submit(spec, workdir)

    @app.get("/v1/jobs", dependencies=[Depends(auth)], response_model=JobList, responses=_refusals())
    def list_jobs() -> JobList:
        with controller.store.session() as s:
            return JobList([job_summary(j, controller.store.instances(s, j.job_id)) for j in controller.store.jobs(s)])

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
        return controller.cancel(ref)

    # Job ids and costs are not for anyone on the network (``--host 0.0.0.0`` for remote agents):
    # scrape with the token (Prometheus: ``authorization: {credentials_file: ~/.spotrain/token}``).
    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(auth)], responses=_refusals())
    def metrics() -> str:
        from .metrics import render_metrics

        return render_metrics(controller.store)

    app.include_router(agent_router_for(controller))
    return app
