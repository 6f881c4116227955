"""``spotrain run SPEC``: an embedded controller on the local cloud, following one job to its end."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

OWNER_FILE = "owner.json"
# A run whose owner file is missing (written right after its cloud starts) counts as abandoned only
# once its job is this old: a run starting at the same moment is not mistaken for a dead one.
OWNER_GRACE_S = 60.0


# Event kinds the progress lines show.
SHOWN_EVENTS = ("state", "preemption-notice", "launched", "capacity", "released", "instance-terminated")


@click.command("run")
@click.argument("spec_path", metavar="SPEC")
@click.option("--scenario", "scenario_path", default=None, metavar="FILE", help="Script the local cloud (DESIGN.md).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a spec field (value read as YAML).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON on the last line.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def run_command(spec_path: str, scenario_path: str | None, overrides: tuple[str, ...], as_json: bool, quiet: bool) -> None:
    """Run SPEC to completion on the local cloud and print a summary."""
    from ..home import db_url
    from ..spec import load_spec
    from ..state import Store

    spec, workdir = load_spec(spec_path, overrides=overrides)
    scenario = _load_scenario(scenario_path)
    store = Store(db_url())
    reap_abandoned_runs(store)
    ctl, setup = _embedded_controller(store, scenario)
    _end_on_signals()
    ctl.start()
    job = ctl.submit(spec, workdir, scenario={"file": scenario_path} if scenario_path else None)
    job_id = job["job_id"]
    out = sys.stderr if as_json else sys.stdout

    def say(msg: str) -> None:
        if not quiet:
            click.echo(msg, file=out)

    t0 = time.time()
    say(f"spotrain: running {job_id} on the local cloud (market x{setup.clock_rate:g} time; logs: spotrain logs {job_id})")
    try:
        _follow(ctl, store, job_id, t0, say)
    except KeyboardInterrupt:
        ctl.cancel(job_id)
        ctl.shutdown()
        click.echo(f"spotrain: interrupted; {job_id} cancelled and its instances released", err=True)
        sys.exit(130)
    ctl.shutdown()
    _release_leftovers(setup.provider)
    _report(ctl.job_info(job_id), out, as_json)


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


def _embedded_controller(store: Any, scenario: Any) -> tuple[Any, Any]:
    """A fresh local cloud (its owner file written) and a controller over it; neither started."""
    from ..clouds import local_cloud
    from ..controller import Controller
    from ..home import localcloud_dir
    from ..policy import get_policy

    cloud_id = f"run-{uuid.uuid4().hex[:8]}"
    setup = local_cloud(cloud_id, scenario=scenario)
    write_owner(localcloud_dir(cloud_id))
    ctl = Controller(
        store=store, provider=setup.provider, executor=setup.executor, policy=get_policy(),
        controller_id=cloud_id, tick_s=0.25, clock_rate=setup.clock_rate,
    )
    return ctl, setup


def _end_on_signals() -> None:
    """SIGTERM and SIGHUP end the embedded cloud as Ctrl-C does: no worker may outlive this command."""

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)


def _follow(ctl: Any, store: Any, job_id: str, t0: float, say: Callable[[str], None]) -> None:
    """Print the job's events and (at most every 2 s, when it changes) a status line until it ends."""
    from ..state import JobState

    terminal = {s.value for s in JobState if s.terminal}
    seen_events = 0
    last_line = ""
    last_print = 0.0
    while True:
        time.sleep(0.25)
        seen_events = _say_new_events(store, job_id, seen_events, t0, say)
        j = ctl.job_info(job_id)
        line = _status_line(j, t0)
        if j["state"] in terminal:
            break
        if line[9:] != last_line[9:] and time.time() - last_print >= 2.0:
            say(line)
            last_line, last_print = line, time.time()


def _say_new_events(store: Any, job_id: str, seen: int, t0: float, say: Callable[[str], None]) -> int:
    """Print the shown events of ``job_id`` after the first ``seen``; the number of events now."""
    with store.session() as s:
        events = store.events(s, job_id)
        for e in events[seen:]:
            if e.kind in SHOWN_EVENTS:
                what = f"{e.from_state} -> {e.to_state}" if e.kind == "state" else e.kind
                say(f"[{e.ts - t0:6.1f}s] {what}: {e.reason}")
        return len(events)


def _status_line(j: dict[str, Any], t0: float) -> str:
    from . import render

    metric = j.get("metric")
    return (
        f"[{time.time() - t0:6.1f}s] {j['state']:<12} step {render.progress_str(j):<16} "
        + (f"{j.get('metric_name')} {metric:.3f}  " if isinstance(metric, (int, float)) else "")
        + f"workers {render.workers_str(j)}  cost {render.money(j['cost_usd'])}"
    )


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


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat): with the pid it names one
    process, whatever pid reuse happened since."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def write_owner(cloud_dir: Path) -> None:
    pid = os.getpid()
    (cloud_dir / OWNER_FILE).write_text(json.dumps({"pid": pid, "start": _proc_start(pid)}))


def _owner_alive(cloud_dir: Path) -> bool | None:
    """True/False for a recorded owner, None when no owner was recorded."""
    try:
        owner: dict[str, Any] = json.loads((cloud_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    start = _proc_start(int(owner.get("pid", -1)))
    return start is not None and start == owner.get("start")


def reap_abandoned_runs(store: Any) -> list[str]:
    """End the jobs of earlier ``spotrain run`` commands that were killed (SIGKILL, a crash, a closed
    terminal): their embedded controller died with them, so nothing would ever release their workers,
    bill their last seconds or end them, and their names would stay taken. Each is re-opened on its
    own local cloud, its instances terminated (which stops its workers) and the job marked FAILED."""
    from ..clouds import local_cloud
    from ..controller import Controller
    from ..home import home
    from ..policy import get_policy

    with store.session() as s:
        stale = [(j.job_id, j.controller_id, j.submitted_at) for j in store.jobs(s, live_only=True) if j.controller_id.startswith("run-")]
    reaped: list[str] = []
    for job_id, cid, submitted_at in stale:
        cloud_dir = home() / "localcloud" / cid
        alive = _owner_alive(cloud_dir)
        if alive or (alive is None and time.time() - submitted_at < OWNER_GRACE_S):
            continue
        setup = local_cloud(cid)
        ctl = Controller(store=store, provider=setup.provider, executor=setup.executor, policy=get_policy(),
                         controller_id=cid, tick_s=1.0, clock_rate=setup.clock_rate)
        ctl.fail_abandoned(job_id, "the spotrain run that owned this job is gone (killed); its workers were stopped")
        reaped.append(job_id)
    return reaped
