"""``spotrain run SPEC``: an embedded controller on the local cloud, following one job to its end."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

from ..fleet.runs import reap_abandoned_runs, write_owner
from .params import policy_params_option, read_policy_params

__all__ = ["reap_abandoned_runs", "run_command"]


@click.command("run")
@click.argument("spec_path", metavar="SPEC")
@click.option("--scenario", "scenario_path", default=None, metavar="FILE",
              help="Script the local cloud (docs/formats.md: scenario files).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a spec field (value read as YAML).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON on the last line.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--detach", is_flag=True,
              help="Submit to the controller service (started in the background on the local cloud if none runs) "
                   "and return; follow with spotrain attach JOB.")
@policy_params_option
def run_command(spec_path: str, scenario_path: str | None, overrides: tuple[str, ...], as_json: bool, quiet: bool,
                detach: bool, policy_params: str | None) -> None:
    """Run SPEC to completion and print a summary: on the started controller when one runs (or, with
    --detach, on one started in the background), else on an embedded controller and the local cloud."""
    from autoscaler.jobs.spec import load_spec

    from ..errors import SpecError
    from .follow import service_client

    params = read_policy_params(policy_params)
    spec, workdir = load_spec(spec_path, overrides=overrides)
    client = service_client() if scenario_path is None else None
    if params is not None and client is not None:
        raise SpecError("--policy-params sets the policy of the controller this command starts, "
                        f"but the controller at {client.url} runs its own: "
                        "start it with `spotrain controller start --policy-params FILE`")
    if detach:
        if scenario_path:
            raise SpecError("--scenario scripts the embedded local cloud of `spotrain run`; it cannot be used with --detach")
        client = client or _start_local_service(policy_params)
        job = client.submit(spec.to_dict(), str(workdir))
        if as_json:
            from . import render

            click.echo(render.as_json(job.to_json_dict()))
        else:
            click.echo(f"submitted {job.job_id} to {client.url}; follow it with: spotrain attach {job.job_id} "
                       f"(or spotrain logs -f {job.job_id}); stop it with: spotrain cancel {job.job_id}")
        return
    out = sys.stderr if as_json else sys.stdout
    if client is not None:
        _run_on_service(client, spec, workdir, out, as_json=as_json, quiet=quiet)
    else:
        _run_embedded(spec, workdir, scenario_path, out, as_json=as_json, quiet=quiet, params=params)


def _start_local_service(policy_params: str | None = None) -> Any:
    """A controller service on the local cloud, started in the background for ``--detach``."""
    from autoscaler.client.http import Client

    from .controller import start_daemon

    url, log = start_daemon(["--cloud", "local", "--port", "0",
                             *(["--policy-params", os.path.abspath(policy_params)] if policy_params else [])])
    click.echo(f"spotrain: started a controller in the background on {url} (log: {log}; "
               "stop it with: spotrain controller stop)", err=True)
    return Client(url)


def _run_on_service(client: Any, spec: Any, workdir: Path, out: Any, *, as_json: bool, quiet: bool) -> None:
    """Submit to the started controller and follow the job there; Ctrl-C cancels it (the job is this
    command's), ``spotrain attach`` follows without owning."""
    from .follow import Follower, HttpSource, follow
    from .progress import make_view

    job = client.submit(spec.to_dict(), str(workdir))
    t0 = time.time()
    view = make_view(out, t0=t0, quiet=quiet)
    batch = spec.training.global_batch_size
    view.line_of(job.job_id, batch)
    view.say(f"spotrain: running {job.job_id} on the controller at {client.url} (logs: spotrain logs -f {job.job_id})")
    try:
        final = follow(Follower(HttpSource(client, job.job_id), view))
    except KeyboardInterrupt:
        view.close()
        client.cancel(job.job_id)
        click.echo(f"spotrain: interrupted; {job.job_id} cancelled and its instances released", err=True)
        sys.exit(130)
    view.close()
    _report(final, out, as_json)


def _run_embedded(spec: Any, workdir: Path, scenario_path: str | None, out: Any, *, as_json: bool, quiet: bool,
                  params: Any = None) -> None:
    from ..home import db_url
    from ..state import Store
    from .follow import Follower, LocalSource, follow
    from .progress import make_view

    scenario = _load_scenario(scenario_path)
    lease_s = _lease_s()
    store = Store(db_url())
    reap_abandoned_runs(store)
    ctl, setup, lease = _embedded_controller(store, scenario, params, lease_s)
    from autoscaler.client.logs import install_controller_log

    from ..home import localcloud_dir

    install_controller_log(path=localcloud_dir(ctl.controller_id) / "controller.log")
    _end_on_signals()
    ctl.start()
    api = _serve_embedded(ctl)
    job = ctl.submit(spec, workdir, scenario={"file": scenario_path} if scenario_path else None)
    job_id = job["job_id"]
    t0 = time.time()
    view = make_view(out, t0=t0, quiet=quiet)
    view.line_of(job_id, spec.training.global_batch_size)
    view.say(f"spotrain: running {job_id} on the local cloud (market x{setup.clock_rate:g} time; "
             f"logs: spotrain logs -f {job_id}; cancel: spotrain cancel {job_id}; dashboard: spotrain dashboard --open)")
    try:
        follow(Follower(LocalSource(ctl, job_id), view), interval_s=0.25)
    except KeyboardInterrupt:
        view.close()
        ctl.cancel(job_id)
        api.close()
        ctl.shutdown()
        lease.stop()
        click.echo(f"spotrain: interrupted; {job_id} cancelled and its instances released", err=True)
        sys.exit(130)
    view.close()
    api.close()
    ctl.shutdown()
    _release_leftovers(setup.provider)
    lease.stop()
    _report(ctl.job_info(job_id), out, as_json)


def _lease_s() -> float:
    """The owner lease's period (``SPOTRAIN_RUN_LEASE_S``, ``cloud_providers/local/owner.py``); a bad
    value is a one-line error before anything starts."""
    from cloud_providers.local.owner import lease_s_from_env

    from ..errors import SpecError

    try:
        return lease_s_from_env()
    except ValueError as exc:
        raise SpecError(str(exc)) from None


class _EmbeddedApi:
    """The embedded controller's HTTP API, on a free loopback port for the command's lifetime: so
    that ``spotrain status``, ``logs -f``, ``attach`` and ``cancel`` work from another terminal while
    ``spotrain run`` follows its job. It is recorded in controller.json (marked ``embedded``) when no
    live controller is recorded there, and in the run's owner file either way."""

    def __init__(self, ctl: Any) -> None:
        import socket
        import threading

        import uvicorn

        from autoscaler.server.api import create_app
        from cloud_providers.local.owner import proc_start

        from ..home import ensure_token, localcloud_dir, read_controller_info, write_controller_info

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(ctl, ensure_token(), refuse_submit=(
            f"the controller here is the embedded one of a `spotrain run` (pid {os.getpid()}), which ends with it; "
            "start a controller for new jobs with `spotrain controller start --daemon`")), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="spotrain-run-api")
        self.thread.start()
        info = read_controller_info()
        pid = int(str(info.get("pid", 0))) if info else 0
        self.registered = info is None or pid <= 0 or proc_start(pid) is None
        if self.registered:
            write_controller_info(self.url, os.getpid(), embedded=ctl.controller_id)
        write_owner(localcloud_dir(ctl.controller_id), url=self.url)

    def close(self) -> None:
        from ..home import controller_file, read_controller_info

        self.server.should_exit = True
        self.thread.join(timeout=5)
        info = read_controller_info()
        if self.registered and info is not None and info.get("pid") == os.getpid():
            controller_file().unlink(missing_ok=True)


