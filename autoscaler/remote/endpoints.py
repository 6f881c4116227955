"""The agents' HTTP endpoints: instance agents fetch their assignment and report their workers.

Included in the controller's app (``server/api.py``) when it runs with ``--executor remote``; otherwise the
router is empty. Authentication is separate from the user API: an agent signs each request with the
credential of its own launch decision and a counter (``remote/auth.py``, ``cloud_providers/remote/wire.py``):
the signature is checked from the headers before the body is read (``agent_gate_for``, and the agents'
listener), then the body's (or query's) hash and the counter here, so a replayed request gets 409.
The controller maps the decision to the instance it launched, so an agent reads and writes nothing but
its own instance's assignment and reports. The user API token is never accepted here, nor an agent
credential on the user API.

``spotrain controller start --executor remote`` serves these endpoints on a listener of their own, over
HTTPS with the controller's pinned certificate (``remote/listener.py``); the executor is then
``served_apart`` and the user API, plain HTTP, neither serves them nor accepts agent credentials.

Wire format: ``cloud_providers/remote/wire.py``. The router translates its own refusals (the lookup
errors of ``remote/executor.py``, a malformed report): the agent's protocol gives them meaning, and
the router also serves without the controller's app (tests mount it alone).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Request
from starlette.datastructures import Headers

from autoscaler.remote.auth import signed_decision
from autoscaler.remote.executor import (
    AgentLookupError,
    InstanceNotYetKnown,
    InstanceTerminated,
    RemoteExecutor,
    WrongInstance,
    check_report,
)
from cloud_providers.remote.wire import (
    ASSIGNMENT_PATH,
    CONTENT_SHA256_HEADER,
    LAST_SEQ_HEADER,
    METHODS,
    OUTPUT_PATH,
    REPORT_PATH,
    OutputChunk,
    Report,
    SignedRequest,
    WireError,
    parse_signed,
)

if TYPE_CHECKING:
    from autoscaler.controller import Controller


# What each lookup refusal means to the agent (``cloud_providers/remote/wire.py``): 404 retry, 410 stop.
LOOKUP_STATUS: dict[type[AgentLookupError], int] = {InstanceNotYetKnown: 404, InstanceTerminated: 410, WrongInstance: 403}
# The paths only an agent credential opens (the controller's app checks it before reading a body).
AGENT_PATHS = frozenset({ASSIGNMENT_PATH, REPORT_PATH, OUTPUT_PATH})


def _signed(path: str, headers: Headers) -> SignedRequest | None:
    return parse_signed(path, headers.get("authorization", ""), headers.get(CONTENT_SHA256_HEADER.lower(), ""))


def signed_by_agent(executor: RemoteExecutor, path: str, headers: Headers) -> bool:
    """Whether a request to an agent's ``path`` is signed with a credential of this fleet's key (the
    check before any byte of the body is read; the method is the path's one, ``METHODS``)."""
    method = METHODS.get(path)
    return method is not None and signed_decision(executor.agent_token, _signed(path, headers), method) is not None


def agent_gate_for(controller: "Controller") -> Callable[[str, Headers], bool] | None:
    """Whether a request to an agent's path is signed by one of this controller's agents (None when
    its executor is not remote, or its agents are served apart: then no path here is an agent's)."""
    executor = controller.executor
    if not isinstance(executor, RemoteExecutor) or executor.served_apart:
        return None
    return lambda path, headers: signed_by_agent(executor, path, headers)


async def _content(request: Request) -> bytes:
    """What the signature's hash covers: the body of a POST, the raw query string of the GET."""
    if request.method == "GET":
        query: bytes = request.scope.get("query_string", b"")
        return query
    return await request.body()


def agent_router(executor: RemoteExecutor) -> APIRouter:
    router = APIRouter(tags=["agents"])

    def identify(request: Request, content: bytes, claimed_instance_id: str | None) -> str:
        """The caller's instance, once its signature, content hash and counter hold (401, 409)."""
        signed = _signed(request.url.path, request.headers)
        decision_id = signed_decision(executor.agent_token, signed, request.method)
        if signed is None or decision_id is None:
            raise HTTPException(status_code=401, detail="invalid or missing agent signature")
        if not hmac.compare_digest(hashlib.sha256(content).hexdigest(), signed.content_sha256):
            raise HTTPException(status_code=401, detail="the request's content does not match its signature")
        last = executor.accept_seq(decision_id, signed.seq)
        if last is not None:
            raise HTTPException(status_code=409, headers={LAST_SEQ_HEADER: str(last)},
                                detail=f"replayed or stale agent request: seq {signed.seq} is not above {last}")
        try:
            return executor.instance_for(decision_id, claimed_instance_id)
        except AgentLookupError as exc:
            raise HTTPException(status_code=LOOKUP_STATUS.get(type(exc), 400), detail=str(exc)) from None

    @router.get(ASSIGNMENT_PATH)
    def assignment(request: Request, instance_id: str | None = None, content: bytes = Depends(_content)) -> dict[str, Any]:
        """The caller's assignment: latest attempt, its directive, and the stop order."""
        return executor.assignment(identify(request, content, instance_id)).to_json()

    @router.post(REPORT_PATH)
    def report(request: Request, body: dict[str, Any] = Body(...), content: bytes = Depends(_content)) -> dict[str, Any]:
        """Record the caller's report; answers with its current assignment."""
        try:
            parsed = Report.from_json(body)
            check_report(parsed)
        except WireError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        instance_id = identify(request, content, parsed.instance_id)
        try:
            executor.record_report(instance_id, parsed)
        except WireError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        return executor.assignment(instance_id).to_json()

    @router.post(OUTPUT_PATH)
    def output(request: Request, body: dict[str, Any] = Body(...), content: bytes = Depends(_content)) -> dict[str, int]:
        """Append a chunk of one of the caller's rank logs to the controller's copy."""
        try:
            chunk = OutputChunk.from_json(body)
        except WireError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        instance_id = identify(request, content, None)
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
