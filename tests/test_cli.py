"""The CLI's edges: bad input is one line naming the problem with a non-zero exit, and it starts fast."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import run_cli

GOOD = """\
name: ok-job
run: python train.py
resources: {accelerators: [T4:1], clouds: [aws]}
workers: {min: 1, max: 2}
training: {logical_workers: 2, global_batch_size: 32}
objective: {budget_usd: 5}
"""

BAD = {
    "yaml-syntax": (GOOD + "workers: {min: 1, max: [\n", "YAML syntax error"),
    "unknown-field": (GOOD + "colour: blue\n", "colour: unknown field"),
    "wrong-type": (GOOD.replace("max: 2", "max: many"), "workers.max"),
    "negative-budget": (GOOD.replace("budget_usd: 5", "budget_usd: -3"), "objective.budget_usd"),
    "min-over-max": (GOOD.replace("min: 1, max: 2", "min: 4, max: 2"), "min (4) is greater than max (2)"),
    "unknown-accelerator": (GOOD.replace("T4:1", "X100:1"), "unknown accelerator 'X100'"),
    "empty-run": (GOOD.replace("run: python train.py", "run: '   '"), "run: must not be empty"),
    "not-a-mapping": ("- just\n- a list\n", "must be a YAML mapping"),
    # A rule across two sections (a model-level check: pydantic gives it no field location).
    "workers-over-logical": (GOOD.replace("max: 2", "max: 3"), "workers.max (3) exceeds training.logical_workers (2)"),
    "infinite-work": (GOOD + "simulate: {work_gpu_hours: .inf}\n", "simulate.work_gpu_hours"),
    # The rule in words, not the regex (issue 24, item 8).
    "bad-name": (GOOD.replace("name: ok-job", "name: Ok_Job"),
                 "name: 'Ok_Job' is not a valid job name: use 1 to 63 lowercase letters, digits and '-'"),
}


@pytest.mark.parametrize("command", ["run", "submit", "estimate"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_spec_is_one_line(spotrain_home: Path, tmp_path: Path, command: str, case: str) -> None:
    text, expected = BAD[case]
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    r = run_cli(command, str(spec), env={"SPOTRAIN_CONTROLLER_URL": "http://127.0.0.1:9"})
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize("name", ["Ok_Job", "-lead", "trail-", "a" * 64, "dot.ted"])
def test_bad_name_error_names_the_rule_not_a_regex(name: str) -> None:
    from autoscaler.errors import SpecError
    from autoscaler.jobs.spec import parse_spec_text

    with pytest.raises(SpecError) as err:
        parse_spec_text(GOOD.replace("name: ok-job", f"name: {name}"))
    msg = str(err.value)
    assert msg.startswith("spec error: name: ") and "lowercase letters, digits and '-'" in msg, msg
    assert not any(c in msg for c in "^$[]{}"), msg  # no pattern syntax


def test_bad_set_override_and_missing_file(spotrain_home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(GOOD)
    r = run_cli("run", str(spec), "--set", "workers.min=7")
    assert r.returncode != 0 and "min (7) is greater than max (2)" in r.stderr
    r = run_cli("run", str(tmp_path / "nope.yaml"))
    assert r.returncode != 0 and "no such file" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bad_scenario_is_one_line(spotrain_home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(GOOD)
    sc = tmp_path / "sc.yaml"
    sc.write_text("events:\n  - {at: 10s, preempt: 0}\n")
    r = run_cli("run", str(spec), "--scenario", str(sc))
    assert r.returncode != 0 and "events[0].preempt" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_never_imports_torch() -> None:
    code = "import autoscaler.cli.main, autoscaler.controller, autoscaler.server.api, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import autoscaler.cli.main, sys; assert 'torch' not in sys.modules and 'fastapi' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_is_fast() -> None:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "autoscaler.cli.main", "--help"], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0 and "simulate" in r.stdout
    # Generous bound for a noisy 2-core machine; typically ~0.1 s.
    assert elapsed < 2.0
    for cmd in ("run", "controller", "submit", "status", "logs", "cancel"):
        r = run_cli(cmd, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, (cmd, r.stderr)


@pytest.mark.parametrize("url", ["nonsense://x", "sqlite:////nonexistent-dir/x.db"])
def test_bad_database_url_is_one_line(spotrain_home: Path, url: str) -> None:
    r = run_cli("status", env={"SPOTRAIN_DB_URL": url})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "state database" in r.stderr


def test_status_and_logs_read_the_database_without_a_controller(spotrain_home: Path, tmp_path: Path) -> None:
    import json

    from autoscaler.controller import Controller
    from autoscaler.fleet.clouds import local_cloud
    from autoscaler.home import db_url
    from autoscaler.jobs.spec import load_spec
    from autoscaler.policy import get_policy
    from autoscaler.state import Store
    from support import write_pw_spec

    setup = local_cloud("cli-offline")
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                     controller_id="cli-offline", clock_rate=setup.clock_rate)
    spec, workdir = load_spec(write_pw_spec(tmp_path, extra="objective: {deadline: 2h}\n"))
    job_id = ctl.submit(spec, workdir)["job_id"]
    ctl.cancel(job_id)
    assert not (spotrain_home / "controller.json").exists()

    listed = run_cli("status", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout.strip().splitlines()[-1])
    assert isinstance(jobs, list) and [j["job_id"] for j in jobs] == [job_id]
    one = json.loads(run_cli("status", job_id, "--json").stdout.strip().splitlines()[-1])
    assert one["state"] == "CANCELLED" and one["deadline_met"] is False and one["final_model"] is None
    table = run_cli("status", job_id)
    assert table.returncode == 0 and job_id in table.stdout and "CANCELLED" in table.stdout
    logs = run_cli("logs", job_id)
    assert logs.returncode == 0 and "PENDING -> CANCELLED" in logs.stdout
    missing = run_cli("status", "no-such-job")
    assert missing.returncode == 5 and missing.stderr.strip() == "spotrain: no job 'no-such-job'"