def _serve_embedded(ctl: Any) -> _EmbeddedApi:
    return _EmbeddedApi(ctl)


def _load_scenario(scenario_path: str | None) -> Any:
    """The local cloud's scenario from ``--scenario`` (None without one); a bad file is a SpecError."""
    from cloud_providers.local.scenario import ScenarioError, load_scenario

    from ..errors import SpecError

    if not scenario_path:
        return None
    try:
        return load_scenario(scenario_path)
    except ScenarioError as exc:
        raise SpecError(str(exc)) from None


def _embedded_controller(store: Any, scenario: Any, params: Any, lease_s: float) -> tuple[Any, Any, Any]:
    """A fresh local cloud (its owner file written, its owner lease held and renewed: its machines
    stop once this command is gone) and a controller over it (the spotrain policy with ``params``
    when given), not started; and the lease, to stop when the cloud has been emptied."""
    from autoscaler.fleet.clouds import local_cloud
    from cloud_providers.local.owner import OwnerLease

    from ..controller import Controller
    from ..home import localcloud_dir
    from ..policy import get_policy
    from ..policy.spotrain import SpotrainPolicy

    cloud_id = f"run-{uuid.uuid4().hex[:8]}"
    setup = local_cloud(cloud_id, scenario=scenario, owner_lease_s=lease_s)
    write_owner(localcloud_dir(cloud_id))
    lease = OwnerLease(localcloud_dir(cloud_id), lease_s=lease_s).start()
    ctl = Controller(
        store=store, provider=setup.provider, executor=setup.executor,
        policy=get_policy() if params is None else SpotrainPolicy(params),
        controller_id=cloud_id, tick_s=0.25, clock_rate=setup.clock_rate,
    )
    return ctl, setup, lease


def _end_on_signals() -> None:
    """SIGTERM and SIGHUP end the embedded cloud as Ctrl-C does: no worker may outlive this command."""

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)


def _release_leftovers(provider: Any) -> None:
    """The embedded cloud goes away with this command: nothing it launched may outlive it."""
    for inst in provider.list_instances({}):
        if inst.alive:
            provider.terminate(inst.instance_id)
            click.echo(f"spotrain: released {inst.instance_id}, still running after the job ended", err=True)


def _report(j: dict[str, Any], out: Any, as_json: bool) -> None:
    """The summary (and with ``--json`` the job as JSON); exit 1 unless the job succeeded."""
    from ..state import JobState
    from . import render

    click.echo("", file=out)
    click.echo(render.summary(j), file=out)
    if as_json:
        click.echo(render.as_json(j))
    if j["state"] != JobState.SUCCEEDED.value:
        sys.exit(1)


command = run_command
