"""Honest outcomes (issue 13): a job is SUCCEEDED only when the runtime recorded completion; a worker
that exits 0 otherwise is a user error naming the likely cause; the failing rank's traceback tail is
in the summary and in ``spotrain logs``; a failure before the first step that repeats with the same
exit code is retried once at most; failed jobs print no result and no savings.

The controller runs on the virtual clock (``World``); the simulated workers are bent by wrapping the
executor's ``status``/``progress``, the way a broken script would behave.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from autoscaler.cli import render
from autoscaler.client.logs import job_logs
from autoscaler.controller.outcomes import completion_recorded, traceback_tail, with_tail
from autoscaler.jobs.spec import spec_from_dict
from autoscaler.jobs.summary import split_reason
from autoscaler.policy import CheapestPolicy
from autoscaler.simulator.executor import SimWorkload
from autoscaler.simulator.world import World
from cloud_providers import protocol
from cloud_providers.executor import GangState, WorkerStatus
from cloud_providers.local.market import HEADER, MarketTrace
from cost_models.scaling import LinearScaling
from support import run_cli

CALM = MarketTrace.parse(",".join(HEADER) + "\n0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,4\n", source="t")
# Spot room vanishes at t=3600 (a 120 s notice): the gang checkpoints and exits 85, or 0 when broken.
PREEMPT = MarketTrace.parse(",".join(HEADER) + "\n" + "\n".join(
    f"{t},aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,{n}" for t, n in ((0, 4), (3600, 0), (4800, 4))) + "\n",
    source="t")
TRACEBACK = textwrap.dedent("""\
    [spotrain] resuming from step 0
    Traceback (most recent call last):
      File "/work/train.py", line 12, in <module>
        loss = 1 / 0
    ZeroDivisionError: division by zero
""")


def spec(retries: int = 2) -> Any:
    return spec_from_dict({"name": "vjob", "run": "python train.py",
                           "resources": {"accelerators": ["V100:1"], "clouds": ["aws"], "spot": "always"},
                           "retries": {"max_restarts_on_errors": retries}})


def world(tr: MarketTrace, logs: Path | None = None) -> World:
    w = World(tr, CheapestPolicy())
    if logs is not None:
        w.controller.ctx.logs_dir = lambda job_id: logs / job_id
    return w


def run(w: World, retries: int = 2) -> tuple[str, dict[str, Any]]:
    job_id = w.submit(spec(retries), SimWorkload(work_s=7200.0, scaling=LinearScaling(), restart_overhead_s=300.0))
    w.run(horizon_s=86400.0)
    return job_id, w.controller.job_info(job_id)


def failing_gangs(w: World, code: int, *, step_of: Any = lambda attempt: 0) -> None:
    """Every gang's rank 0 exits ``code`` at once, having reported ``step_of(attempt)`` steps."""
    inner_progress = w.executor.progress
    attempts: list[int] = []

    def status(instance_id: str, attempt: int) -> WorkerStatus:
        if attempt not in attempts:
            attempts.append(attempt)
        return WorkerStatus(GangState.EXITED, {0: code})

    def progress(job_id: str) -> dict[str, Any] | None:
        base = inner_progress(job_id) or {}
        return {**base, "step": step_of(attempts[-1] if attempts else 0), "total_steps": 720000}

    w.executor.status = status  # type: ignore[method-assign]
    w.executor.progress = progress  # type: ignore[method-assign]


@pytest.mark.parametrize(("runtime_says", "cause"), [
    (False, "without recording completion (no final weights)"),  # no word from the runtime: the likely cause
    (True, "checkpointed at a stop notice at step"),  # the runtime recorded the notice: the cause
])
def test_a_gang_that_exits_0_at_a_notice_is_a_user_error_not_success(runtime_says: bool, cause: str) -> None:
    """The forgotten ``runtime.exit_worker(trainer.finish())``: finish() returns 85 at the notice, the script exits 0."""
    w = world(PREEMPT)
    inner, inner_progress = w.executor.status, w.executor.progress
    stopped: set[str] = set()

    def status(instance_id: str, attempt: int) -> WorkerStatus:
        st = inner(instance_id, attempt)
        stopped.update("yes" for c in st.exit_codes.values() if c == protocol.EXIT_RESCHEDULE)
        codes = {r: (protocol.EXIT_DONE if c == protocol.EXIT_RESCHEDULE else c) for r, c in st.exit_codes.items()}
        return WorkerStatus(st.state, codes)

    def progress(job_id: str) -> dict[str, Any] | None:
        p = inner_progress(job_id)
        return {**(p or {}), "stopped_at_notice": True} if runtime_says and stopped else p

    w.executor.status = status  # type: ignore[method-assign]
    w.executor.progress = progress  # type: ignore[method-assign]
    _, j = run(w)
    assert j["state"] == "FAILED", j
    assert "runtime.exit_worker(trainer.finish())" in j["reason"] and cause in j["reason"], j["reason"]
    assert j["final_model"] is None and j["step"] < j["total_steps"]
    text = render.summary(j)
    assert "saved" not in text and "result" not in text and "model " not in text
    assert "runtime.exit_worker(trainer.finish())" in text


def test_a_job_succeeds_when_the_runtime_recorded_completion() -> None:
    _, j = run(world(CALM))
    assert j["state"] == "SUCCEEDED" and j["final_model"] == "simulated" and j["step"] == j["total_steps"]
    assert j["error_tail"] is None
    assert "spot saved" in render.summary(j)


