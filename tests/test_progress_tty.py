"""``spotrain run``'s progress: on a terminal (a pseudo-terminal driven by pexpect) one line per job
redrawn in place, in colour, with its phase and ETA, and no scheduler warnings; not on a terminal,
plain lines. A second terminal can cancel the job meanwhile, and a ``spotrain run`` killed with
SIGKILL is reported as what happened."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from support import PROTOCOL_WORKER, run_cli, worker_pids, write_pw_spec

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def wait_step(home: Path, name: str, step: int, timeout_s: float = 90) -> None:
    """Until job ``name`` reports ``step`` (read from the database, as ``spotrain status`` does offline)."""
    from autoscaler.home import db_url
    from autoscaler.state import Store

    deadline = time.time() + timeout_s
    while time.time() < deadline and not (home / "spotrain.db").exists():
        time.sleep(0.1)
    store = Store(db_url())  # once: each Store runs its schema check, a write, against the run's
    try:
        while time.time() < deadline:
            with store.session() as s:
                job = store.job(s, name)
                if job is not None and job.step >= step:
                    return
            time.sleep(0.2)
    finally:
        store.engine.dispose()
    raise AssertionError(f"{name} did not reach step {step}")


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "SPOTRAIN_HOME": str(home), "PW_STEP_S": "0.05", **extra}


@pytest.mark.e2e
def test_run_on_a_tty_redraws_one_progress_line(spotrain_home: Path, tmp_path: Path) -> None:
    spec = write_pw_spec(tmp_path, name="tty", workers="{min: 1, max: 1}")
    # A 180-column terminal (COLUMNS too: pytest's own may say 80, and rich reads it first).
    # 120 steps (6 s): the rate is the steady one, measured after a few seconds of warming up.
    env = cli_env(spotrain_home, PW_STEPS="120", TERM="xterm-256color", COLUMNS="180", LINES="40")
    child = pexpect.spawn(sys.executable, ["-m", "autoscaler.cli.main", "run", str(spec)], env=env, dimensions=(40, 180),
                          encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    raw = child.before
    assert child.exitstatus == 0, raw[-3000:]
    # Redrawn in place: the cursor goes back up over the job's line (rich.live), many times.
    assert raw.count("\x1b[1A") + raw.count("\x1b[2K") >= 3, raw[-2000:]
    assert re.search(r"\x1b\[[0-9;]*3[0-9]m", raw), "no colour on a terminal"
    text = ANSI.sub("", raw)
    assert re.search(r"tty-\w+  training  \d+/120 \(\d+%\)  [\d,]+ samples/s  ETA \d+:\d\d", text), text[-2000:]
    assert "starting workers" in text or "provisioning" in text
    assert "  warming up  " in text  # between the first step and a steady rate: no ETA yet
    # Drawn in place: many draws of the training line, all on one or two lines of the terminal.
    draws = text.count("  training  ")
    assert draws >= 3 and len([line for line in text.split("\n") if "  training  " in line]) < draws / 2
    for noise in ("apscheduler", "maximum number of running instances", "skipped", "Traceback"):
        assert noise not in text
    assert "job         tty-" in text and "(SUCCEEDED)" in text
    # The embedded controller's own log went to a file under SPOTRAIN_HOME, one line per event.
    (log,) = (spotrain_home / "localcloud").glob("run-*/controller.log")
    assert re.search(r"tty-\w+ submitted", log.read_text()) and "RUNNING -> SUCCEEDED" in log.read_text()


@pytest.mark.e2e
def test_a_narrow_terminal_keeps_state_step_and_cost(spotrain_home: Path, tmp_path: Path) -> None:
    """On a 60-column terminal the job's line loses its markets, preemptions and rate, never its
    phase, step/total or cost, and is not cut at the edge (issue 24)."""
    spec = write_pw_spec(tmp_path, name="narrow", workers="{min: 1, max: 1}")
    env = cli_env(spotrain_home, PW_STEPS="120", TERM="xterm-256color", COLUMNS="60", LINES="40")
    child = pexpect.spawn(sys.executable, ["-m", "autoscaler.cli.main", "run", str(spec)], env=env, dimensions=(40, 60),
                          encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before[-3000:]
    text = ANSI.sub("", child.before)
    drawn = [d.strip() for d in re.split(r"[\r\n]", text) if d.strip().startswith("narrow-")]
    training = [d for d in drawn if "  training  " in d]
    assert training, drawn
    for d in drawn:
        assert len(d) <= 60 and "\u2026" not in d and "..." not in d, d
    for d in training:
        assert re.fullmatch(r"narrow-\w+  training  \d+/120 \(\d+%\)  (ETA (\d+:\d\d|-)  )?\$\d+\.\d{4}", d), d


@pytest.mark.e2e
def test_not_a_tty_lines_and_cancel_from_a_second_terminal(spotrain_home: Path, tmp_path: Path) -> None:
    spec = write_pw_spec(tmp_path, name="pipe", workers="{min: 1, max: 1}")
    run = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "run", str(spec)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=cli_env(spotrain_home, PW_STEPS="400"))
    try:
        info = spotrain_home / "controller.json"
        deadline = time.time() + 30
        while time.time() < deadline and not info.exists():
            time.sleep(0.1)
        assert json.loads(info.read_text())["embedded"].startswith("run-")
        wait_step(spotrain_home, "pipe", 60)
        # New jobs are not taken by a controller that ends with its command.
        other = run_cli("submit", str(write_pw_spec(tmp_path, name="other")))
        assert other.returncode != 0 and "embedded one of a `spotrain run`" in other.stderr, other.stderr
        cancel = run_cli("cancel", "pipe")
        assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stderr
        out, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, err
    assert "\x1b" not in out and "\r" not in out  # no terminal: no escapes, no redraws
    lines = out.strip().splitlines()
    assert all(line.startswith(("[", "spotrain:", "job ", "wall ", "preemptions", "cost ", "reason", "result")) or not line
               for line in lines), lines
    # A line names the phase: "warming up" or "training" (the cancel may come inside the warm-up window).
    assert any(re.search(r"pipe-\w+  (warming up|training)  \d+/400 ", line) for line in lines), lines
    assert re.search(r"(RUNNING|RECOVERING|RESCALING) -> CANCELLED", out), out  # a preemption can leave it RECOVERING
    assert not info.exists()  # the embedded controller's record goes with it
    assert worker_pids(str(PROTOCOL_WORKER)) == []


@pytest.mark.e2e
def test_a_killed_run_is_reported_as_what_happened(spotrain_home: Path, tmp_path: Path) -> None:
    """kill -9 of `spotrain run`: its workers see their owner gone (its owner lease, issue 24) and stop
    at a checkpoint on their own; the next `spotrain run` finds the job and records that, and where
    `spotrain resume` continues from, not that it had to stop them."""
    spec = write_pw_spec(tmp_path, name="killed", workers="{min: 1, max: 1}")
    run = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "run", str(spec)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=cli_env(spotrain_home, PW_STEPS="500"))
    wait_step(spotrain_home, "killed", 5)
    assert run.poll() is None, "the run ended before it could be killed"
    os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=10)
    deadline = time.time() + 30
    while time.time() < deadline and worker_pids(str(PROTOCOL_WORKER)):
        time.sleep(0.2)  # the workers stop on their own, at a checkpoint
    assert not worker_pids(str(PROTOCOL_WORKER))
    # What the next `spotrain run` does first (in process here: a second run would only add seconds).
    from autoscaler.cli.run import reap_abandoned_runs
    from autoscaler.home import db_url
    from autoscaler.state import Store

    assert len(reap_abandoned_runs(Store(db_url()))) == 1
    st = json.loads(run_cli("status", "killed", "--json").stdout.strip().splitlines()[-1])
    logs = run_cli("logs", "killed").stdout
    assert "spotrain run that owned this job was killed" in logs and "stopped on their own" in logs, logs
    assert st["state"] == "FAILED" and "were stopped" not in logs
    assert 5 <= st["last_checkpoint_step"] == st["step"] < 500
    assert f"spotrain resume {st['job_id']}` continues from its checkpoint at step {st['step']}" in st["reason"]
