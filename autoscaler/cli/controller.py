"""``spotrain controller start``: the controller as a service (HTTP API + reconcile loop)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

import click


@click.group("controller")
def controller_command() -> None:
    """Run the controller service."""


CLOUDS = ("local", "aws", "gcp")


def _clouds(value: str) -> str:
    """``--cloud``: one of CLOUDS, or a comma-separated list of them (``aws,gcp``)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in CLOUDS]
    if not names or bad:
        raise click.BadParameter(f"{value!r}: choose from {', '.join(CLOUDS)} (several as aws,gcp)")
    return ",".join(names)


@controller_command.command("start")
@click.option("--cloud", default="local", show_default=True, callback=lambda _ctx, _param, value: _clouds(value),
              help="local, aws or gcp; or several real clouds under one controller: aws,gcp.")
@click.option("--executor", type=click.Choice(["local", "remote"]), default="local", show_default=True,
              help="local: run each instance's workers as processes on this machine (local cloud, moto). "
                   "remote: each cloud instance runs the spotrain agent, which runs its workers.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8470, show_default=True, help="0 picks a free port.")
@click.option("--tick", "tick_s", type=click.FloatRange(min=0.05), default=0.5, show_default=True,
              help="Reconcile interval, seconds.")
@click.option("--id", "controller_id", default=None, help="Controller id (default: controller-<cloud>).")
@click.option("--advertise-url", default=None,
              help="URL the instance agents reach this controller on (--executor remote; default: the bound URL).")
@click.option("--rendezvous-port", type=click.IntRange(1, 65535), default=29500, show_default=True,
              help="torch.distributed port on each gang's first instance (--executor remote).")
def start(cloud: str, executor: str, host: str, port: int, tick_s: float, controller_id: str | None,
          advertise_url: str | None, rendezvous_port: int) -> None:
    """Start the controller in the foreground; it serves until SIGTERM/SIGINT."""
    import uvicorn

    from ..api import create_app
    from ..clouds import make_cloud
    from ..controller import Controller
    from ..errors import SpotrainError
    from ..home import controller_file, db_url, ensure_token, write_controller_info
    from ..policy import get_policy
    from ..state import Store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = ensure_token()
    cid = controller_id or f"controller-{cloud.replace(',', '-')}"
    # Bound first: with --executor remote, the instances' user data carries the controller's address.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # Listening from now on: a client that reads controller.json (written before the server's
        # loop starts) queues in the backlog instead of being refused.
        sock.listen(128)
    except OSError as exc:
        raise SpotrainError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    actual_port = sock.getsockname()[1]
    url = f"http://{host}:{actual_port}"
    if executor == "remote" and advertise_url is None and host in ("0.0.0.0", "::"):
        raise SpotrainError(f"--advertise-url is required with --host {host}: instances cannot reach {url}")
    store = Store(db_url())
    from cloud_providers.errors import CredentialsError, ProviderError

    try:
        setup = make_cloud(cloud, cloud_id=cid, executor=executor, store=store, advertise_url=advertise_url or url,
                           rendezvous_port=rendezvous_port)
    except ValueError as exc:
        raise SpotrainError(str(exc)) from None
    except ProviderError as exc:
        # e.g. GCP credentials, checked once when the provider is built.
        raise SpotrainError(f"{cloud}: {exc}") from None

    # Fail fast, in one line, on missing credentials or an unreachable cloud endpoint: each cloud of a
    # multi-cloud controller on its own (its composite would carry on without one).
    for name, provider in (getattr(setup.provider, "providers", None) or {cloud: setup.provider}).items():
        try:
            provider.offerings()
        except CredentialsError as exc:
            raise SpotrainError(f"{name}: {exc}") from None
        except ProviderError as exc:
            raise SpotrainError(f"{name}: cannot list offerings: {exc}") from None
    ctl = Controller(store=store, provider=setup.provider, executor=setup.executor, policy=get_policy(),
                     controller_id=cid, tick_s=tick_s, clock_rate=setup.clock_rate)
    try:
        ctl.start()  # reconciles with the cloud first (recovery)
    except ProviderError as exc:
        raise SpotrainError(f"{cloud}: recovery could not reach the cloud: {exc}") from None
    write_controller_info(url, os.getpid())
    click.echo(f"spotrain controller {cid} on {url} (cloud {cloud}, executor {executor}, db {store.url})", err=True)
    server = uvicorn.Server(uvicorn.Config(create_app(ctl, token), log_level="warning", lifespan="off"))

    def stop(signum: int, _frame: object) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    try:
        server.run(sockets=[sock])
    finally:
        ctl.shutdown()
        try:
            controller_file().unlink()
        except FileNotFoundError:
            pass
    sys.exit(0)
