"""The agents' listener: ``/v1/agent/*`` over HTTPS, apart from the user API (``--executor remote``).

``spotrain controller start --executor remote`` binds a second socket, ``--agent-host`` (default
``--host``) and ``--agent-port`` (default ``--port`` + 1; 0 picks a free port), and serves there, with
uvicorn in a thread of its own, an app with the agents' endpoints only (``remote/endpoints.py``), behind the
same request guard as the user API (the agent's signature checked from the headers before any byte of
a body is read; bodies bounded and timed). TLS uses the controller's self-signed certificate
(``remote/tls.py``), which every instance's agent config carries and the agent pins. The user API stays plain
HTTP on ``--host``/``--port`` (loopback by default) and no longer serves the agents' paths, so only
the agents' port has to be reachable from the instances.

``--advertise-url`` (what the agents are told) defaults to ``https://<agent host>:<agent port>``; it
must be ``https://``: behind a NAT or a TCP load balancer give the address the instances see, the
certificate stays the same.
"""

from __future__ import annotations

import atexit
import dataclasses
import socket
import threading
from typing import Any
from urllib.parse import urlparse

from fastapi import FastAPI, Response
from starlette.datastructures import Headers

from autoscaler.errors import SpotrainError
from autoscaler.remote.endpoints import AGENT_PATHS, agent_router, signed_by_agent
from autoscaler.remote.executor import RemoteExecutor
from autoscaler.remote.tls import AgentCert, ensure_agent_cert
from autoscaler.server.api import BODY_TIMEOUT_S, MAX_BODY_BYTES, RequestGuard, install_error_handlers
from cloud_providers.agent_boot import WHEEL_PATH


def agents_app(executor: RemoteExecutor) -> FastAPI:
    """The agents' endpoints alone, each request's credential checked first (``RequestGuard``), and
    the controller's wheel for booting instances (public: it is the code they will run, no secret,
    and the boot checks its sha256 from the agent config)."""
    app = FastAPI(title="spotrain agents", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    wheel = executor.agent_wheel
    public = (WHEEL_PATH + wheel.name,) if wheel is not None else ()
    if wheel is not None:
        @app.get(WHEEL_PATH + wheel.name)
        def agent_wheel() -> Response:
            return Response(content=wheel.data, media_type="application/octet-stream",
                            headers={"content-disposition": f"attachment; filename={wheel.name}"})

    def authorized(path: str, headers: Headers) -> bool:
        return path in AGENT_PATHS and signed_by_agent(executor, path, headers)

    app.add_middleware(RequestGuard, authorized=authorized, public_paths=public, max_body_bytes=MAX_BODY_BYTES,
                       body_timeout_s=BODY_TIMEOUT_S)
    app.include_router(agent_router(executor))
    return app


@dataclasses.dataclass
class AgentListener:
    """The bound agents' socket, its URL and the certificate served on it."""

    sock: socket.socket
    url: str
    cert: AgentCert
    advertised: str = ""  # the URL the agents are told (``advertise``)
    _server: Any = None
    _thread: threading.Thread | None = None

    def advertise(self, advertise_url: str | None) -> str:
        """The URL agents are told: ``advertise_url`` (it must be https://) or this listener's."""
        url = advertise_url or self.url
        if urlparse(url).scheme != "https" or not urlparse(url).netloc:
            raise SpotrainError(f"--advertise-url: {url!r} must be an https:// URL (the agents talk TLS only, to "
                                f"the agents' port, {self.url})")
        self.advertised = url
        return url

    def serve(self, executor: RemoteExecutor) -> None:
        """Serve the agents' app on the socket (a daemon thread), and keep the user API off those paths."""
        import uvicorn

        executor.served_apart = True
        config = uvicorn.Config(agents_app(executor), log_level="warning", lifespan="off",
                                ssl_certfile=str(self.cert.cert_path), ssl_keyfile=str(self.cert.key_path),
                                timeout_graceful_shutdown=3)
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [self.sock]}, name="spotrain-agents",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)  # the controller's process ends after its user API's server

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sock.close()


def agent_listener_for(executor: str, *, host: str, port: int, agent_host: str | None, agent_port: int | None,
                       advertise_url: str | None) -> tuple[AgentListener | None, str | None]:
    """For ``controller start``: with ``--executor remote``, the bound agents' listener and the URL the
    agents are told (``--agent-port`` defaults to ``--port`` + 1, or a free one with ``--port 0``);
    otherwise (None, ``advertise_url``)."""
    if executor != "remote":
        return None, advertise_url
    bind_host = agent_host or host
    if advertise_url is None and bind_host in ("0.0.0.0", "::"):
        raise SpotrainError(f"--advertise-url is required with --agent-host {bind_host}: instances cannot reach it")
    listener = bind_agent_listener(bind_host, agent_port if agent_port is not None else (port + 1 if port else 0))
    try:
        return listener, listener.advertise(advertise_url)
    except SpotrainError:
        listener.close()
        raise


def bind_agent_listener(host: str, port: int) -> AgentListener:
    """Bind (and listen on) the agents' socket and make sure the certificate exists; SpotrainError in
    one line if the port is taken or the certificate cannot be made."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SpotrainError(f"cannot listen for agents on {host}:{port}: {exc.strerror}") from None
    actual = sock.getsockname()[1]
    cert = ensure_agent_cert([host])
    shown = f"[{host}]" if ":" in host else host
    return AgentListener(sock=sock, url=f"https://{shown}:{actual}", cert=cert)


__all__ = ["AgentListener", "agent_listener_for", "agents_app", "bind_agent_listener"]
