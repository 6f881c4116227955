"""The controller's HTTP API (FastAPI, OpenAPI at /docs and /openapi.json), bearer-token protected.

The CLI is its main client. With ``--executor remote`` the instance agents call the agent endpoints
(``api_agents.py``) with their per-instance credentials; with the local executor, workers report
through the executor's progress file instead.
"""

from __future__ import annotations

import hmac
import time
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from .api_agents import agent_router_for
from cloud_providers.errors import ProviderError

from .controller import Controller
from .errors import ApiError, JobNotFound, SpecError
from .logs import job_logs
from .spec import spec_from_dict


class SubmitRequest(BaseModel):
    spec: dict[str, Any]
    workdir: str


def create_app(controller: Controller, token: str) -> FastAPI:
    app = FastAPI(title="spotrain controller", version="1")
    started = time.time()

    def auth(request: Request) -> None:
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="invalid or missing API token")

    def not_found(exc: JobNotFound) -> HTTPException:
        return HTTPException(status_code=404, detail=str(exc))

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "controller_id": controller.controller_id, "uptime_s": time.time() - started,
                "last_tick_error": controller.last_tick_error}

    @app.post("/v1/jobs", dependencies=[Depends(auth)])
    def submit(req: SubmitRequest) -> dict[str, Any]:
        try:
            spec = spec_from_dict(req.spec)
        except SpecError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        workdir = Path(req.workdir)
        if not workdir.is_absolute() or not workdir.is_dir():
            raise HTTPException(status_code=422, detail=f"workdir: {req.workdir!r} is not an absolute directory")
        try:
            return controller.submit(spec, workdir)
        except ApiError as exc:
            raise HTTPException(status_code=exc.status, detail=str(exc)) from None

    @app.get("/v1/jobs", dependencies=[Depends(auth)])
    def list_jobs() -> list[dict[str, Any]]:
        from .controller import job_summary

        with controller.store.session() as s:
            return [job_summary(j, controller.store.instances(s, j.job_id)) for j in controller.store.jobs(s)]

    @app.get("/v1/jobs/{ref}", dependencies=[Depends(auth)])
    def get_job(ref: str) -> dict[str, Any]:
        try:
            return controller.job_info(ref)
        except JobNotFound as exc:
            raise not_found(exc) from None

    @app.get("/v1/jobs/{ref}/logs", dependencies=[Depends(auth)], response_class=PlainTextResponse)
    def logs(ref: str, rank: int | None = None) -> str:
        try:
            return job_logs(controller.store, ref, rank=rank)
        except JobNotFound as exc:
            raise not_found(exc) from None

    @app.post("/v1/jobs/{ref}/cancel", dependencies=[Depends(auth)])
    def cancel(ref: str) -> dict[str, Any]:
        try:
            return controller.cancel(ref)
        except JobNotFound as exc:
            raise not_found(exc) from None
        except ApiError as exc:
            raise HTTPException(status_code=exc.status, detail=str(exc)) from None
        except ProviderError as exc:
            raise HTTPException(status_code=503, detail=f"the cloud refused to release the job's instances: {exc}") from None

    # Job ids and costs are not for anyone on the network (``--host 0.0.0.0`` for remote agents):
    # scrape with the token (Prometheus: ``authorization: {credentials_file: ~/.spotrain/token}``).
    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(auth)])
    def metrics() -> str:
        from .metrics import render_metrics

        return render_metrics(controller.store)

    app.include_router(agent_router_for(controller))
    return app
