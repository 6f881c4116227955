"""``kill -9`` of ``spotrain run`` (issue 24, item 4): its workers see their owner gone through the
owner lease and stop at a checkpoint within the bound, the local cloud's bill ends when they stopped
(not when the next command looks), ``resume`` continues from that checkpoint, and with no controller
``status`` says what happened and ``cancel`` ends the job in the database, stopping leftover workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud_providers.local.owner import CHECK_EVERY_S, STOP_GRACE_S, OwnerLease, OwnerWatch
from support import PROTOCOL_WORKER, run_cli, worker_pids, write_pw_spec

# Seconds from the run's death to its workers' exit: the agent's check, and the grace it gives them.
BOUND_S = CHECK_EVERY_S + STOP_GRACE_S


def _last_json(out: str) -> dict:
    data = json.loads(out.strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data


def _status(ref: str) -> dict:
    r = run_cli("status", ref, "--json")
    assert r.returncode == 0, r.stderr
    return _last_json(r.stdout)


def _job_row(name: str) -> dict:
    """The job's row and its instances' rows, read from the database as a test (no controller runs)."""
    from autoscaler.home import db_url
    from autoscaler.state import Store

    store = Store(db_url())
    try:
        with store.session() as s:
            job = store.job(s, name)
            assert job is not None
            rows = [{"instance_id": r.instance_id, "launched_at_s": r.launched_at_s, "terminated_at_s": r.terminated_at_s,
                     "state": r.state, "billed_seconds": r.billed_seconds} for r in store.instances(s, job.job_id)]
            return {"job_id": job.job_id, "controller_id": job.controller_id, "step": job.step, "instances": rows,
                    "cost_usd": job.cost_usd}
    finally:
        store.engine.dispose()


def _start_and_kill(home: Path, spec: Path, name: str, *, at_step: int, env: dict[str, str]) -> tuple[dict, float]:
    """Start `spotrain run SPEC`, SIGKILL it once its job reached ``at_step``; (the job's row, when)."""
    run = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "run", str(spec), "--quiet"],
                           env={**os.environ, "SPOTRAIN_HOME": str(home), **env},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            if (home / "spotrain.db").exists():
                try:
                    if _job_row(name)["step"] >= at_step:
                        break
                except AssertionError:
                    pass
            assert run.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        else:
            raise AssertionError(f"{name} never reached step {at_step}")
        assert worker_pids(str(PROTOCOL_WORKER)), "no workers to outlive the run"
    finally:
        killed_at = time.time()
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
    return _job_row(name), killed_at


def _agent_done(adir: Path) -> Path:
    """``adir`` once its agent recorded the end (its ranks' exit files first, then ``done``), which
    follows the workers' exit by one of its polls."""
    deadline = time.time() + 10
    while not (adir / "done").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (adir / "done").exists(), f"the agent of {adir} never recorded its end"
    return adir


def _wall_of_market_s(home: Path, cloud_id: str, market_s: float) -> float:
    """The wall time of a market time of local cloud ``cloud_id`` (its clock is in cloud.json)."""
    st = json.loads((home / "localcloud" / cloud_id / "cloud" / "cloud.json").read_text())
    return float(st["t0_wall"] + (market_s - st["offset_s"]) / st["time_scale"])