@pytest.mark.parametrize(("prog", "done"), [
    ({"step": 10, "total_steps": 10, "final_model": "file:///m"}, True),
    ({"step": 3, "total_steps": 10, "final_model": "file:///m", "completed": True}, True),  # the runtime's word
    ({"step": 3, "total_steps": 10, "final_model": "file:///m"}, False),  # the planned work is not done
    ({"step": 10, "total_steps": 10}, False),  # no final weights
    ({"step": 10, "total_steps": 10, "final_model": ""}, False),
    ({"step": 10, "total_steps": 10, "final_model": 7}, False),
    (None, False),
])
def test_completion_needs_final_weights_and_the_planned_work(prog: Any, done: bool) -> None:
    assert completion_recorded(prog) is done


def test_an_early_deterministic_failure_is_retried_once_and_shows_its_traceback(tmp_path: Path,
                                                                               spotrain_home: Path) -> None:
    """``can't open file 'trian.py'``-like: exit 2 before the first step, twice: no third attempt,
    though two restarts were allowed; the traceback's tail is in the summary and in the logs."""
    w = world(CALM, logs=tmp_path)
    failing_gangs(w, 2)
    job_id = w.submit(spec(retries=2), SimWorkload(work_s=7200.0, scaling=LinearScaling(), restart_overhead_s=300.0))
    (tmp_path / job_id).mkdir()
    for attempt in (1, 2, 3):
        (tmp_path / job_id / f"attempt-{attempt}-rank-0.log").write_text(TRACEBACK)
    w.run(horizon_s=86400.0)
    j = w.controller.job_info(job_id)
    assert j["state"] == "FAILED", j
    assert j["attempts"] == 2 and j["restarts_on_errors"] == 1
    assert "same exit code" in j["reason"] and "exited with code 2: ZeroDivisionError: division by zero" in j["reason"]
    assert "\n" not in j["reason"]
    assert j["error_tail"].startswith("Traceback (most recent call last):")
    assert j["error_tail"].endswith("ZeroDivisionError: division by zero")
    text = render.summary(j)
    assert "loss = 1 / 0" in text and "saved" not in text and "result" not in text
    logs = job_logs(w.store, job_id)
    assert "loss = 1 / 0" in logs and "ZeroDivisionError" in logs


def test_a_failure_after_progress_gets_every_allowed_restart() -> None:
    w = world(CALM)
    failing_gangs(w, 2, step_of=lambda attempt: 10 * attempt)
    job_id, j = run(w, retries=2)
    assert j["state"] == "FAILED" and j["attempts"] == 3 and j["restarts_on_errors"] == 2
    # Issue 24, item 8: "restart 2 of 2" then "not retried after 2 restart(s)" read as a contradiction.
    assert "failed after 2 restarts (retries.max_restarts_on_errors: 2): not retried" in j["reason"]
    logs = job_logs(w.store, job_id)
    assert "restarting (restart 2 of at most 2, retries.max_restarts_on_errors)" in logs, logs
    assert "restart 2 of 2" not in logs


def test_different_early_exit_codes_are_retried_as_usual() -> None:
    w = world(CALM)
    codes = iter([2, 1, 3, 4])
    current: dict[int, int] = {}

    def status(instance_id: str, attempt: int) -> WorkerStatus:
        code = current.setdefault(attempt, next(codes))
        return WorkerStatus(GangState.EXITED, {0: code})

    w.executor.status = status  # type: ignore[method-assign]
    _, j = run(w, retries=2)
    assert j["state"] == "FAILED" and j["attempts"] == 3
    assert "failed after 2 restarts (retries.max_restarts_on_errors: 2): not retried" in j["reason"]


def test_traceback_tail_keeps_the_last_traceback_or_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    assert traceback_tail(log) == []
    log.write_text("x\n" * 3 + "python: can't open file '/w/trian.py': [Errno 2] No such file or directory\n")
    assert traceback_tail(log)[-1].startswith("python: can't open file")
    frames = "".join(f'  File "f{i}.py", line {i}, in g\n    g()\n' for i in range(40))
    log.write_text("old\nTraceback (most recent call last):\nold frames\nValueError: old\n"
                   "Traceback (most recent call last):\n" + frames + "RecursionError: deep\n")
    tail = traceback_tail(log)
    assert tail[0].startswith("Traceback") and tail[1] == "  ..." and tail[-1] == "RecursionError: deep"
    assert len(tail) == 12 and "ValueError: old" not in tail
    assert split_reason(with_tail("one line", tail)) == ("one line", "\n".join(tail))
    assert split_reason("plain") == ("plain", None)


@pytest.mark.parametrize(("extra", "needle"), [
    ("objective: {deadline: 36}\n", "objective.deadline: 36 has no unit"),
    ("objective:\n  budget_usd: 5\n  budget_usd: 5000\n", "duplicate key 'budget_usd'"),
])
def test_validate_refuses_unitless_deadlines_and_duplicate_keys(tmp_path: Path, extra: str, needle: str) -> None:
    p = tmp_path / "job.yaml"
    p.write_text("name: j\nrun: python train.py\nresources: {accelerators: [T4:1]}\n" + extra)
    r = run_cli("validate", str(p))
    assert r.returncode == 2, r
    assert needle in r.stderr and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize(("state", "met", "shown"), [("FAILED", False, "deadline MISSED"), ("SUCCEEDED", True, "deadline met"),
                                                     ("SUCCEEDED", None, None)])
def test_the_summary_says_whether_the_deadline_was_met(state: str, met: bool | None, shown: str | None) -> None:
    text = render.summary({"job_id": "j-1", "state": state, "deadline_met": met, "wall_s": 1.0, "cost_usd": 0.1,
                           "on_demand_cost_usd": 0.3, "reason": "r"})
    assert (shown in text) if shown else ("deadline" not in text)
