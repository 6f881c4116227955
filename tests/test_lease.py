"""The fleet's leader lease (autoscaler/state/lease.py) on SQLite and on a real PostgreSQL.

Clocks are fakes, so expiry is tested without waiting: a standby takes the lease only once it has
seen the row unchanged for the holder's TTL on its own clock; a released lease, or one whose holder
ran from this home and is gone, is taken at once; a fenced commit of a leader that lost the lease
raises and commits nothing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from autoscaler.controller import Controller
from autoscaler.errors import Conflict
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url as db_url_of_home
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.state import Decision, Job, Store
from autoscaler.state.lease import Holder, LeaderLease, Seen, holder_gone, may_take, read_lease
from cloud_providers.base import TAG_JOB
from support import write_pw_spec


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lease.db'}"
    return str(request.getfixturevalue("postgres_url"))


def holder(name: str, home: str = "/home-a") -> Holder:
    return Holder(id=name, host="host-1", pid=999_999_999, pid_start=1, home=home, url=f"http://{name}")


def test_may_take_is_pure() -> None:
    me = holder("b", home="/home-b")
    seen = Seen("a", 3, 7, 10.0, {"host": "host-1", "pid": 1, "pid_start": 5, "home": "/home-a"})
    assert may_take(None, unchanged_s=0, me=me)
    assert may_take(Seen("", 3, 8, 10.0, {}), unchanged_s=0, me=me)  # released
    assert not may_take(seen, unchanged_s=9.9, me=me, proc_start=lambda _pid: None)  # another home: wait
    assert may_take(seen, unchanged_s=10.0, me=me, proc_start=lambda _pid: 5)
    same_home = holder("c", home="/home-a")
    assert holder_gone(seen.info, same_home, proc_start=lambda _pid: None)  # its process is gone
    assert holder_gone(seen.info, same_home, proc_start=lambda _pid: 6)  # the pid was reused
    assert not holder_gone(seen.info, same_home, proc_start=lambda _pid: 5)  # alive


def test_one_leads_the_standby_takes_over_after_the_ttl_and_the_old_leader_is_fenced(db_url: str) -> None:
    store = Store(db_url)
    clock = FakeClock()
    a = LeaderLease(store.engine, "fleet", holder("a"), ttl_s=10, clock=clock)
    b = LeaderLease(store.engine, "fleet", holder("b", home="/home-b"), ttl_s=10, clock=clock)
    a.install_fence(store._sessions)
    assert a.step() == "acquired" and a.held() and a.epoch == 1
    assert b.step() == "standby" and b.leader["url"] == "http://a"
    clock.t += 6
    assert a.step() == "renewed"
    assert b.step() == "standby"  # it saw a change: counting starts again
    clock.t += 9
    assert b.step() == "standby" and a.held()
    clock.t += 1.5  # a missed its renewals: 10 s since b saw the row change
    assert not a.held()
    assert b.step() == "acquired" and b.epoch == 2
    with store.session() as s:
        s.add(Job(job_id="j-1", name="j", controller_id="fleet", cloud="local", spec_json="{}", workdir=".",
                  checkpoint_uri="file:///x"))
    # a wakes: every commit it makes inside fenced() fails and writes nothing; its renewal fails.
    a._deadline = clock.t + 100  # as if its clock had stopped (a paused process)
    with a.fenced(), pytest.raises(Conflict), store.session() as s:
        s.get(Job, "j-1").state = "FAILED"  # type: ignore[union-attr]
    assert a.epoch is None and not a.held()
    with store.session() as s:
        assert s.scalars(select(Job.state).where(Job.job_id == "j-1")).one() == "PENDING"
    assert a.step() == "standby"
    assert read_lease(store.engine, "fleet")["holder"] == "b"  # type: ignore[index]
    # Unfenced commits (the API's, on any controller) go through.
    with store.session() as s:
        s.get(Job, "j-1").reason = "noted"  # type: ignore[union-attr]


def test_a_released_lease_is_taken_at_once_and_a_dead_holder_of_this_home_too(db_url: str) -> None:
    store = Store(db_url)
    clock = FakeClock()
    a = LeaderLease(store.engine, "fleet", holder("a"), ttl_s=30, clock=clock)
    b = LeaderLease(store.engine, "fleet", holder("b", home="/home-b"), ttl_s=30, clock=clock)
    assert a.step() == "acquired" and b.step() == "standby"
    a.release()
    assert b.step() == "acquired" and b.epoch == 2
    # A controller restarted in b's home after b was SIGKILLed (b's pid does not exist) need not wait.
    again = LeaderLease(store.engine, "fleet", holder("b2", home="/home-b"), ttl_s=30, clock=clock)
    assert again.step() == "acquired" and again.epoch == 3
    assert b.step() == "lost"


def test_two_standbys_racing_for_an_expired_lease_make_one_leader(db_url: str) -> None:
    store = Store(db_url)
    clock = FakeClock()
    LeaderLease(store.engine, "fleet", holder("dead"), ttl_s=5, clock=clock).step()
    racers = [LeaderLease(store.engine, "fleet", holder(f"s{i}", home=f"/h{i}"), ttl_s=5, clock=clock) for i in range(4)]
    for r in racers:
        assert r.step() == "standby"
    clock.t += 6
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda r=r: outcomes.append(r.step())) for r in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["acquired", "standby", "standby", "standby"]
    assert read_lease(store.engine, "fleet")["epoch"] == 2  # type: ignore[index]


def test_a_bad_ttl_is_refused() -> None:
    with pytest.raises(ValueError):
        LeaderLease(None, "fleet", holder("a"), ttl_s=0)


def leased_controller(cloud_id: str, name: str, clock: FakeClock) -> Controller:
    setup = local_cloud(cloud_id)
    store = Store(db_url_of_home())
    lease = LeaderLease(store.engine, cloud_id, holder(name, home=f"/home-{name}"), ttl_s=10, clock=clock)
    return Controller(store=store, provider=setup.provider, executor=setup.executor, policy=get_policy(),
                      controller_id=cloud_id, tick_s=0.1, clock_rate=setup.clock_rate, lease=lease,
                      on_lead=lambda: (lambda s: (s.provider, s.executor))(local_cloud(cloud_id)))


@pytest.mark.e2e
def test_a_standby_records_writes_for_the_leader_and_a_deposed_leader_commits_nothing(
        spotrain_home: Path, tmp_path: Path, pw_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_STEPS", "100000")
    clock = FakeClock()
    a, b = leased_controller("t-ha", "a", clock), leased_controller("t-ha", "b", clock)
    a.lease_step()
    b.lease_step()
    assert a.role == "standby"  # holds the lease, but acts only once it recovered: on its next tick
    a.tick()
    b.tick()
    assert a.role == "leader" and b.role == "standby"
    spec, workdir = load_spec(write_pw_spec(tmp_path))
    job_id = b.submit(spec, workdir)["job_id"]  # at the standby: into the database
    b.tick()  # a standby's tick does nothing
    assert b.job_info(job_id)["state"] == "PENDING"
    for _ in range(50):
        a.tick()
        if a.job_info(job_id)["state"] == "RUNNING":
            break
        time.sleep(0.1)
    assert a.job_info(job_id)["state"] == "RUNNING"
    info = b.cancel(job_id)  # recorded for the leader, which ends the job on its next tick
    assert info["state"] == "RUNNING"
    with b.store.session() as s:
        assert "cancel-requested" in [e.kind for e in b.store.events(s, job_id)]
    a.tick()
    assert a.job_info(job_id)["state"] == "CANCELLED"
    assert all(not i.alive for i in a.provider.list_instances({TAG_JOB: job_id}))

    # b takes over once a's lease has gone 10 s unrenewed; a, paused meanwhile, wakes and ticks: its
    # first commit is fenced, so it records nothing and stands by.
    job2 = b.submit(load_spec(write_pw_spec(tmp_path, name="second"))[0], workdir)["job_id"]
    clock.t += 10.5
    b.lease_step()
    assert b.lease is not None and b.lease.epoch == 2
    assert a.lease is not None
    a.lease._deadline = clock.t + 100  # as if its clock had stopped while it was paused
    a.tick()
    assert a.role == "standby" and "lost the lease" in (a.last_tick_error or "")
    assert a.job_info(job2)["state"] == "PENDING" and a.job_info(job2)["attempts"] == 0
    with a.store.session() as s:
        assert s.scalars(select(Decision).where(Decision.job_id == job2)).all() == []
    b.tick()  # recovery, then the tick
    assert b.role == "leader"
    b.cancel(job2)
    assert b.job_info(job2)["state"] == "CANCELLED"