@pytest.mark.e2e
def test_killed_run_stops_its_workers_at_a_checkpoint_and_its_bill_then(spotrain_home: Path, tmp_path: Path) -> None:
    spec = write_pw_spec(tmp_path, name="leased", workers="{min: 1, max: 1}")
    job, killed_at = _start_and_kill(spotrain_home, spec, "leased", at_step=10,
                                     env={"PW_STEPS": "100000", "PW_STEP_S": "0.05"})
    job_id, cid = job["job_id"], job["controller_id"]
    while worker_pids(str(PROTOCOL_WORKER)) and time.time() < killed_at + BOUND_S + 5:
        time.sleep(0.1)
    gone_at = time.time()
    assert not worker_pids(str(PROTOCOL_WORKER)), f"workers still training {BOUND_S + 5:g} s after the run died"
    assert gone_at - killed_at <= BOUND_S, f"workers took {gone_at - killed_at:.1f} s to stop (bound {BOUND_S:g} s)"

    # They stopped at a minibatch boundary with a checkpoint: exit 85 at the notice, not killed.
    adirs = list((spotrain_home / "localcloud" / cid / "executor" / "instances").glob("*/attempt-*"))
    assert len(adirs) == 1
    assert (_agent_done(adirs[0]) / "exit-0").read_text() == "85"
    record = json.loads((adirs[0] / "owner-gone.json").read_text())
    assert "has exited" in record["why"] and killed_at < record["ended_unix_s"] <= gone_at + 1.5
    ckpt_step = int((spotrain_home / "checkpoints" / job_id / "checkpoints" / "step.txt").read_text())
    assert ckpt_step >= 10

    time.sleep(4)  # the bill must not run on until the next command looks (4 s = 4 market minutes)
    env = {"PW_STEPS": str(ckpt_step + 10), "PW_STEP_S": "0.05", "PW_SAY_START": "1"}
    try:
        r = run_cli("resume", job_id, "--json", env=env, timeout=90)
        assert r.returncode == 0, r.stderr
        new = _last_json(r.stdout)
        old = _job_row(job_id)
        # The old instance's bill ended when its machine stopped, not when `resume` looked.
        (inst,) = old["instances"]
        assert inst["state"] == "terminated"
        ended_wall = _wall_of_market_s(spotrain_home, cid, inst["terminated_at_s"])
        assert killed_at < ended_wall <= gone_at + 1.5, (killed_at, ended_wall, gone_at)  # resume came 4+ s later
        assert inst["billed_seconds"] == pytest.approx(inst["terminated_at_s"] - inst["launched_at_s"])
        ended = _status(job_id)
        assert ended["state"] == "FAILED" and "stopped on their own" in ended["reason"], ended
        time.sleep(1)
        assert _status(job_id)["cost_usd"] == ended["cost_usd"]

        # `resume` continues from the checkpoint the workers wrote when their owner was gone.
        assert new["last_checkpoint_step"] == ckpt_step
        deadline = time.time() + 60
        while time.time() < deadline:
            done = _status(new["job_id"])
            if done["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                break
            time.sleep(0.5)
        assert done["state"] == "SUCCEEDED", done
        log = (spotrain_home / "logs" / new["job_id"] / "attempt-1-rank-0.log").read_text()
        assert f"starting at step {ckpt_step}" in log, log
    finally:
        run_cli("controller", "stop")


@pytest.mark.e2e
def test_cancel_with_no_controller_ends_a_killed_runs_job_and_its_leftover_workers(spotrain_home: Path,
                                                                                   tmp_path: Path) -> None:
    """Workers that ignore the notice keep running for the grace; `cancel` (no controller runs) ends
    the job in the database and stops them at once, in one line, exit 0."""
    spec = write_pw_spec(tmp_path, name="orphan", workers="{min: 1, max: 1}")
    job, killed_at = _start_and_kill(spotrain_home, spec, "orphan", at_step=3,
                                     env={"PW_STEPS": "100000", "PW_STEP_S": "0.05", "PW_IGNORE_NOTICE": "1"})
    assert worker_pids(str(PROTOCOL_WORKER)), "the workers (which ignore notices) should still run"
    r = run_cli("cancel", "orphan")
    assert time.time() - killed_at < STOP_GRACE_S, "too slow to see the workers stopped by cancel, not the grace"
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1 and f"{job['job_id']}: CANCELLED" in r.stdout, r.stdout
    assert not worker_pids(str(PROTOCOL_WORKER))
    st = _status(job["job_id"])
    assert st["state"] == "CANCELLED" and st["workers"] == [], st
    (inst,) = _job_row(job["job_id"])["instances"]
    assert inst["state"] == "terminated"
    # Cancelling it again says it has ended; an unknown job is an error; nothing was contacted.
    again = run_cli("cancel", job["job_id"])
    assert again.returncode == 0 and "CANCELLED (it had already ended)" in again.stdout
    missing = run_cli("cancel", "no-such-job")
    assert missing.returncode == 5 and "no job" in missing.stderr


@pytest.mark.e2e
def test_status_with_no_controller_shows_a_killed_runs_job_and_what_became_of_it(spotrain_home: Path,
                                                                                  tmp_path: Path) -> None:
    spec = write_pw_spec(tmp_path, name="shown", workers="{min: 1, max: 1}")
    job, _ = _start_and_kill(spotrain_home, spec, "shown", at_step=3, env={"PW_STEPS": "100000", "PW_STEP_S": "0.05"})
    job_id = job["job_id"]
    st = run_cli("status", job_id, "--json")
    assert st.returncode == 0, st.stderr
    shown = _last_json(st.stdout)
    assert shown["job_id"] == job_id and shown["state"] == "RUNNING"
    assert "spotrain run was killed" in shown["reason"] and f"spotrain resume {job_id}" in shown["reason"], shown
    table = run_cli("status")
    assert table.returncode == 0 and job_id in table.stdout and "RUNNING" in table.stdout
    one = run_cli("status", job_id)
    assert one.returncode == 0 and "spotrain run was killed" in one.stdout, one.stdout
    listed = json.loads(run_cli("status", "--json").stdout.strip().splitlines()[-1])
    assert [j["job_id"] for j in listed] == [job_id] and "spotrain run was killed" in listed[0]["reason"]


def test_owner_watch_sees_a_dead_owner_at_once_and_a_silent_one_after_the_lease(tmp_path: Path) -> None:
    now = [100.0]
    lease = OwnerLease(tmp_path, lease_s=5.0)
    lease.renew()
    starts = {os.getpid(): json.loads(lease.path.read_text())["pid_start"]}
    watch = OwnerWatch(lease.path, lease_s=5.0, clock=lambda: now[0], start_of=lambda pid: starts.get(pid))
    assert watch.gone() is None
    now[0] += 4.9
    lease.renew()  # renewed in time
    assert watch.gone() is None
    now[0] += 4.9
    assert watch.gone() is None
    now[0] += 0.2  # 5.1 s without a renewal: a hung (or stopped) owner
    assert "has not renewed its lease for 5 s" in (watch.gone() or "")
    lease.renew()
    assert watch.gone() is None
    starts[os.getpid()] = "another process"  # the pid now names a process started at another time
    assert "has exited" in (watch.gone() or "")
    del starts[os.getpid()]
    assert "has exited" in (watch.gone() or "")
    missing = OwnerWatch(tmp_path / "none.json", lease_s=1.0, clock=lambda: now[0])
    assert missing.gone() is None
    now[0] += 1.0
    assert "no lease file" in (missing.gone() or "")


def test_lease_setting_is_checked(tmp_path: Path) -> None:
    from cloud_providers.local.owner import DEFAULT_LEASE_S, ENV_LEASE_S, lease_s_from_env

    assert lease_s_from_env({}) == DEFAULT_LEASE_S
    assert lease_s_from_env({ENV_LEASE_S: "2.5"}) == 2.5
    for bad in ("0", "-1", "abc", "nan", "1e9"):
        with pytest.raises(ValueError, match=f"{ENV_LEASE_S}="):
            lease_s_from_env({ENV_LEASE_S: bad})
    r = run_cli("run", str(write_pw_spec(tmp_path)), env={ENV_LEASE_S: "soon", "SPOTRAIN_HOME": str(tmp_path / "h")})
    assert r.returncode == 2 and r.stderr.strip() == f"spotrain: {ENV_LEASE_S}='soon': expected seconds between 1 and 3600"


def test_local_cloud_ends_the_bill_of_a_machine_when_it_stopped(tmp_path: Path) -> None:
    """``LocalProvider(stopped_at=...)``: a poll long after a machine shut itself down bills it until
    then, at the market's time scale."""
    from cloud_providers.base import LaunchRequest
    from cloud_providers.local.provider import LocalProvider

    wall = [1000.0]
    stopped: dict[str, float] = {}
    cloud = LocalProvider(root=tmp_path, time_scale=60.0, clock=lambda: wall[0], stopped_at=stopped.get)
    offering = next(o for o in cloud.offerings() if o.spot_price_usd_per_hour is not None)
    inst = cloud.launch(LaunchRequest(offering=offering, market="on-demand", tags={"spotrain-job": "j"},
                                      decision_id="d1"))
    wall[0] += 10.0
    stopped[inst.instance_id] = wall[0]  # its machine stopped 10 s after launch ...
    wall[0] += 50.0  # ... and the cloud is polled 50 s later
    (changed,) = cloud.poll()
    assert changed.instance_id == inst.instance_id and changed.state.value == "terminated"
    assert cloud.billing(changed).billed_seconds == pytest.approx(600.0)  # 10 s x 60, not 60 s x 60
    assert cloud.poll() == []


@pytest.mark.e2e
def test_a_stopped_run_lets_its_lease_lapse_and_carries_on_when_continued(spotrain_home: Path, tmp_path: Path) -> None:
    """SIGSTOP (Ctrl-Z) of `spotrain run`: its process lives, but its lease is not renewed; after
    SPOTRAIN_RUN_LEASE_S the workers stop at a checkpoint (training and billing stop), and once the
    command is continued it starts them again from that checkpoint and finishes."""
    spec = write_pw_spec(tmp_path, name="paused", workers="{min: 1, max: 1}")
    run = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "run", str(spec), "--quiet", "--json"],
                           env={**os.environ, "SPOTRAIN_HOME": str(spotrain_home), "PW_STEPS": "100", "PW_STEP_S": "0.1",
                                "SPOTRAIN_RUN_LEASE_S": "2"},
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not ((spotrain_home / "spotrain.db").exists() and _step_of("paused") >= 5):
            time.sleep(0.2)
        run.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        while worker_pids(str(PROTOCOL_WORKER)) and time.time() < stopped_at + 2 + BOUND_S:
            time.sleep(0.1)
        gone = time.time() - stopped_at
        assert not worker_pids(str(PROTOCOL_WORKER)), "workers of a stopped run kept training"
        assert 1.5 <= gone <= 2 + CHECK_EVERY_S + 3, f"workers stopped {gone:.1f} s after SIGSTOP (lease 2 s)"
        (first,) = spotrain_home.glob("localcloud/run-*/executor/instances/*/attempt-1")
        assert (_agent_done(first) / "exit-0").read_text() == "85"  # at the notice, with a checkpoint
        assert "has not renewed its lease for 2 s" in json.loads((first / "owner-gone.json").read_text())["why"]
    finally:
        run.send_signal(signal.SIGCONT)
    out, _ = run.communicate(timeout=90)
    assert run.returncode == 0, out[-2000:]
    job = _last_json(out)
    assert job["state"] == "SUCCEEDED" and job["attempts"] >= 2 and job["step"] == 100, job


