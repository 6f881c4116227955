"""Honest outcomes: what a gang's exit means (issue 13).

- A job succeeds only when the runtime *recorded* completion: rank 0's progress report names the
  final weights (written, durable, by ``ElasticTrainer.finish``) and says the planned work is done
  (``completed: true``, or ``step >= total_steps``). Workers that all exit 0 without that record are
  a user error, named with its likely cause (a script that ends with ``trainer.finish()`` instead of
  ``runtime.exit_worker(trainer.finish())``: after a stop notice ``finish()`` returns 85 and the script exits 0).
- A user-code failure carries the tail of the failing rank's log (its traceback) in the job's reason,
  after the first line: ``JobSummary`` shows the first line as ``reason`` and the rest as
  ``error_tail``; the event history (``spotrain logs``) keeps both.
- A failure before the first step of an attempt that repeats with the same exit code is
  deterministic (``can't open file 'trian.py'``, an import error): it is retried once at most.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from cloud_providers.jobfiles import UnsafeJobFile, open_regular

from ..state import Job, Store

# What of a failing rank's log goes into the reason: at most this many lines of its last traceback
# (or of its last output when it printed none), read from the last TAIL_BYTES of the file.
TAIL_LINES = 12
TAIL_BYTES = 16_000
_LINE_CHARS = 300
EARLY_FAILURE = "early-failure"


def completion_recorded(prog: Mapping[str, Any] | None) -> bool:
    """Whether rank 0 reported completion: final weights named, and the planned work done."""
    if not prog:
        return False
    final = prog.get("final_model")
    if not isinstance(final, str) or not final:
        return False
    if prog.get("completed") is True:
        return True
    step, total = prog.get("step"), prog.get("total_steps")
    if isinstance(total, (int, float)) and not isinstance(total, bool):
        return isinstance(step, (int, float)) and not isinstance(step, bool) and step >= total
    return True


def incomplete_exit_reason(job: Job, prog: Mapping[str, Any] | None) -> str:
    """The reason a job fails whose workers all exited 0 without recording completion; the runtime's
    ``stopped_at_notice`` (it checkpointed at a stop notice) makes the likely cause certain."""
    where = f"at step {job.step} of {job.total_steps}" if job.total_steps else f"at step {job.step}"
    fix = "end the script with runtime.exit_worker(trainer.finish()), not trainer.finish()"
    if prog and prog.get("stopped_at_notice") is True:
        return (f"user error: the workers checkpointed at a stop notice {where} and then exited 0 instead of 85 "
                f"(the code trainer.finish() returned): {fix}")
    return (f"user error: the workers exited 0 {where} without recording completion (no final weights): "
            f"the script likely ends with trainer.finish() instead of runtime.exit_worker(trainer.finish()) "
            "(after a preemption or rescale notice finish() returns 85, which must be the exit code), "
            "or it does not train through runtime.ElasticTrainer")


def traceback_tail(path: Path) -> list[str]:
    """The last traceback in the log at ``path`` (at most ``TAIL_LINES`` lines), else its last few
    lines of output; empty when there is no log (a remote worker's, a simulated one)."""
    try:
        with open_regular(path) as f:  # the workers' own file: never a FIFO or a device read here
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            text = f.read(TAIL_BYTES).decode(errors="replace")
    except (OSError, UnsafeJobFile):
        return []
    lines = [ln.rstrip()[:_LINE_CHARS] for ln in text.splitlines()]
    start = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")), default=None)
    if start is None:
        tail = [ln for ln in lines if ln.strip()][-5:]
    else:
        tail = [ln for ln in lines[start:] if ln.strip()]
        if len(tail) > TAIL_LINES:
            tail = [tail[0], "  ..."] + tail[-(TAIL_LINES - 2):]
    return ["".join(c if c.isprintable() else "?" for c in ln) for ln in tail]


def with_tail(first_line: str, tail: list[str]) -> str:
    """A reason: one line, then the log's tail indented (``JobSummary`` splits them again)."""
    return "\n".join([first_line] + [f"    {ln}" for ln in tail])


def repeated_early_failure(store: Store, s: Session, job: Job, code: int) -> bool:
    """Whether the last failure before a first step (an ``EARLY_FAILURE`` event) failed the same way
    as this one (same exit code, from the same step): retrying again would fail again."""
    last = next((e for e in reversed(store.events(s, job.job_id)) if e.kind == EARLY_FAILURE), None)
    return last is not None and last.reason == early_failure_mark(job, code)


def early_failure_mark(job: Job, code: int) -> str:
    """The ``EARLY_FAILURE`` event's reason for a failure with ``code`` before the attempt's first step."""
    return f"exit code {code} before the first step after step {job.gang.start_step}"
