"""Detach and follow, end to end on the local cloud: ``run --detach`` (which starts a controller in the
background), ``attach`` and ``logs -f`` in their own processes, ``cancel`` from another, ``resume``
from the last checkpoint to the end, then ``controller status`` / ``stop`` and the controller's log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support import PROTOCOL_WORKER, run_cli, worker_pids, write_pw_spec

PW = {"PW_STEPS": "100", "PW_STEP_S": "0.05"}


def cli_proc(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **PW})


def api(home: Path) -> httpx.Client:
    info = json.loads((home / "controller.json").read_text())
    token = (home / "token").read_text().strip()
    return httpx.Client(base_url=info["url"], headers={"authorization": f"Bearer {token}"}, timeout=10)


def wait_for(pred, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.e2e
def test_detach_attach_follow_cancel_resume(spotrain_home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: det\n"
        f"run: echo worker-output-rank-$RANK; exec {sys.executable} {PROTOCOL_WORKER}\n"
        "resources: {accelerators: [T4:1], clouds: [aws, gcp]}\n"
        "workers: {min: 1, max: 1}\n"
        "training: {logical_workers: 4, global_batch_size: 64}\n")
    procs: list[subprocess.Popen[str]] = []
    try:
        r = run_cli("run", str(spec), "--detach", env=PW, timeout=60)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split("submitted ", 1)[1].split()[0]
        assert "spotrain attach" in r.stdout and "started a controller in the background" in r.stderr
        c = api(spotrain_home)
        attach = cli_proc("attach", job_id)
        follow = cli_proc("logs", "-f", job_id)
        procs += [attach, follow]
        wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["step"] >= 20, 30, "20 steps")

        # Cancel from another process: the job is the controller's, whoever started it.
        cancel = run_cli("cancel", job_id)
        assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stderr
        out_attach, _ = attach.communicate(timeout=20)
        out_follow, _ = follow.communicate(timeout=20)
        assert attach.returncode == 1 and "CANCELLED" in out_attach, out_attach
        assert f"attached to {job_id}" in out_attach, out_attach
        assert follow.returncode == 0, out_follow
        for words in ("submitted", "launched", "worker-output-rank-0", "-> CANCELLED", f"{job_id} ended: CANCELLED"):
            assert words in out_follow, (words, out_follow)
        stopped_at = c.get(f"/v1/jobs/{job_id}").json()["last_checkpoint_step"]
        assert stopped_at and stopped_at >= 20

        # Resume: a new job of the same name, from the checkpoint the cancelled one left.
        res = run_cli("resume", job_id, "--json")
        assert res.returncode == 0, res.stderr
        new = json.loads(res.stdout.strip().splitlines()[-1])
        assert new["job_id"] != job_id and new["name"] == "det" and new["last_checkpoint_step"] == stopped_at
        done = run_cli("attach", new["job_id"], "--json", timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        final = json.loads(done.stdout.strip().splitlines()[-1])
        assert final["state"] == "SUCCEEDED" and final["step"] == 100
        # README ("The job spec"): a resumed job continues in the ended job's directory, weights included.
        assert final["final_model"].endswith(f"/{job_id}/final/model.safetensors"), final["final_model"]
        # Not a terminal: plain progress lines (with --json on stderr) naming the phase; rates and ETAs
        # are tested on a terminal (tests/test_progress_tty.py), where every poll is drawn.
        # The phase is "warming up" or "training": a 75-step resume may end inside the warm-up window.
        assert re.search(r"  (warming up|training)  \d+/100 ", done.stderr) and "\x1b" not in done.stderr, done.stderr
        events = c.get(f"/v1/jobs/{new['job_id']}/events").json()
        assert any(e["kind"] == "resumed" and f"continues {job_id} from its checkpoint at step {stopped_at}" in e["reason"]
                   for e in events)
        # Its workers started from that step: the first checkpoint they reported is past it.
        from autoscaler.home import db_url
        from autoscaler.state import Store
        from autoscaler.state.models import ProgressSample

        with Store(db_url()).session() as s:
            first = s.query(ProgressSample).filter_by(job_id=new["job_id"]).order_by(ProgressSample.id).first()
            assert first is not None and first.step > stopped_at > 0

        # A `spotrain run` beside the service has its own embedded controller: cancel still works, the
        # service asks the run's controller; status --watch of an ended job prints it once and returns.
        beside = cli_proc("run", str(write_pw_spec(tmp_path, name="beside")))
        procs.append(beside)
        wait_for(lambda: any(j["name"] == "beside" and j["step"] > 0 for j in c.get("/v1/jobs").json()), 30, "beside running")
        cancel = run_cli("cancel", "beside")
        assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stderr
        out_beside, _ = beside.communicate(timeout=20)
        # Cancelled from whatever live state the market left it in (a preemption can leave it RECOVERING).
        assert beside.returncode == 1 and re.search(r"(RUNNING|RECOVERING|RESCALING) -> CANCELLED", out_beside), out_beside
        watch = run_cli("status", "beside", "--watch", timeout=20)
        assert watch.returncode == 0 and "CANCELLED" in watch.stdout

        # Controller management, and its log (under SPOTRAIN_HOME): one line per thing that happened.
        st = run_cli("controller", "status")
        assert st.returncode == 0 and "controller-local" in st.stdout and "0 live job(s)" in st.stdout, st.stdout
        stop = run_cli("controller", "stop")
        assert stop.returncode == 0 and "stopped the controller" in stop.stdout, stop.stderr
        assert not (spotrain_home / "controller.json").exists()
        assert run_cli("controller", "status").returncode == 1
        log = (spotrain_home / "controller.log").read_text()
        for words in (f"{job_id} submitted", f"{job_id} launched", f"{job_id} RUNNING -> CANCELLED",
                      f"{new['job_id']} resumed", f"{new['job_id']} RUNNING -> SUCCEEDED", "checkpoint at step"):
            assert words in log, words
        assert "maximum number of running instances" not in log and "apscheduler" not in log
        assert worker_pids(str(PROTOCOL_WORKER)) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        run_cli("controller", "stop")
