"""The agents' HTTP endpoints: instance agents fetch their assignment and report their workers.

Included in the controller's app (``api.py``) when it runs with ``--executor remote``; otherwise the
router is empty. Authentication is separate from the user API: an agent presents the credential of its
own launch decision (``remote_executor.agent_credential``), and the controller maps the decision to the
instance it launched, so an agent reads and writes nothing but its own instance's assignment and
reports. The user API token is never accepted here, nor an agent credential on the user API.

``spotrain controller start --executor remote`` serves these endpoints on a listener of their own, over
HTTPS with the controller's pinned certificate (``agent_server.py``); the executor is then
``served_apart`` and the user API, plain HTTP, neither serves them nor accepts agent credentials.

Wire format: ``cloud_providers/remote/wire.py``. The router translates its own refusals (the lookup
errors of ``remote_executor.py``, a malformed report): the agent's protocol gives them meaning, and
the router also serves without the controller's app (tests mount it alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Body, HTTPException, Request

from cloud_providers.remote.wire import ASSIGNMENT_PATH, OUTPUT_PATH, REPORT_PATH, OutputChunk, Report, WireError

from .remote_executor import (
    AgentLookupError,
    InstanceNotYetKnown,
    InstanceTerminated,
    RemoteExecutor,
    WrongInstance,
    check_report,
    decision_of,
)

if TYPE_CHECKING:
    from .controller import Controller


# What each lookup refusal means to the agent (``cloud_providers/remote/wire.py``): 404 retry, 410 stop.
LOOKUP_STATUS: dict[type[AgentLookupError], int] = {InstanceNotYetKnown: 404, InstanceTerminated: 410, WrongInstance: 403}
# The paths only an agent credential opens (the controller's app checks it before reading a body).
AGENT_PATHS = frozenset({ASSIGNMENT_PATH, REPORT_PATH, OUTPUT_PATH})


def _decision(executor: RemoteExecutor, authorization: str) -> str | None:
    credential = authorization[len("Bearer "):] if authorization.startswith("Bearer ") else ""
    return decision_of(executor.agent_token, credential) if credential else None


def agent_gate_for(controller: "Controller") -> Callable[[str], bool] | None:
    """Whether an ``Authorization`` header carries an agent credential this controller issued (None
    when its executor is not remote, or its agents are served apart: then no path here is an agent's)."""
    executor = controller.executor
    if not isinstance(executor, RemoteExecutor) or executor.served_apart:
        return None
    return lambda authorization: _decision(executor, authorization) is not None


def agent_router(executor: RemoteExecutor) -> APIRouter:
    router = APIRouter(tags=["agents"])

    def identify(request: Request, claimed_instance_id: str | None) -> str:
        decision_id = _decision(executor, request.headers.get("authorization", ""))
        if decision_id is None:
            raise HTTPException(status_code=401, detail="invalid or missing agent credential")
        try:
            return executor.instance_for(decision_id, claimed_instance_id)
        except AgentLookupError as exc:
            raise HTTPException(status_code=LOOKUP_STATUS.get(type(exc), 400), detail=str(exc)) from None

    @router.get(ASSIGNMENT_PATH)
    def assignment(request: Request, instance_id: str | None = None) -> dict[str, Any]:
        """The caller's assignment: latest attempt, its directive, and the stop order."""
        return executor.assignment(identify(request, instance_id)).to_json()

    @router.post(REPORT_PATH)
    def report(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """Record the caller's report; answers with its current assignment."""
        try:
            parsed = Report.from_json(body)
            check_report(parsed)
        except WireError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        instance_id = identify(request, parsed.instance_id)
        try:
            executor.record_report(instance_id, parsed)
        except WireError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        return executor.assignment(instance_id).to_json()

    @router.post(OUTPUT_PATH)
    def output(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, int]:
        """Append a chunk of one of the caller's rank logs to the controller's copy."""
        try:
            chunk = OutputChunk.from_json(body)
        except WireError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        instance_id = identify(request, None)
        try:
            return {"next_offset": executor.record_output(instance_id, chunk)}
        except WireError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None

    return router


def agent_router_for(controller: "Controller") -> APIRouter:
    """The agents' endpoints when the controller's executor is remote (and they are not served apart,
    over TLS), else an empty router."""
    if isinstance(controller.executor, RemoteExecutor) and not controller.executor.served_apart:
        return agent_router(controller.executor)
    return APIRouter()
