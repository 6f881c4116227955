"""``spotrain controller start|stop|status``: the controller as a service (HTTP API + reconcile loop).

``start`` serves in the foreground; ``start --daemon`` starts the same command detached from the
terminal (its own session), logging to ``$SPOTRAIN_HOME/controller.log``, and returns once it serves.
``stop`` sends the recorded controller SIGTERM and waits for it to exit; ``status`` says whether one
answers, where, and what it runs.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .agents import agent_args, agent_cloud_args, agent_listener, agent_options, serve_agents
from .params import policy_params_option, read_policy_params

if TYPE_CHECKING:  # the CLI imports the controller's modules lazily, per command
    from autoscaler.fleet.clouds import CloudSetup


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
              help="https:// URL the instance agents reach this controller on (--executor remote; default: the "
                   "agents' listener, --agent-host/--agent-port).")
@click.option("--rendezvous-port", type=click.IntRange(1, 65535), default=29500, show_default=True,
              help="torch.distributed port on each gang's first instance (--executor remote).")
@click.option("--lease-ttl", "lease_ttl_s", type=click.FloatRange(min=1.0), default=10.0, show_default=True,
              help="Seconds the fleet's leader lease lasts unrenewed: controllers with one --id on one database "
                   "share it, one leads and the others stand by, taking over once it expires.")
@click.option("--daemon", is_flag=True, help="Run in the background, logging to $SPOTRAIN_HOME/controller.log.")
@policy_params_option
@agent_options
def start(cloud: str, executor: str, host: str, port: int, tick_s: float, controller_id: str | None,
          advertise_url: str | None, rendezvous_port: int, lease_ttl_s: float, daemon: bool, policy_params: str | None) -> None:
    """Start the controller in the foreground (or with --daemon in the background); it serves until
    SIGTERM/SIGINT (``spotrain controller stop``)."""
    params = read_policy_params(policy_params)  # checked before a daemon starts: the error is seen here
    if daemon:
        args = ["--cloud", cloud, "--executor", executor, "--host", host, "--port", str(port), "--tick", repr(tick_s),
                "--rendezvous-port", str(rendezvous_port), "--lease-ttl", repr(lease_ttl_s),
                *(["--id", controller_id] if controller_id else []),
                *(["--advertise-url", advertise_url] if advertise_url else []),
                *(["--policy-params", os.path.abspath(policy_params)] if policy_params else [])]
        url, log = start_daemon(args + agent_args())
        return click.echo(f"spotrain controller started in the background on {url} (log: {log}); "
                          f"dashboard: {url}/ui (log in with: spotrain dashboard --open); "
                          "stop it with: spotrain controller stop")
    import uvicorn

    from autoscaler.client.logs import install_controller_log
    from autoscaler.fleet.clouds import make_cloud
    from autoscaler.server.api import create_app

    from ..errors import SpotrainError
    from ..home import controller_file, db_url, ensure_token, write_controller_info
    from ..state import Store

    install_controller_log()
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
    # The requested port, not the bound one: with --port 0 the agents get a free port of their own too
    # (actual + 1 may be taken; a race seen in CI).
    agents, advertise_url = agent_listener(executor, host=host, port=port, advertise_url=advertise_url)
    store = Store(db_url())
    from cloud_providers.errors import ProviderError

    try:
        setup = make_cloud(cloud, cloud_id=cid, executor=executor, store=store, advertise_url=advertise_url or url,
                           rendezvous_port=rendezvous_port, **agent_cloud_args(agents))
    except ValueError as exc:
        raise SpotrainError(str(exc)) from None
    except ProviderError as exc:
        # e.g. GCP credentials, checked once when the provider is built.
        raise SpotrainError(f"{cloud}: {exc}") from None

    _fail_fast(cloud, setup)
    ctl = _leased_controller(store, setup, params, cid, tick_s, url, lease_ttl_s,
                             rebuild=(lambda: make_cloud(cloud, cloud_id=cid)) if executor == "local" else None)
    try:
        ctl.start()  # reconciles with the cloud first (recovery)
    except ProviderError as exc:
        raise SpotrainError(f"{cloud}: recovery could not reach the cloud: {exc}") from None
    serve_agents(agents, setup.executor)
    write_controller_info(url, os.getpid())
    _announce(ctl, f"spotrain controller {cid} on {url} (cloud {cloud}, executor {executor}, db {{db}})", url)
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


def _leased_controller(store: Any, setup: Any, params: Any, cid: str, tick_s: float, url: str, lease_ttl_s: float, *,
                       rebuild: Callable[[], Any] | None) -> Any:
    """The controller, as a member of fleet ``cid`` (its leader lease, ``state/lease.py``): it leads, or
    stands by and takes over once the lease expires. ``rebuild``: the cloud setup a takeover acts with
    (the local cloud's state, read afresh), else the one it started with. The live jobs of ``spotrain
    run``s that were killed are settled first (``fleet/runs.py``): nothing else would."""
    from ..controller import Controller
    from ..fleet.runs import reap_abandoned_runs
    from ..home import home
    from ..policy import get_policy
    from ..policy.spotrain import SpotrainPolicy
    from ..state.lease import Holder, LeaderLease

    def on_lead() -> tuple[Any, Any]:
        fresh = rebuild() if rebuild is not None else setup
        return fresh.provider, fresh.executor

    reap_abandoned_runs(store)
    lease = LeaderLease(store.engine, cid, Holder.here(str(home()), url), ttl_s=lease_ttl_s)
    return Controller(store=store, provider=setup.provider, executor=setup.executor,
                      policy=get_policy() if params is None else SpotrainPolicy(params),
                      controller_id=cid, tick_s=tick_s, clock_rate=setup.clock_rate, lease=lease,
                      on_lead=on_lead if rebuild is not None else None)


def _announce(ctl: Any, line: str, url: str) -> None:
    """Say on stderr what runs (``{db}`` in ``line``: the database's URL, without a password), where
    its dashboard is (issue 24: users did not find it) and whether it leads its fleet or stands by."""
    click.echo(line.replace("{db}", ctl.store.engine.url.render_as_string(hide_password=True)), err=True)
    click.echo(f"dashboard: {url}/ui (a one-time login link: spotrain dashboard --open)", err=True)
    lease = ctl.lease
    if lease is not None and not ctl.leading():
        click.echo(f"standby: fleet {ctl.controller_id} is led by {lease.leader.get('url') or 'another controller'}; "
                   f"this one serves reads and takes over once that lease expires ({lease.ttl_s:g} s unrenewed)",
                   err=True)


def _fail_fast(cloud: str, setup: CloudSetup) -> None:
    """Fail fast, in one line, on missing credentials or an unreachable cloud endpoint: each cloud of a
    multi-cloud controller on its own (its composite would carry on without one)."""
    from cloud_providers.errors import CredentialsError, ProviderError

    from ..errors import SpotrainError

    provider = setup.provider
    for name, p in (getattr(provider, "providers", None) or {cloud: provider}).items():
        try:
            p.offerings()
        except CredentialsError as exc:
            raise SpotrainError(f"{name}: {exc}") from None
        except ProviderError as exc:
            raise SpotrainError(f"{name}: cannot list offerings: {exc}") from None


def start_daemon(args: list[str], *, timeout_s: float = 60.0) -> tuple[str, str]:
    """Start ``spotrain controller start ARGS`` detached (its own session, no terminal), its output
    appended to ``$SPOTRAIN_HOME/controller.log``; (its URL, the log's path) once it serves."""
    import json
    import subprocess
    import time

    from ..errors import SpotrainError
    from ..home import controller_file, home

    log = home() / "controller.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "controller", "start", *args],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            info = json.loads(controller_file().read_text())
        except (OSError, ValueError):
            info = {}
        if info.get("pid") == proc.pid:
            return str(info["url"]), str(log)
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise SpotrainError(f"the controller exited at start ({tail[0]}; log: {log})")
        time.sleep(0.1)
    raise SpotrainError(f"the controller did not start within {timeout_s:.0f} s (log: {log})")


def _recorded() -> dict[str, object] | None:
    from ..home import read_controller_info

    return read_controller_info()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@controller_command.command("stop")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds to wait for it to exit.")
def stop_command(timeout_s: float) -> None:
    """Stop the running controller (SIGTERM; its jobs' workers keep running and the next controller
    carries on with them)."""
    import time

    from ..errors import SpotrainError
    from ..home import controller_file

    info = _recorded()
    if info is None:
        click.echo("no controller is running")
        return
    pid = int(str(info.get("pid", 0)))
    if info.get("embedded"):
        raise SpotrainError(f"the recorded controller is the embedded one of `spotrain run` (pid {pid}); "
                            "it ends with that command (Ctrl-C there, or spotrain cancel JOB)")
    if pid <= 0 or not _pid_alive(pid):
        controller_file().unlink(missing_ok=True)
        click.echo(f"no controller is running (removed the stale record of pid {pid})")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout_s
    while time.time() < deadline and _pid_alive(pid) and not _zombie(pid):
        time.sleep(0.1)
    if _pid_alive(pid) and not _zombie(pid):
        raise SpotrainError(f"the controller (pid {pid}) did not exit within {timeout_s:g} s")
    click.echo(f"stopped the controller at {info.get('url')} (pid {pid})")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


@controller_command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status_command(as_json: bool) -> None:
    """Whether a controller answers, where, its id, uptime, live jobs and last tick error; exit 1
    when none runs."""
    import json

    info = _recorded()
    answer: dict[str, object] = {"running": False, "url": info.get("url") if info else None,
                                 "pid": info.get("pid") if info else None,
                                 "embedded": bool(info.get("embedded")) if info else False}
    if info is not None:
        from autoscaler.client.http import Client

        from ..errors import ControllerUnreachable

        try:  # a stale record (its pid gone) is not contacted: Client() says no controller runs
            c = Client()
            h = c.healthz()
            live = c.jobs("live")
        except ControllerUnreachable:
            pass
        else:
            answer.update(running=True, controller_id=h.controller_id, uptime_s=round(h.uptime_s or 0.0, 1),
                          live_jobs=len(live), last_tick_error=h.last_tick_error, role=h.role)
    if as_json:
        click.echo(json.dumps(answer, sort_keys=True))
    elif answer["running"]:
        kind = " (embedded in spotrain run)" if answer["embedded"] else ""
        role = ", standby (the fleet's leader acts)" if answer.get("role") == "standby" else ""
        click.echo(f"controller {answer['controller_id']}{kind} on {answer['url']} (pid {answer['pid']}{role}): up "
                   f"{answer['uptime_s']} s, {answer['live_jobs']} live job(s)"
                   + (f", last tick error: {answer['last_tick_error']}" if answer["last_tick_error"] else ""))
    else:
        click.echo("no controller is running" + (f" (a stale record names {answer['url']})" if info else ""))
    if not answer["running"]:
        sys.exit(1)
