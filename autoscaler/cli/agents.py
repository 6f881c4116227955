"""``controller start``'s options for the instance agents (``--executor remote``), kept out of
``controller.py``: the agents' HTTPS listener and how instances install the agent.

- ``--agent-host`` / ``--agent-port``: where the agents' endpoints listen, over TLS with the
  controller's self-signed certificate (``autoscaler/remote/listener.py``, ``autoscaler/remote/tls.py``); default
  ``--host`` and ``--port`` + 1 (a free port with ``--port 0``).
- ``--agent-install``: where the instances install the agent from, pinned to this controller's
  version: ``served`` (default: this controller's own wheel, hash-checked), ``index:URL``,
  ``wheel:URI[#sha256=HEX]`` or ``image`` (``cloud_providers/agent_boot.py``).

The options are read by ``agent_options`` and kept in the click context, so ``start`` takes them
without naming them in its signature.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

_KEY = "spotrain.agent_options"


def agent_options(f: Callable[..., Any]) -> Callable[..., Any]:
    @click.option("--agent-host", default=None,
                  help="Address of the agents' HTTPS listener (--executor remote; default: --host).")
    @click.option("--agent-port", type=click.IntRange(0, 65535), default=None,
                  help="Port of the agents' HTTPS listener (--executor remote; default: --port + 1; 0 picks a free one).")
    @click.option("--agent-install", default=None, metavar="SOURCE",
                  help="Where instances install the agent, pinned to this version (--executor remote): served "
                       "(default: this controller's own wheel, served to them and installed only with its sha256), "
                       "index:URL, wheel:URI[#sha256=HEX] or image.")
    @functools.wraps(f)
    def wrapper(*args: Any, agent_host: str | None, agent_port: int | None, agent_install: str | None,
                **kwargs: Any) -> Any:
        click.get_current_context().meta[_KEY] = {"host": agent_host, "port": agent_port, "install": agent_install}
        return f(*args, **kwargs)

    return wrapper


def _options() -> dict[str, Any]:
    ctx = click.get_current_context(silent=True)
    found = ctx.meta.get(_KEY) if ctx is not None else None
    return found or {"host": None, "port": None, "install": None}


def agent_args() -> list[str]:
    """The agents' options again, for the daemon's command line."""
    o = _options()
    return [*(["--agent-host", o["host"]] if o["host"] else []),
            *(["--agent-port", str(o["port"])] if o["port"] is not None else []),
            *(["--agent-install", o["install"]] if o["install"] else [])]


def agent_listener(executor: str, *, host: str, port: int, advertise_url: str | None) -> tuple[Any, str | None]:
    """(the agents' bound listener or None, the URL the agents are told): ``remote/listener.py``."""
    if executor != "remote":
        return None, advertise_url
    from autoscaler.remote.listener import agent_listener_for

    o = _options()
    return agent_listener_for(executor, host=host, port=port, agent_host=o["host"], agent_port=o["port"],
                              advertise_url=advertise_url)


def agent_cloud_args(listener: Any) -> dict[str, Any]:
    """What ``make_cloud`` needs for the agents: the certificate they pin, the install source."""
    if listener is None:
        return {}
    return {"agent_cert_pem": listener.cert.pem, "agent_install": _options()["install"]}


def serve_agents(listener: Any, executor: Any) -> None:
    """Start serving the agents' endpoints (before the user API's app is made: it leaves them out)."""
    if listener is None:
        return
    listener.serve(executor)
    click.echo(f"agents: {listener.advertised} (TLS; certificate sha256 {listener.cert.sha256}, "
               f"{listener.cert.cert_path})", err=True)
