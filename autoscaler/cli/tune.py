"""``spotrain tune``: tune the spotrain policy's parameters on a market trace with Optuna (issue 15).

Seeded TPE over ``TUNING_RANGES`` (``autoscaler/policy/params.py``), trials on the simulator's fast
path from random starts in the trace's first part (``--train-fraction``), a trial with any deadline
miss infeasible (``autoscaler/policy/tuning.py``). The study lives in a SQLite file (``--study``,
default ``$SPOTRAIN_HOME/tune/studies.db``), so running the same command again resumes it with more
trials. The result is then evaluated against the defaults on the held-back later part of the trace
and that comparison is printed first: the training figure is the one the search was chosen on, and
flatters. ``--out`` writes a parameters file ``simulate``, ``estimate``, ``run`` and
``controller start`` accept as ``--policy-params FILE``.

Optuna (the ``tune`` extra) is imported by this command only; this module imports only click at load.
``--policy-params`` (``params.policy_params_option``) is shared with the commands above.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import click

from .params import NON_NEGATIVE, SEED, STARTS, FiniteFloat


def _study_name(trace_path: str, job_path: str, overrides: tuple[str, ...], extra: dict[str, Any]) -> str:
    """One study per (trace, job, setup): the name hashes the files' contents and the options."""
    from autoscaler.jobs.spec import MAX_SPEC_BYTES
    from cloud_providers.local.market import MAX_TRACE_BYTES
    from cloud_providers.safe_files import FileRefused, read_regular_file

    from ..errors import SpecError

    h = hashlib.sha256()
    for p, limit in ((trace_path, MAX_TRACE_BYTES), (job_path, MAX_SPEC_BYTES)):
        try:  # bounded regular files (issue 21, finding 11): a FIFO is refused, never waited on
            h.update(read_regular_file(p, max_bytes=limit, what=""))
        except FileRefused as exc:
            raise SpecError(str(exc)) from None
    h.update(json.dumps([list(overrides), extra], sort_keys=True).encode())
    return f"spotrain-{h.hexdigest()[:16]}"


@click.command("tune")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, exists=True), required=True,
              help="Market trace CSV to tune on.")
@click.option("--job", "job_path", type=click.Path(dir_okay=False, exists=True), required=True,
              help="Job spec YAML (its simulate: and objective: sections).")
@click.option("--trials", type=click.IntRange(1, 100000), default=50, show_default=True,
              help="Optuna trials to run (more, on a resumed study).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds the TPE sampler and the start times.")
@click.option("--starts", type=STARTS, default=40, show_default=True, help="Random start times in the training window.")
@click.option("--test-starts", type=STARTS, default=None, help="Random start times in the held-back window (default: --starts).")
@click.option("--train-fraction", type=FiniteFloat(), default=0.6, show_default=True,
              help="The first part of the trace that is tuned on; the rest is held back for the report.")
@click.option("--restart-overhead-hours", type=NON_NEGATIVE, default=None, help="Restart overhead d (default: 6 min).")
@click.option("--study", "study_path", type=click.Path(dir_okay=False), default=None,
              help="SQLite file holding the study, resumed when it exists (default: $SPOTRAIN_HOME/tune/studies.db).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="policy-params.json", show_default=True,
              help="Where to write the tuned parameters (.json, or .yaml/.yml).")
@click.option("--set", "overrides", multiple=True, help="Override a spec field, key.path=value.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (held_back first).")
def command(trace_path: str, job_path: str, trials: int, seed: int, starts: int, test_starts: int | None,
            train_fraction: float, restart_overhead_hours: float | None, study_path: str | None, out_path: str,
            overrides: tuple[str, ...], as_json: bool) -> None:
    """Tune the spotrain policy's parameters on TRACE for JOB; report tuned vs default on the held-back part first."""
    from ..errors import SpecError

    try:
        import optuna  # noqa: F401 - checked here for a one-line message
    except ImportError:
        raise SpecError("spotrain tune needs Optuna: pip install 'spotrain[tune]'") from None
    out = _tune(trace_path, job_path, trials=trials, seed=seed, starts=starts, test_starts=test_starts or starts,
                train_fraction=train_fraction, overhead_h=restart_overhead_hours, study_path=study_path, out_path=out_path,
                overrides=overrides, progress=not as_json)
    if as_json:
        click.echo(json.dumps(out))
        return
    _print(out)


