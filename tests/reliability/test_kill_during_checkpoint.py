"""kill -9 of a worker at random points of its checkpoint writes: every resume is from the newest
complete checkpoint, the job ends bitwise equal to an undisturbed run, and after pruning no
temporary, marker or half-written directory is left.

The workers are real processes (``ckpt_child.attempt``: the real ``ElasticTrainer``, a checkpoint at
every step, real files), forked from a server that imported torch once (multiprocessing's
``forkserver``), so that each attempt costs milliseconds, not a torch import. Two series on two
stores:

- at events: each attempt SIGKILLs itself at a random event of checkpoint writing (a temporary
  created, a piece of a file written, an fsync, a rename, a prune's unlink or rmdir; see
  ``ckpt_child``), the event drawn uniformly from the first few checkpoints' worth;
- at times: the test SIGKILLs each attempt after a random delay (wherever it is then).

After each kill the store is read independently of the runtime: a checkpoint is complete when its
``manifest.json`` parses, names its step, and every file it lists has the listed size and sha256.
The next attempt must resume from the newest complete one, never older than the last the killed
worker had reported durable.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from . import ckpt_child
from .figures import record

pytestmark = pytest.mark.chaos

EVENT_KILLS = 24
TIMED_KILLS = 8
ATTEMPT_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def forkserver() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    # torch._dynamo: the optimizers import it on first use (sympy and more: a second per attempt).
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "runtime", "reliability.ckpt_child"])
    return ctx


def run_attempt(ctx: Any, root: Path, log: Path, kill_at: int, attempt_no: int, *,
                kill_after_s: float | None = None) -> tuple[int, float]:
    """(the worker's exit code, -9 when killed; seconds from its resume to its end)."""
    proc = ctx.Process(target=ckpt_child.attempt, args=(str(root), str(log), kill_at, attempt_no))
    proc.start()
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
    while proc.is_alive() and "resumed" not in _text(log) and time.monotonic() < deadline:
        time.sleep(0.002)
    resumed_at = time.monotonic()
    if kill_after_s is not None:  # from its resume on, as a preemption without notice would
        time.sleep(kill_after_s)
        if proc.is_alive():
            proc.kill()
    proc.join(ATTEMPT_TIMEOUT_S)
    assert proc.exitcode is not None, "the worker hung"
    return int(proc.exitcode), time.monotonic() - resumed_at


def _text(p: Path) -> str:
    return p.read_text() if p.exists() else ""


def lines(log: Path, kind: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in _text(log).splitlines() if line.startswith(kind + " ")]


def complete_checkpoints(job_dir: Path) -> list[int]:
    """Steps whose checkpoint is complete, read without the runtime's code."""
    done = []
    ckpts = job_dir / "checkpoints"
    for d in sorted(ckpts.iterdir() if ckpts.exists() else [], key=lambda p: p.name):
        if not d.name.isdigit():
            continue
        try:
            manifest = json.loads((d / "manifest.json").read_bytes())
        except (OSError, ValueError):
            continue
        files = manifest.get("files", {})
        ok = manifest.get("step") == int(d.name) and bool(files) and all(
            (d / name).is_file() and (d / name).stat().st_size == info["bytes"]
            and hashlib.sha256((d / name).read_bytes()).hexdigest() == info["sha256"] for name, info in files.items())
        if ok:
            assert not (d / "CORRUPT").exists(), f"complete checkpoint {d.name} was set aside"
            done.append(int(d.name))
    return sorted(done)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def kill_series(ctx: Any, root: Path, tmp: Path, kills: list[tuple[int, float | None]]) -> dict[str, Any]:
    """Attempts with the given kills (event number, or delay), then one undisturbed to the end."""
    job_dir = root / ckpt_child.JOB
    stats: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    resumes: list[int | None] = []
    plan: list[tuple[int, float | None]] = [*kills, (0, None)]
    newest_before: int | None = None
    for n, (kill_at, delay) in enumerate(plan, start=1):
        log = tmp / f"{root.name}-attempt-{n}.log"
        code, _ = run_attempt(ctx, root, log, kill_at, n, kill_after_s=delay)
        resumed_text = lines(log, "resumed")
        if resumed_text:  # it got as far as resuming: from the newest complete checkpoint
            resumed = None if resumed_text[0] == "none" else int(resumed_text[0])
            assert resumed == newest_before, (n, resumed, newest_before)
            resumes.append(resumed)
        durable = [int(s) for s in lines(log, "durable") if s != "None"]
        newest_before = complete_checkpoints(job_dir)[-1] if complete_checkpoints(job_dir) else None
        # Nothing the killed worker saw become durable is lost.
        assert not durable or (newest_before is not None and newest_before >= max(durable)), (n, durable, newest_before)
        if n == len(plan):
            assert code == 0 and lines(log, "done") == ["0"], _text(log)[-500:]
            break
        if code == 0:
            stats["finished_before_the_kill"] += 1
            continue
        assert code == -signal.SIGKILL, (n, code, _text(log)[-500:])
        stats["killed"] += 1
        left = files_under(job_dir) if job_dir.exists() else []
        if any(".tmp-" in f for f in left):
            stats["left_a_temporary"] += 1
        if any(f.startswith("checkpoints/") and f.split("/")[1].isdigit() and int(f.split("/")[1]) not in
               complete_checkpoints(job_dir) for f in left):
            stats["left_an_incomplete_checkpoint"] += 1
        killed_at = lines(log, "kill")
        if killed_at:
            what = killed_at[0].split(" ", 1)[1]
            kinds[what.split(" ")[0] if not what.startswith("fsync") else "fsync"] += 1
    # After the undisturbed attempt's pruning: its newest three checkpoints and the final weights.
    left = files_under(job_dir)
    kept = complete_checkpoints(job_dir)
    assert len(kept) == 3, left
    expected = sorted([f"checkpoints/{s}/{name}" for s in kept for name in ("manifest.json", "state.safetensors")]
                      + ["final/model.safetensors"])
    assert left == expected, left
    assert not [p for p in (job_dir / "checkpoints").iterdir() if int(p.name) not in kept]  # no stray directories
    return {"stats": stats, "kinds": kinds, "resumes": resumes, "final": (job_dir / "final/model.safetensors").read_bytes()}


def test_kill_9_during_checkpoint_writes_resumes_from_the_newest_complete_one(forkserver: Any, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    calm_log = tmp_path / "calm.log"
    code, train_s = run_attempt(forkserver, tmp_path / "calm", calm_log, 0, 1)
    assert code == 0, _text(calm_log)[-500:]
    calm_final = (tmp_path / "calm" / ckpt_child.JOB / "final/model.safetensors").read_bytes()
    per_checkpoint = int(lines(calm_log, "events")[0]) / ckpt_child.MAX_STEPS
    rng = random.Random(9)
    at_events = kill_series(forkserver, tmp_path / "events", tmp_path,
                            [(rng.randint(1, int(2.5 * per_checkpoint)), None) for _ in range(EVENT_KILLS)])
    # Timed kills: each within its share of the time the undisturbed run trained, so that most land
    # before the job is done.
    at_times = kill_series(forkserver, tmp_path / "times", tmp_path,
                           [(0, rng.uniform(0.0, train_s / TIMED_KILLS)) for _ in range(TIMED_KILLS)])
    for series in (at_events, at_times):
        assert series["final"] == calm_final  # bitwise: the final weights file
    assert at_events["stats"]["killed"] == EVENT_KILLS  # every event-drawn kill landed in a write
    kills = at_events["stats"]["killed"] + at_times["stats"]["killed"]
    assert at_times["stats"]["killed"] >= TIMED_KILLS // 2, at_times["stats"]
    kinds = dict(at_events["kinds"])
    # The draws reached the write itself, the rename into place, and pruning.
    assert kinds.get("wrote", 0) and kinds.get("replace", 0) and (kinds.get("unlink", 0) + kinds.get("rmdir", 0)), kinds
    elapsed = time.perf_counter() - t0
    resumed = len(at_events["resumes"]) + len(at_times["resumes"])
    record("kill_during_checkpoint",
           tried=f"{kills} SIGKILLs of a training worker process: {EVENT_KILLS} at random checkpoint-writing events "
                 f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}), {at_times['stats']['killed']} at random "
                 "times; real files (file://)",
           held=f"{resumed} resumes, each from the newest complete checkpoint (checked by sha256 outside the "
                "runtime); final weights bitwise equal; after pruning 0 temporaries, 0 stray files",
           kills=kills, event_kills=EVENT_KILLS, timed_kills=at_times["stats"]["killed"], kill_points=kinds,
           kills_that_left_a_temporary=at_events["stats"]["left_a_temporary"] + at_times["stats"]["left_a_temporary"],
           kills_that_left_an_incomplete_checkpoint=(at_events["stats"]["left_an_incomplete_checkpoint"]
                                                     + at_times["stats"]["left_an_incomplete_checkpoint"]),
           timed_attempts_that_finished_first=at_times["stats"]["finished_before_the_kill"],
           resumes_checked=resumed, stray_files_after_pruning=0, bitwise_equal=True, elapsed_s=round(elapsed, 2))
