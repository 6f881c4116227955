"""The controller's state machine on the real local cloud, with torch-free protocol workers.

Real processes, real SQLite, real market clock; the workers are ``tests/workers/protocol_worker.py``
so that each case takes seconds. The real runtime runs end to end in ``test_quickstart.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autoscaler.controller import Controller
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.state import Decision, Store
from cloud_providers.base import TAG_CONTROLLER, TAG_DECISION, TAG_JOB, TAG_MARKET, LaunchRequest
from cloud_providers.local.scenario import parse_scenario
from support import PROTOCOL_WORKER, assert_no_workers, worker_pids, write_pw_spec

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET"}


def make_controller(cloud_id: str, scenario_text: str = "", tmp: Path | None = None) -> Controller:
    scenario = parse_scenario(scenario_text, base_dir=tmp or Path(".")) if scenario_text else None
    setup = local_cloud(cloud_id, scenario=scenario)
    return Controller(
        store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
        controller_id=cloud_id, tick_s=0.1, clock_rate=setup.clock_rate,
    )


def drive(ctl: Controller, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        ctl.tick()
        info = ctl.job_info(job_id)
        if info["state"] in TERMINAL:
            return info
        time.sleep(0.1)
    raise AssertionError(f"job did not finish: {ctl.job_info(job_id)}")


def tick_until_running(ctl: Controller, job_id: str, tries: int = 60) -> dict:
    """Tick until the job's gang runs (or ``tries`` ticks pass); the job's summary."""
    for _ in range(tries):
        ctl.tick()
        info = ctl.job_info(job_id)
        if info["state"] == "RUNNING":
            return info
        time.sleep(0.1)
    return ctl.job_info(job_id)


def events(ctl: Controller, job_id: str) -> list:
    with ctl.store.session() as s:
        return ctl.store.events(s, job_id)


@pytest.mark.e2e
def test_preempted_job_resumes_and_finishes(spotrain_home: Path, tmp_path: Path, pw_env: None) -> None:
    ctl = make_controller("t-preempt", "events:\n  - {at_step: 10, preempt: 1}\n", tmp_path)
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    info = drive(ctl, job["job_id"])
    assert info["state"] == "SUCCEEDED", info
    assert info["preemptions"] >= 1
    assert info["attempts"] >= 2
    assert info["step"] == 40
    assert info["final_model"].endswith(f"/{job['job_id']}/final/model.safetensors")
    assert 0 < info["cost_usd"] < info["on_demand_cost_usd"]
    kinds = [e.kind for e in events(ctl, job["job_id"])]
    assert "preemption-notice" in kinds
    assert worker_pids(str(PROTOCOL_WORKER)) == []
    instances = ctl.provider.list_instances({TAG_JOB: job["job_id"]})
    assert len(instances) >= 2  # at least the first and a replacement
    assert all(not i.alive for i in instances)


@pytest.mark.e2e
def test_user_error_is_retried_then_fails(spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_STEPS", "40")
    monkeypatch.setenv("PW_FAIL_AT", "0")
    ctl = make_controller("t-usererr")
    spec, workdir = load_spec(write_pw_spec(tmp_path, extra="retries: {max_restarts_on_errors: 1}\n"))
    job = ctl.submit(spec, workdir)
    info = drive(ctl, job["job_id"])
    assert info["state"] == "FAILED"
    assert "exited with code 3" in info["reason"]
    assert info["restarts_on_errors"] == 1
    assert info["attempts"] == 2  # first try + one restart, then no more
    assert info["workers"] == []
    assert worker_pids(str(PROTOCOL_WORKER)) == []


@pytest.mark.e2e
def test_budget_is_never_exceeded(spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_STEPS", "100000")
    monkeypatch.setenv("PW_STEP_S", "0.05")
    ctl = make_controller("t-budget")
    spec, workdir = load_spec(write_pw_spec(tmp_path, extra="objective: {budget_usd: 0.02}\n"))
    job = ctl.submit(spec, workdir)
    info = drive(ctl, job["job_id"], timeout_s=60)
    assert info["state"] == "FAILED_BUDGET"
    assert info["cost_usd"] <= 0.02
    assert "budget" in info["reason"]
    assert worker_pids(str(PROTOCOL_WORKER)) == []


@pytest.mark.e2e
def test_cancel_releases_everything(spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_STEPS", "100000")
    ctl = make_controller("t-cancel")
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    for _ in range(30):
        ctl.tick()
        if ctl.job_info(job["job_id"])["state"] == "RUNNING":
            break
        time.sleep(0.1)
    for _ in range(50):
        if worker_pids(str(PROTOCOL_WORKER)):
            break
        time.sleep(0.1)
    assert worker_pids(str(PROTOCOL_WORKER))
    info = ctl.cancel(job["job_id"])
    assert info["state"] == "CANCELLED"
    assert_no_workers(str(PROTOCOL_WORKER))
    assert all(not i.alive for i in ctl.provider.list_instances({TAG_JOB: job["job_id"]}))


def test_recovery_adopts_unrecorded_launch_and_terminates_orphans(spotrain_home: Path, tmp_path: Path) -> None:
    """A crash between run_instances and recording: the restarted controller adopts by decision tag,
    terminates instances of no live job, and never launches twice for one decision."""
    ctl = make_controller("t-recover")
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    offering = next(o for o in ctl.provider.offerings() if o.accelerator == "T4" and o.cloud == "aws")
    with ctl.store.session() as s:
        s.add(Decision(decision_id="d-crash", job_id=job["job_id"], offering_key=offering.key, market="on-demand"))
    tags = {TAG_JOB: job["job_id"], TAG_CONTROLLER: "t-recover", TAG_MARKET: "on-demand", TAG_DECISION: "d-crash"}
    inst = ctl.provider.launch(LaunchRequest(offering=offering, market="on-demand", decision_id="d-crash", tags=tags))
    orphan_tags = {TAG_JOB: "gone-job", TAG_CONTROLLER: "t-recover", TAG_MARKET: "on-demand", TAG_DECISION: "d-orphan"}
    orphan = ctl.provider.launch(LaunchRequest(offering=offering, market="on-demand", decision_id="d-orphan", tags=orphan_tags))

    # "Restart": a new controller over the same database and cloud state.
    ctl2 = make_controller("t-recover")
    counts = ctl2.recover()
    assert counts["adopted"] == 1 and counts["orphans_terminated"] == 1
    with ctl2.store.session() as s:
        d = s.get(Decision, "d-crash")
        assert d is not None and d.status == "launched" and d.instance_id == inst.instance_id
        assert [r.instance_id for r in ctl2.store.instances(s, job["job_id"])] == [inst.instance_id]
    assert not ctl2.provider.get(orphan.instance_id).alive  # type: ignore[union-attr]
    again = ctl2.provider.launch(LaunchRequest(offering=offering, market="on-demand", decision_id="d-crash", tags=tags))
    assert again.instance_id == inst.instance_id
    assert len(ctl2.provider.list_instances({TAG_DECISION: "d-crash"})) == 1
    ctl2.cancel(job["job_id"])


@pytest.mark.e2e
def test_workers_that_never_start_do_not_restart_forever(spotrain_home: Path, tmp_path: Path) -> None:
    """An agent that dies before its workers make progress, on a machine the cloud did not take back,
    is retried a few times, then the job fails with a reason instead of looping."""
    ctl = make_controller("t-stalled")
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    deadline = time.time() + 60
    while time.time() < deadline:
        ctl.tick()
        info = ctl.job_info(job["job_id"])
        if info["state"] in TERMINAL:
            break
        with ctl.store.session() as s:
            for r in ctl.store.instances(s, job["job_id"], alive_only=True):
                ctl.executor.stop(r.instance_id)  # the machine stays; its workers vanish
        time.sleep(0.05)
    assert info["state"] == "FAILED", info
    assert "lost 5 times in a row" in info["reason"]
    assert info["preemptions"] == 0 and info["restarts_on_errors"] == 0


def test_failed_launch_call_is_settled_by_decision_tag(spotrain_home: Path, tmp_path: Path) -> None:
    """A launch call that raised after the cloud acted leaves a pending decision; the next tick adopts
    the instance carrying that decision's tag instead of launching again."""
    ctl = make_controller("t-pending")
    spec, workdir = load_spec(write_pw_spec(tmp_path, workers="{min: 1, max: 1}"))
    job = ctl.submit(spec, workdir)
    offering = next(o for o in ctl.provider.offerings() if o.accelerator == "T4" and o.cloud == "aws")
    with ctl.store.session() as s:
        s.add(Decision(decision_id="d-inflight", job_id=job["job_id"], offering_key=offering.key, market="on-demand"))
    tags = {TAG_JOB: job["job_id"], TAG_CONTROLLER: "t-pending", TAG_MARKET: "on-demand", TAG_DECISION: "d-inflight"}
    inst = ctl.provider.launch(LaunchRequest(offering=offering, market="on-demand", decision_id="d-inflight", tags=tags))
    ctl.tick()
    with ctl.store.session() as s:
        d = s.get(Decision, "d-inflight")
        assert d is not None and d.status == "launched" and d.instance_id == inst.instance_id
        rows = ctl.store.instances(s, job["job_id"])
    assert inst.instance_id in [r.instance_id for r in rows]
    assert len(ctl.provider.list_instances({TAG_DECISION: "d-inflight"})) == 1  # not launched twice
    ctl.cancel(job["job_id"])