def _step_of(name: str) -> int:
    try:
        return int(_job_row(name)["step"])
    except AssertionError:
        return -1


def test_a_machine_without_workers_ends_with_its_dead_owners_lease(spotrain_home: Path) -> None:
    """A machine of a killed run's cloud that ran no agent then (waiting for the rest of its gang,
    say) has nothing to stop at a checkpoint: its bill ends when the owner's lease ran out."""
    from autoscaler.fleet.clouds import local_cloud
    from cloud_providers.base import LaunchRequest
    from cloud_providers.local.owner import LEASE_FILE

    setup = local_cloud("run-0000beef")
    cloud = setup.provider
    offering = next(iter(cloud.offerings()))
    inst = cloud.launch(LaunchRequest(offering=offering, market="on-demand", tags={"spotrain-job": "j"}, decision_id="d"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    renewed = time.time() - 0.5
    (spotrain_home / "localcloud" / "run-0000beef" / LEASE_FILE).write_text(json.dumps(
        {"pid": dead.pid, "pid_start": "0", "lease_s": 1.0, "seq": 7, "renewed_unix_s": renewed}))
    time.sleep(1.5)  # polled after the lease ran out: billed until it did, not until now
    (changed,) = cloud.poll()
    assert changed.instance_id == inst.instance_id and changed.state.value == "terminated"
    assert changed.terminated_at_s == pytest.approx(_market_s(spotrain_home, "run-0000beef", renewed + 1.0))


def _market_s(home: Path, cloud_id: str, wall_s: float) -> float:
    st = json.loads((home / "localcloud" / cloud_id / "cloud" / "cloud.json").read_text())
    return float(st["offset_s"] + (wall_s - st["t0_wall"]) * st["time_scale"])


def test_a_run_being_settled_by_another_command_is_left_to_it(spotrain_home: Path) -> None:
    """Settling a dead run takes a claim on it first (its lease row): while another live command holds
    it, `cancel_abandoned` touches nothing and says so (None); once released, it proceeds."""
    from autoscaler.fleet.runs import cancel_abandoned, reap_abandoned_runs
    from autoscaler.home import db_url
    from autoscaler.state import Store
    from autoscaler.state.lease import Holder, LeaderLease

    store = Store(db_url())
    other = LeaderLease(store.engine, "run-0000cafe", Holder.here(str(spotrain_home)), ttl_s=60)
    assert other.step() == "acquired"
    assert cancel_abandoned(store, "some-job", "run-0000cafe") is None
    other.release()
    assert cancel_abandoned(store, "some-job", "run-0000cafe") is None  # claimed now, but no such live job
    assert reap_abandoned_runs(store) == []


@pytest.mark.e2e
def test_cancel_through_a_live_service_settles_a_killed_runs_job(spotrain_home: Path, tmp_path: Path) -> None:
    """With a controller service running, `cancel` goes through its API, which cancels the job of a
    killed `spotrain run` (embedded: --scenario) in the database instead of refusing it as another's."""
    from support import start_controller

    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("events: []\n")
    ctl = start_controller(spotrain_home)
    try:
        spec = write_pw_spec(tmp_path, name="beside", workers="{min: 1, max: 1}")
        run = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "run", str(spec), "--quiet",
                                "--scenario", str(scenario)],
                               env={**os.environ, "SPOTRAIN_HOME": str(spotrain_home), "PW_STEPS": "100000",
                                    "PW_STEP_S": "0.05", "PW_IGNORE_NOTICE": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and not worker_pids(str(PROTOCOL_WORKER)):
                time.sleep(0.2)
            assert worker_pids(str(PROTOCOL_WORKER))
        finally:
            run.send_signal(signal.SIGKILL)
            run.wait(timeout=10)
        r = run_cli("cancel", "beside")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().endswith(": CANCELLED") and len(r.stdout.strip().splitlines()) == 1, r.stdout
        assert not worker_pids(str(PROTOCOL_WORKER))
        assert _status("beside")["state"] == "CANCELLED"
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(timeout=10)