def _tune(trace_path: str, job_path: str, *, trials: int, seed: int, starts: int, test_starts: int,
          train_fraction: float, overhead_h: float | None, study_path: str | None, out_path: str,
          overrides: tuple[str, ...], progress: bool) -> dict[str, Any]:
    from autoscaler.jobs.spec import load_spec

    from ..errors import SpecError
    from ..home import home, private_dir
    from ..policy.base import eligible_offerings
    from ..policy.params import DEFAULT_PARAMS, save_params_file
    from ..policy.tuning import score, split_windows, train_and_test_starts, tune
    from ..simulator import Simulation, make_sim_job
    from .simulate import load_trace

    if not 0.0 < train_fraction < 1.0:
        raise click.UsageError("--train-fraction must be in (0, 1)")
    spec, _ = load_spec(job_path, overrides=overrides)
    trace = load_trace(trace_path)
    if not eligible_offerings(spec, trace.offerings_at(0.0)):
        raise SpecError("trace error: no offering in the trace matches the job's resources")
    job = make_sim_job(spec, spec_dir=Path(job_path).resolve().parent,
                       restart_overhead_s=None if overhead_h is None else overhead_h * 3600)
    try:
        w = split_windows(trace, job, train_fraction)
    except ValueError as exc:
        raise SpecError(f"trace too short to tune on: {exc}") from None
    train, test = train_and_test_starts(w, starts, test_starts, seed)
    sim = Simulation(trace, spec)
    study = Path(study_path) if study_path else private_dir(home() / "tune") / "studies.db"
    name = _study_name(trace_path, job_path, overrides, {"seed": seed, "starts": starts, "train_fraction": train_fraction,
                                                         "restart_overhead_s": job.restart_overhead_s})

    def on_trial(n: int, v: float) -> None:
        if progress:
            click.echo(f"trial {n}: {v:.4f}", err=True)

    res = tune(sim, job, train, trials=trials, seed=seed, storage=f"sqlite:///{study.resolve()}", study_name=name,
               on_trial=on_trial)
    written = save_params_file(res.best, out_path)
    legs = {"held_back": (w.split_s, w.duration_s, test), "training": (0.0, w.split_s, train)}
    report: dict[str, Any] = {}
    for leg, (lo, hi, ss) in legs.items():
        tuned, default = score(sim, job, res.best, ss), score(sim, job, DEFAULT_PARAMS, ss)
        report[leg] = {"window_hours": [lo / 3600, hi / 3600], "starts_hours": [s / 3600 for s in ss],
                       "tuned": tuned.to_json(), "default": default.to_json()}
    report.update({"trials": res.trials, "infeasible_trials": res.infeasible_trials, "study": str(study),
                   "study_name": res.study_name,
                   "seed": seed, "train_fraction": train_fraction, "restart_overhead_s": job.restart_overhead_s,
                   "params_file": str(written), "params": res.best.to_dict()})
    return report


def _line(leg: str, r: dict[str, Any]) -> str:
    t, d = r["tuned"], r["default"]
    tm, dm = t["mean_cost_over_on_demand"], d["mean_cost_over_on_demand"]
    lo, hi = r["window_hours"]
    return (f"{leg} (trace hours {lo:.0f}-{hi:.0f}, {t['runs']} starts): cost / on-demand tuned {tm:.3f} vs default {dm:.3f} "
            f"({(tm / dm - 1) * 100:+.1f} %), p90 {t['p90_cost_over_on_demand']:.3f} vs {d['p90_cost_over_on_demand']:.3f}, "
            f"deadline misses {t['deadline_misses']} vs {d['deadline_misses']}")


def _print(out: dict[str, Any]) -> None:
    click.echo(_line("held-back", out["held_back"]))
    click.echo(_line("training", out["training"]))
    click.echo(f"{out['trials']} trials in study {out['study_name']} ({out['study']}), {out['infeasible_trials']} infeasible "
               f"(a deadline missed); wrote {out['params_file']}")
