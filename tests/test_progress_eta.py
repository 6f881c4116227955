"""The live progress line's rate and ETA, and fitting lines and tables to the terminal (issue 24, item 3
and the WORKERS column of item 8).

A followed job is replayed as the follower sees it: a summary polled every 0.5 s, whose step is the
runtime's, written at most every 0.5 s. Right after a restart the old estimate (steps over the last
20 s of polls) measured across the restart's pause and read ``ETA 4:06:41`` for a 4-minute job; the
rate now belongs to the current attempt's steady state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import pytest

from autoscaler.cli import render
from autoscaler.cli.eta import RateEstimator
from autoscaler.cli.progress import JobLine

TOTAL = 640
RATE = 2.7  # steps per second, steady
WORKERS = [{"instance_id": "i-1", "offering": "aws/us-east-1a/g4dn.xlarge/T4:1", "market": "spot",
            "state": "running", "gpus": 1}]


def replay(*, preempt_at: int = 300, recover_s: float = 8.0, start_s: float = 18.0, first_step_s: float = 3.0,
           poll_s: float = 0.5) -> Iterator[tuple[float, dict[str, Any], float]]:
    """(wall time, the summary polled then, the true seconds left) of a 640-step job at 2.7 steps/s:
    10 s provisioning, workers that take 15 s to start and 3 s for their first step; a preemption at
    ``preempt_at`` (checkpointed there), ``recover_s`` recovering, then a second attempt that takes
    ``start_s`` to start and ``first_step_s`` for its first step."""
    # Each attempt: (start time of its workers, step it restores, time its first step ends).
    a1_first = 10.0 + 15.0 + first_step_s
    preempt_t = a1_first + (preempt_at - 1) / RATE
    a2_start = preempt_t + recover_s
    a2_first = a2_start + start_s + first_step_s
    end_t = a2_first + (TOTAL - preempt_at - 1) / RATE

    def true_step(t: float) -> tuple[int, int]:
        """(attempt, step trained by t)."""
        if t < a2_start:
            return 1, 0 if t < a1_first else min(preempt_at, 1 + int((t - a1_first) * RATE))
        return 2, preempt_at if t < a2_first else min(TOTAL, preempt_at + 1 + int((t - a2_first) * RATE))

    t = 0.0
    while t < end_t:
        attempt, _ = true_step(t)
        written_t = math.floor(t / 0.5) * 0.5  # the runtime's last (throttled) write
        _, step = true_step(written_t)
        if t < 10.0:
            state, workers, attempts = "PROVISIONING", [], 0
        elif preempt_t <= t < a2_start:
            state, workers, attempts = "RECOVERING", [], 1
        else:
            state, workers, attempts = "RUNNING", WORKERS, attempt
        # The steady remaining time from here: the whole pause of a restart still ahead is not counted.
        left = (TOTAL - step) / RATE
        yield t, {"job_id": "qs-1", "state": state, "step": step, "total_steps": TOTAL, "attempts": attempts,
                  "workers": workers, "cost_usd": 0.0123, "preemptions": 0 if t < preempt_t else 1,
                  "last_checkpoint_step": preempt_at if t >= preempt_t else None}, left
        t += poll_s


def eta_seconds(line: str) -> float | None:
    m = re.search(r"ETA (?:(\d+):)?(\d+):(\d\d)", line)
    if m is None:
        return None
    h, mnt, s = int(m.group(1) or 0), int(m.group(2)), int(m.group(3))
    return h * 3600 + mnt * 60 + s


def test_eta_after_a_restart_is_the_steady_one_and_starting_says_why() -> None:
    line = JobLine(batch_size=64)
    shown: list[tuple[float, str, float]] = [(t, line.text(j, t), left) for t, j, left in replay()]
    etas = [(t, eta_seconds(text), left, text) for t, text, left in shown if eta_seconds(text) is not None]
    assert etas, "no ETA was ever shown"
    for t, eta, left, text in etas:
        # Within 25% (and 5 s for the 0.5 s steps of what is polled) of the time really left.
        assert eta is not None and abs(eta - left) <= 0.25 * left + 5, (t, text, f"true {left:.0f} s")
    texts = [text for _, text, _ in shown]
    # The second attempt's start says what it is waiting for and for how long.
    starting = [x for x in texts if "starting workers (restore from step 300, " in x]
    assert len(starting) >= 30 and re.search(r"restore from step 300, 1\d s\)", " ".join(starting))
    assert all("ETA -" in x for x in starting)
    # Then warming up (no ETA) for a few seconds, then training with one.
    after = texts[max(i for i, x in enumerate(texts) if x == starting[-1]) + 1:]
    warming = [x for x in after if "  warming up  " in x]
    assert 2 <= len(warming) <= 20 and all("ETA -" in x for x in warming)
    assert after[len(warming)].split("  ")[1] == "training" and eta_seconds(after[len(warming)]) is not None
    assert any("  training  " in x and "samples/s" in x for x in texts)


def test_a_restore_to_an_older_checkpoint_and_an_attach_mid_run() -> None:
    est = RateEstimator()
    # Attached at step 100 of a training job: no start-up to leave out; a rate after 2 s.
    for i in range(5):
        est.add(i * 0.5, 100 + 5 * i, 3)
    assert est.steady and est.steps_per_s(2.0) is None  # 1.5 s between the first new step and the last
    est.add(2.5, 125, 3)
    assert est.steps_per_s(2.5) == pytest.approx(10.0)
    # A new attempt restores an older step: the old rate is forgotten.
    est.add(3.0, 120, 4)
    est.add(3.5, 90, 4)
    assert est.steps_per_s(3.5) is None and not est.started
    # A job standing still slows down as it stands (its ETA grows) once stalled longer than measured.
    est2 = RateEstimator(warmup_steps=1)
    for i in range(10):
        est2.add(i * 0.5, i * 2, 1)
    fresh = est2.steps_per_s(4.5)
    assert fresh is not None and est2.steps_per_s(20.0) is not None
    assert est2.steps_per_s(20.0) < fresh / 2  # type: ignore[operator]


def job(**kw: Any) -> dict[str, Any]:
    return {"job_id": "quickstart-7f3a", "state": "RUNNING", "step": 300, "total_steps": 640, "attempts": 2,
            "workers": WORKERS * 2, "cost_usd": 0.1234, "preemptions": 3, **kw}


def test_a_narrow_terminal_keeps_state_step_and_cost() -> None:
    line = JobLine(batch_size=64)
    for i in range(40):  # training at 10 steps/s for 20 s
        line.text(job(step=100 + 5 * i), i * 0.5)
    full = line.text(job(step=300), 20.0)
    assert "samples/s" in full and "ETA " in full and "2x spot" in full and "3 preempted" in full
    for width in (100, 80, 60, 50, 45):
        text = line.text(job(step=300), 20.0, width)
        assert len(text) <= width, (width, text)
        for needed in ("quickstart-7f3a", "training", "300/640", "$0.1234"):
            assert needed in text, (width, text)
    # What goes first: the markets, then the preemptions; the ETA stays longest of the optional.
    at80 = line.text(job(step=300), 20.0, 80)
    assert "2x spot" not in at80 and "ETA " in at80
    # Narrower than even the essentials: the short forms, nothing cut.
    tiny = line.text(job(step=300), 20.0, 20)
    assert tiny == "quickstart-7f3a  training  300/640  $0.1234"
    # A long phase keeps its words; the hint goes before the state itself would be cut.
    start = JobLine()
    start.text(job(step=300, attempts=2), 0.0)  # attached while attempt 2 trained; then it was preempted
    start.text(job(step=300, attempts=3, last_checkpoint_step=300), 0.0)
    hint = start.text(job(step=300, attempts=3, last_checkpoint_step=300), 12.0)
    assert "starting workers (restore from step 300, 12 s)" in hint
    assert start.text(job(step=300, attempts=3, last_checkpoint_step=300), 13.0, 50).startswith(
        "quickstart-7f3a  starting workers  300/640")


def workers(*specs: tuple[str, str, int]) -> list[dict[str, Any]]:
    out = []
    for offering, market, n in specs:
        out += [{"instance_id": f"i-{len(out) + k}", "offering": offering, "market": market, "state": "running",
                 "gpus": 1} for k in range(n)]
    return out


def test_workers_column_is_a_summary() -> None:
    alike = workers(("aws/us-east-1a/g4dn.xlarge/T4:1", "spot", 2))
    assert render.workers_str({"workers": alike}) == "2x g4dn.xlarge spot us-east-1a"
    mixed = workers(("aws/us-east-1a/g4dn.xlarge/T4:1", "spot", 2), ("aws/us-east-1b/g4dn.12xlarge/T4:4", "spot", 2),
                    ("gcp/us-central1-a/n1-standard-8/T4:1", "on-demand", 1),
                    ("gcp/europe-west4-b/n1-standard-16/T4:2", "spot", 1))
    assert render.workers_str({"workers": mixed}) == "6 workers (5 spot, 1 on-demand)"
    assert render.workers_str({"workers": mixed}, short=True) == "6 workers"
    assert render.workers_str({"workers": []}) == "-"


def test_the_table_fits_the_terminal_and_keeps_job_state_progress_cost() -> None:
    mixed = workers(("aws/us-east-1a/g4dn.xlarge/T4:1", "spot", 3), ("gcp/us-central1-a/n1-standard-8/T4:1", "on-demand", 1))
    jobs = [job(workers=mixed), job(job_id="other-job-1", state="SUCCEEDED", step=640, workers=[], cost_usd=12.5)]
    full = render.table(jobs)
    assert max(len(x) for x in full.splitlines()) < 100 and "4 workers (3 spot, 1 on-demand)" in full
    for width in (80, 60, 50, 40):
        text = render.table(jobs, width)
        for ln in text.splitlines()[1:]:
            assert len(ln) <= max(width, 45), (width, text)  # the essentials alone are ~45 wide
        for needed in ("quickstart-7f3a", "RUNNING", "300/640", "$0.1234", "other-job-1", "SUCCEEDED", "$12.50"):
            assert needed in text, (width, text)
    assert "WORKERS" in render.table(jobs, 80) and "PREEMPT" not in render.table(jobs, 60)
