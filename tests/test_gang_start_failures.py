"""Issue 21, finding 6: a failed first gang start ended the tick for every job, and the job failed
with ``IllegalTransition PENDING -> RECOVERING`` instead of the cause, never retried.

The real controller on the virtual clock (``World``: LocalProvider, SimulatedExecutor, SQLite), two
jobs. Starting job A's workers first ships its workdir, as the remote executor does, with the real
``autoscaler.jobs.workdir.ship`` into a ``file://`` store that refuses it (a regular file stands where its
directory must be: the real ``ProviderError``), or into a store URI the product refuses (the real
``SpecError``). Job B must never notice; A's failure is classified, retried with back-off when
transient, and A ends with its real cause when it cannot start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_hardening import calm_world, one_line, sim_spec, sim_workload

from autoscaler.jobs.workdir import ship
from cloud_providers.errors import CredentialsError, ProviderError, Throttled
from cloud_providers.executor import WorkerLaunch
from cloud_providers.remote.wire import WireError

MAX_START_FAILURES = 5  # start_failures.MAX_START_FAILURES (named here too: the test must run on main)
BACKOFF_S = (15.0, 30.0)  # start_failures.backoff_s(1), backoff_s(2)


class ShippingExecutor:
    """The world's executor, except that starting job ``job_id``'s workers first ships a workdir to
    ``store_uri`` (as the remote executor does); ``heal_after`` failures, the store is fixed."""

    def __init__(self, inner: Any, job_id: str, workdir: Path, store_uri: str, *, heal_after: int | None) -> None:
        self.inner, self.job_id, self.workdir, self.store_uri = inner, job_id, workdir, store_uri
        self.heal_after = heal_after
        self.tries: list[float] = []  # controller-clock times of A's start attempts
        self.failures = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, launch: WorkerLaunch) -> None:
        if launch.job_id == self.job_id:
            self.tries.append(self.inner.clock.now())
            try:
                ship(self.workdir, self.store_uri)
            except Exception:
                self.failures += 1
                if self.heal_after is not None and self.failures >= self.heal_after:
                    blocker = Path(self.store_uri.removeprefix("file://"))
                    if blocker.is_file():
                        blocker.unlink()  # the store is writable again
                raise
        self.inner.start(launch)


def run_two_jobs(tmp_path: Path, store_uri: str, *, heal_after: int | None) -> tuple[Any, str, str, ShippingExecutor, list[str]]:
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hi')\n")
    w = calm_world()
    w.controller.strict = False  # as the service runs: a failed tick is recorded, not raised
    a = w.submit(sim_spec("a"), sim_workload())
    b = w.submit(sim_spec("b"), sim_workload())
    shipping = ShippingExecutor(w.executor, a, workdir, store_uri, heal_after=heal_after)
    w.controller.ctx.executor = shipping  # type: ignore[assignment]
    tick_errors = []
    for _ in range(200):
        w.controller.tick()
        tick_errors.append(w.controller.last_tick_error)
        if all(w.outcome(j).state in ("SUCCEEDED", "FAILED") for j in (a, b)):
            break
        w.clock.advance_to(w.clock.now() + 60.0)
    return w, a, b, shipping, [e for e in tick_errors if e]


def job_facts(w: Any, job_id: str) -> tuple[str, str, list[str]]:
    from autoscaler.state import Job

    with w.store.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.state, job.reason, [e.reason for e in w.store.events(s, job_id) if e.kind == "gang-start-failed"]


def test_a_transient_start_failure_is_retried_with_backoff_and_other_jobs_run_on(tmp_path: Path) -> None:
    blocker = tmp_path / "store"
    blocker.write_text("not a directory")
    w, a, b, shipping, tick_errors = run_two_jobs(tmp_path, f"file://{blocker}", heal_after=2)
    assert tick_errors == []  # no tick was ended by A's trouble
    assert w.outcome(b).state == "SUCCEEDED"
    state, _reason, failed = job_facts(w, a)
    assert state == "SUCCEEDED" and w.outcome(a).state == "SUCCEEDED"
    assert len(failed) == 2 and all(one_line(r) and "ProviderError: workdir: cannot put the archive" in r for r in failed)
    assert "retrying in 15 s (1 of 5)" in failed[0] and "retrying in 30 s (2 of 5)" in failed[1]
    # The back-off held: each retry came no sooner than its wait.
    assert shipping.tries[1] - shipping.tries[0] >= BACKOFF_S[0] and shipping.tries[2] - shipping.tries[1] >= BACKOFF_S[1]
    assert not any("IllegalTransition" in e for e in failed)


def test_a_start_that_keeps_failing_ends_the_job_with_its_cause(tmp_path: Path) -> None:
    blocker = tmp_path / "store"
    blocker.write_text("not a directory")
    w, a, b, shipping, tick_errors = run_two_jobs(tmp_path, f"file://{blocker}", heal_after=None)
    assert tick_errors == [] and w.outcome(b).state == "SUCCEEDED"
    state, reason, failed = job_facts(w, a)
    assert state == "FAILED" and len(failed) == MAX_START_FAILURES == len(shipping.tries)
    assert reason.startswith(f"cannot start the workers ({MAX_START_FAILURES} tries): ProviderError: workdir: cannot put")
    assert one_line(reason) and "IllegalTransition" not in reason
    with w.store.session() as s:
        assert all(r.state == "terminated" for r in w.store.instances(s, a))  # nothing of A bills on


def test_a_permanent_start_failure_ends_the_job_at_once(tmp_path: Path) -> None:
    w, a, b, shipping, tick_errors = run_two_jobs(tmp_path, "ftp://store.example/x", heal_after=None)
    assert tick_errors == [] and w.outcome(b).state == "SUCCEEDED"
    state, reason, failed = job_facts(w, a)
    assert state == "FAILED" and len(shipping.tries) == 1 and len(failed) == 1
    assert reason.startswith("cannot start the workers: SpecError: checkpoint.store: cannot ship the workdir to "
                             "'ftp://store.example/x/workdir/") and reason.endswith("(file://, s3:// or gs:// only)"), reason
    assert "not retried (a permanent error)" in failed[0]


def test_start_failures_are_classified_by_the_error_hierarchies() -> None:
    from autoscaler.controller import start_failures
    from autoscaler.controller.start_failures import BACKOFF_BASE_S, backoff_s, transient

    assert start_failures.MAX_START_FAILURES == MAX_START_FAILURES and (backoff_s(1), backoff_s(2)) == BACKOFF_S
    assert transient(ProviderError("store down")) and transient(Throttled("slow down")) and transient(OSError("EIO"))
    assert not transient(CredentialsError("expired")) and not transient(WireError("bad message"))
    assert not transient(ValueError("bad uri"))
    assert backoff_s(1) == BACKOFF_BASE_S and backoff_s(2) == 2 * BACKOFF_BASE_S and backoff_s(20) == 600.0
