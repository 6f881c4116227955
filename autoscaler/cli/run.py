"""``spotrain run SPEC``: an embedded controller on the local cloud, following one job to its end."""

from __future__ import annotations

import signal
import sys
import time
import uuid

import click


@click.command("run")
@click.argument("spec_path", metavar="SPEC")
@click.option("--scenario", "scenario_path", default=None, metavar="FILE", help="Script the local cloud (DESIGN.md).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a spec field (value read as YAML).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON on the last line.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def run_command(spec_path: str, scenario_path: str | None, overrides: tuple[str, ...], as_json: bool, quiet: bool) -> None:
    """Run SPEC to completion on the local cloud and print a summary."""
    from cloud_providers.local.scenario import ScenarioError, load_scenario

    from ..clouds import local_cloud
    from ..controller import Controller
    from ..errors import SpecError
    from ..home import db_url
    from ..policy import get_policy
    from ..spec import load_spec
    from ..state import JobState, Store
    from . import render

    spec, workdir = load_spec(spec_path, overrides=overrides)
    scenario = None
    if scenario_path:
        try:
            scenario = load_scenario(scenario_path)
        except ScenarioError as exc:
            raise SpecError(str(exc)) from None
    cloud_id = f"run-{uuid.uuid4().hex[:8]}"
    setup = local_cloud(cloud_id, scenario=scenario)
    store = Store(db_url())
    ctl = Controller(
        store=store, provider=setup.provider, executor=setup.executor, policy=get_policy(),
        controller_id=cloud_id, tick_s=0.25, clock_rate=setup.clock_rate,
    )
    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM and SIGHUP end the embedded cloud as Ctrl-C does: no worker may outlive this command.
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    ctl.start()
    job = ctl.submit(spec, workdir, scenario={"file": scenario_path} if scenario_path else None)
    job_id = job["job_id"]
    out = sys.stderr if as_json else sys.stdout

    def say(msg: str) -> None:
        if not quiet:
            click.echo(msg, file=out)

    t0 = time.time()
    say(f"spotrain: running {job_id} on the local cloud (market x{setup.clock_rate:g} time; logs: spotrain logs {job_id})")
    seen_events = 0
    last_line = ""
    last_print = 0.0
    try:
        while True:
            time.sleep(0.25)
            with store.session() as s:
                events = store.events(s, job_id)
                for e in events[seen_events:]:
                    if e.kind in ("state", "preemption-notice", "launched", "capacity", "released", "instance-terminated"):
                        what = f"{e.from_state} -> {e.to_state}" if e.kind == "state" else e.kind
                        say(f"[{e.ts - t0:6.1f}s] {what}: {e.reason}")
                seen_events = len(events)
            j = ctl.job_info(job_id)
            metric = j.get("metric")
            line = (
                f"[{time.time() - t0:6.1f}s] {j['state']:<12} step {render.progress_str(j):<16} "
                + (f"{j.get('metric_name')} {metric:.3f}  " if isinstance(metric, (int, float)) else "")
                + f"workers {render.workers_str(j)}  cost {render.money(j['cost_usd'])}"
            )
            if j["state"] in {s.value for s in JobState if s.terminal}:
                break
            if line[9:] != last_line[9:] and time.time() - last_print >= 2.0:
                say(line)
                last_line, last_print = line, time.time()
    except KeyboardInterrupt:
        ctl.cancel(job_id)
        ctl.shutdown()
        click.echo(f"spotrain: interrupted; {job_id} cancelled and its instances released", err=True)
        sys.exit(130)
    ctl.shutdown()
    # The embedded cloud goes away with this command: nothing it launched may outlive it.
    for inst in setup.provider.list_instances({}):
        if inst.alive:
            setup.provider.terminate(inst.instance_id)
            click.echo(f"spotrain: released {inst.instance_id}, still running after the job ended", err=True)
    j = ctl.job_info(job_id)
    click.echo("", file=out)
    click.echo(render.summary(j), file=out)
    if as_json:
        click.echo(render.as_json(j))
    if j["state"] != JobState.SUCCEEDED.value:
        sys.exit(1)


command = run_command