def test_a_failed_tick_keeps_what_the_cloud_reported(spotrain_home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """poll() reports a termination once; a cloud error later in the same tick must not lose it."""
    from autoscaler.state import InstanceRow
    from cloud_providers.errors import Throttled

    monkeypatch.setenv("PW_STEPS", "100000")
    monkeypatch.setenv("PW_STEP_S", "0.05")
    ctl = make_controller("t-keep-poll")
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    try:
        info = tick_until_running(ctl, job["job_id"])
        assert info["state"] == "RUNNING", info
        iid = info["workers"][0]["instance_id"]
        ctl.provider.terminate(iid)  # the cloud takes it back; the next poll says so, once
        real = ctl.provider.offerings
        calls = {"n": 0}

        def flaky():  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == 1:
                raise Throttled("RequestLimitExceeded", cloud="local")
            return real()

        monkeypatch.setattr(ctl.provider, "offerings", flaky)
        ctl.tick()
        assert ctl.last_tick_error is not None and "Throttled" in ctl.last_tick_error
        with ctl.store.session() as s:
            row = s.get(InstanceRow, iid)
            assert row is not None and row.state == "terminated" and row.terminated_at_s is not None
    finally:
        ctl.cancel(job["job_id"])
        for _ in range(3):
            ctl.tick()


def test_an_instance_launched_by_a_failed_call_for_a_cancelled_job_is_terminated(
    spotrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RunInstances created the instance but the call raised; the job is then cancelled before the
    sweep adopted it. With no live job left the sweep must still find it by tag and terminate it."""
    from cloud_providers.base import TAG_JOB
    from cloud_providers.errors import Throttled

    monkeypatch.setenv("PW_STEPS", "100000")
    ctl = make_controller("t-leak")
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    real = ctl.provider.launch

    def launch_then_fail(req):  # type: ignore[no-untyped-def]
        real(req)  # the cloud launched it ...
        raise Throttled("RunInstances timed out after retries", cloud="local")  # ... the call did not say so

    monkeypatch.setattr(ctl.provider, "launch", launch_then_fail)
    ctl.tick()
    monkeypatch.setattr(ctl.provider, "launch", real)
    assert [i for i in ctl.provider.list_instances({TAG_JOB: job["job_id"]}) if i.alive], "the fault did not launch"
    assert ctl.cancel(job["job_id"])["state"] == "CANCELLED"
    for _ in range(3):
        ctl.tick()
    assert not [i.instance_id for i in ctl.provider.list_instances({TAG_JOB: job["job_id"]}) if i.alive]


@pytest.mark.e2e
def test_a_gang_that_ignores_the_stop_notice_is_stopped(spotrain_home: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rescale tells the gang to checkpoint and exit; a script that never does (hung, or deaf to
    notices) must not keep both the old gang and its replacements billing: past the deadline the
    controller stops it and resumes from the last checkpoint."""
    from autoscaler.controller import Timings
    from autoscaler.policy import Allocation, Placement
    from cloud_providers.base import SPOT

    monkeypatch.setenv("PW_STEPS", "200")
    monkeypatch.setenv("PW_STEP_S", "0.05")
    monkeypatch.setenv("PW_IGNORE_NOTICE", "1")
    t0 = time.time()

    class OneThenTwo:
        """One spot worker for the first 2 s, then two on the same offering: a rescale."""

        name = "one-then-two"

        def decide(self, inp):  # type: ignore[no-untyped-def]
            o = min((o for o in inp.offerings if o.accelerator == "T4" and (o.spot_available or 0) >= 2),
                    key=lambda o: (o.spot_price_usd_per_hour, o.key))
            n = 1 if time.time() - t0 < 2.0 else 2
            return [Allocation(j.job_id, (Placement(o.key, SPOT, n),), reason=f"{n} worker(s)") for j in inp.jobs]

    from cloud_providers.local.scenario import Scenario

    setup = local_cloud("t-deaf", scenario=Scenario(oracle=True))  # the test's policy picks by the room
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=OneThenTwo(),
                     controller_id="t-deaf", tick_s=0.1, clock_rate=setup.clock_rate,
                     timings=Timings(stop_notice_s=0.5, stop_grace_s=1.0))
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    info = drive(ctl, job["job_id"], timeout_s=90)
    assert info["state"] == "SUCCEEDED", info
    kinds = [(e.kind, e.reason) for e in events(ctl, job["job_id"])]
    assert any(k == "gang-stopped" and "did not exit within" in r for k, r in kinds), kinds
    assert info["attempts"] >= 2


# The budget guard while the cloud cannot be polled: tests/test_controller_virtual.py (virtual clock).


def test_a_launch_whose_minimum_bill_would_cross_the_budget_is_not_made(spotrain_home: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloud that bills each launch for at least an hour (EC2's minimum is a minute): a job whose
    work fits its budget but whose first launch's minimum bill does not ends FAILED_BUDGET before
    anything is launched, with the numbers in the reason."""
    monkeypatch.setenv("PW_STEPS", "40")
    ctl = make_controller("t-minbill")
    monkeypatch.setattr(ctl.provider, "min_billed_s", 3600.0, raising=False)
    spec, workdir = load_spec(write_pw_spec(tmp_path, extra="objective: {budget_usd: 0.05}\nsimulate: {work_gpu_hours: 0.01}\n"))
    job = ctl.submit(spec, workdir)
    info = drive(ctl, job["job_id"], timeout_s=30)
    assert info["state"] == "FAILED_BUDGET", info
    assert "launching 1 instance(s) bills at least $" in info["reason"] and "3600 s each" in info["reason"], info["reason"]
    assert ctl.provider.list_instances({TAG_JOB: job["job_id"]}) == []
    assert info["cost_usd"] == 0.0
    # Without the minimum, the same job runs to the end within its budget.
    ctl2 = make_controller("t-minbill2")
    job2 = ctl2.submit(spec, workdir)
    info2 = drive(ctl2, job2["job_id"], timeout_s=60)
    assert info2["state"] == "SUCCEEDED", info2
    assert 0 < info2["cost_usd"] <= 0.05


def test_a_running_gang_that_cannot_afford_to_grow_keeps_running(spotrain_home: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that grows a running gang from one worker to two; if that launch could cross the
    budget (``_launch_over_budget`` says so here), the gang keeps running as it is instead of the job
    ending FAILED_BUDGET."""
    from autoscaler.policy.base import Allocation, Placement

    class GrowOnce:
        name = "grow-once"

        def decide(self, inp):  # type: ignore[no-untyped-def]
            o = min((o for o in inp.offerings if o.spot_price_usd_per_hour and o.accelerator == "T4" and o.gpus == 1),
                    key=lambda o: (o.spot_price_usd_per_hour, o.key))
            return [Allocation(j.job_id, (Placement(o.key, "spot", 2 if j.held else 1),), reason="grow") for j in inp.jobs]

    monkeypatch.setenv("PW_STEPS", "60")
    monkeypatch.setenv("PW_STEP_S", "0.1")
    ctl = make_controller("t-nogrow", "events:\n  - {at: 0s, spot_capacity: 2}\n", tmp_path)
    ctl.policy = GrowOnce()
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job = ctl.submit(spec, workdir)
    assert tick_until_running(ctl, job["job_id"])["state"] == "RUNNING"
    asked: list[tuple[str, int]] = []

    def over_budget(ctx, s, job_row, missing, by_key):  # type: ignore[no-untyped-def]
        asked.append((job_row.state, len(missing)))
        return "budget: test"

    import autoscaler.controller.allocate as allocate

    monkeypatch.setattr(allocate, "launch_over_budget", over_budget)
    info = drive(ctl, job["job_id"], timeout_s=60)
    assert info["state"] == "SUCCEEDED", info
    assert ("RUNNING", 1) in asked  # the policy did want a second worker
    assert len(ctl.provider.list_instances({TAG_JOB: job["job_id"]})) == 1
