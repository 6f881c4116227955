"""Hostile job files and workdirs (issue 21, findings 1, 2 and 10): nothing a job writes, and nothing
its author leaves in the workdir, may hang, crash or stall the controller.

Each hostile read runs in a child process with a time limit and an address-space limit, so that the
code before the fix (which blocked for ever on a FIFO, or read ``/dev/zero`` until memory ran out)
fails these tests instead of hanging or exhausting the machine.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from autoscaler.controller import Controller
from autoscaler.errors import SpecError
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url
from autoscaler.jobs.spec import load_spec
from autoscaler.jobs.workdir import IGNORE_FILE, build_archive, check_workdir
from autoscaler.policy import get_policy
from autoscaler.state import Store
from cloud_providers.local.executor import LocalExecutor
from support import write_pw_spec

from .figures import record

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 20.0  # what a child may take before it counts as hung
MEMORY_BYTES = 2 * 1024**3  # a child's address space: /dev/zero read whole would pass it


def bounded(code: str, *, timeout_s: float = LIMIT_S, env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run ``code`` in a child Python (this tree on its path) with a time and memory limit: its
    stdout's last line, or ``"HUNG"`` / ``"CRASHED: ..."``; and the seconds it took."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))

    env = {**os.environ, **(env or {}), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                             timeout=timeout_s, env=env, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return "HUNG", time.perf_counter() - t0
    took = time.perf_counter() - t0
    if out.returncode != 0:
        return f"CRASHED: {(out.stderr.strip().splitlines() or ['?'])[-1]}", took
    return (out.stdout.strip().splitlines() or [""])[-1], took


# ----- finding 1: the progress file ------------------------------------------------------------------
def hostile_progress(root: Path, kind: str) -> None:
    path = Path(LocalExecutor(root).progress_file("job"))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":  # valid JSON, 8 MiB: read and parsed again on every tick before
        path.write_text(json.dumps({"step": 5, "pad": "x" * (8 * 1024 * 1024)}))
    elif kind == "directory":
        path.mkdir()


KINDS = ["fifo", "dev-zero", "huge", "directory"]


def test_finding1_hostile_progress_files_are_refused_at_once(tmp_path: Path) -> None:
    took: dict[str, float] = {}
    for kind in KINDS:
        root = tmp_path / kind
        hostile_progress(root, kind)
        out, took[kind] = bounded(f"""
            from cloud_providers.local.executor import LocalExecutor
            ex = LocalExecutor({str(root)!r})
            print(repr([ex.progress("job") for _ in range(3)]))
        """)
        assert out == "[None, None, None]", (kind, out)
        assert took[kind] < 10.0, (kind, took[kind])
    # A good report after a hostile one is read again.
    ex = LocalExecutor(tmp_path / "fifo")
    path = Path(ex.progress_file("job"))
    path.unlink()
    path.write_text('{"step": 7}')
    assert ex.progress("job") == {"step": 7}
    record("hostile_jobfiles", tried=f"rank 0's progress file as a FIFO, a link to /dev/zero, an 8 MiB report, a "
                                     f"directory (each read 3 times, in a child limited to {LIMIT_S:g} s and 2 GiB)",
           held=f"each refused without blocking (slowest child {max(took.values()):.2f} s, start-up included); "
                "the next good report read", seconds=took)


def test_finding1_a_worker_log_swapped_for_a_fifo_or_a_link_is_not_read(tmp_path: Path) -> None:
    """A worker can find its own log (its stdout) and replace it: the controller reads its tail when
    the worker fails (under the lock) and for ``spotrain logs``."""
    fifo, link = tmp_path / "attempt-1-rank-0.log", tmp_path / "attempt-2-rank-0.log"
    os.mkfifo(fifo)
    link.symlink_to("/dev/zero")
    out, took = bounded(f"""
        from pathlib import Path
        from autoscaler.controller.outcomes import traceback_tail
        from autoscaler.client.logs import tail_bytes
        paths = [Path({str(fifo)!r}), Path({str(link)!r})]
        result = [traceback_tail(p) for p in paths]
        for p in paths:
            try:
                tail_bytes(p)
                result.append("read")
            except OSError:
                result.append("refused")
        print(repr(result))
    """)
    assert out == "[[], [], 'refused', 'refused']", out
    assert took < 10.0


class StallingExecutor(LocalExecutor):
    """The local executor on a filesystem where one job's progress file hangs every read (a hung NFS or
    FUSE mount a job could make): ``progress`` of that job blocks until ``release`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.stall_job: str | None = None
        self.stalled = threading.Event()
        self.release = threading.Event()

    def progress(self, job_id: str):  # type: ignore[no-untyped-def]
        if job_id == self.stall_job and not self.release.is_set():
            self.stalled.set()
            self.release.wait(30)
        return super().progress(job_id)


def test_finding1_a_stalled_progress_read_never_holds_the_controllers_lock(spotrain_home: Path, tmp_path: Path) -> None:
    setup = local_cloud("stall")
    executor = StallingExecutor(Path(setup.executor.root))
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=executor, policy=get_policy(),
                     controller_id="stall", tick_s=0.1, clock_rate=setup.clock_rate)
    spec, workdir = load_spec(write_pw_spec(tmp_path, name="stuck", workers="{min: 1, max: 1}"))
    stuck = ctl.submit(spec, workdir)
    executor.stall_job = stuck["job_id"]
    tick = threading.Thread(target=ctl.tick, daemon=True)
    tick.start()
    try:
        assert executor.stalled.wait(10), "the tick never read the job's progress"
        done: dict[str, object] = {}

        def submit_and_cancel() -> None:
            other, _ = load_spec(write_pw_spec(tmp_path, name="other", workers="{min: 1, max: 1}"))
            job = ctl.submit(other, workdir)
            done["cancel"] = ctl.cancel(job["job_id"])["state"]

        api = threading.Thread(target=submit_and_cancel, daemon=True)
        t0 = time.perf_counter()
        api.start()
        api.join(5)
        waited = time.perf_counter() - t0
        assert not api.is_alive(), "submit and cancel waited for the tick's stalled read of a job file"
        assert done["cancel"] == "CANCELLED" and waited < 5
    finally:
        executor.release.set()
        tick.join(30)
    ctl.cancel(stuck["job_id"])
    ctl.tick()


# ----- findings 2 and 10: the workdir ------------------------------------------------------------------
def workdir(tmp_path: Path, name: str = "w") -> Path:
    root = tmp_path / name
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    return root


def check_in_child(root: Path, env: dict[str, str] | None = None) -> tuple[str, float]:
    """``check_workdir`` then ``build_archive`` of ``root`` in a bounded child: "ok", or the one-line
    SpecError, or HUNG / CRASHED."""
    return bounded(f"""
        from pathlib import Path
        from autoscaler.errors import SpecError
        from autoscaler.jobs.workdir import build_archive, check_workdir
        try:
            check_workdir(Path({str(root)!r}))
            build_archive(Path({str(root)!r}))
            print("ok")
        except SpecError as exc:
            print("SpecError: " + str(exc).replace(chr(10), "<NEWLINE>"))
    """, env=env)


def test_finding2_hostile_ignore_files_and_globs_give_one_line_errors_quickly(tmp_path: Path) -> None:
    cases: dict[str, tuple[str, float]] = {}
    fifo = workdir(tmp_path, "fifo")
    os.mkfifo(fifo / IGNORE_FILE)
    cases["fifo .spotrainignore"] = check_in_child(fifo)
    zero = workdir(tmp_path, "zero")
    (zero / IGNORE_FILE).symlink_to("/dev/zero")
    cases[".spotrainignore -> /dev/zero"] = check_in_child(zero)
    huge = workdir(tmp_path, "huge")
    (huge / IGNORE_FILE).write_text("*.log\n" * 200_000)
    cases["1.2 MB .spotrainignore"] = check_in_child(huge)
    for kind in ("fifo .spotrainignore", ".spotrainignore -> /dev/zero", "1.2 MB .spotrainignore"):
        out, _ = cases[kind]
        assert out.startswith("SpecError: workdir: .spotrainignore must be a regular file"), (kind, out)
        assert "<NEWLINE>" not in out
    # A glob that backtracks catastrophically under `re` (the old translation): now linear.
    glob = workdir(tmp_path, "glob")
    (glob / IGNORE_FILE).write_text("*a*a*a*a*a*a*a*a*a*a*a*a*b\n")
    (glob / ("a" * 200)).write_text("x")
    cases["backtracking glob"] = out_took = check_in_child(glob)
    assert out_took[0] == "ok" and out_took[1] < 10.0, out_took
    # Patterns that would cost too much over the tree: refused with a budget, not run for minutes.
    costly = workdir(tmp_path, "costly")
    (costly / IGNORE_FILE).write_text("*a*a*a*a*a*a*a*a*a*a*a*a*b\n" * 1000)
    for i in range(40):
        (costly / (f"{i:02d}" + "a" * 200 + "b")).write_text("x")
    cases["1,000 costly globs x 40 files"] = check_in_child(costly)
    assert cases["1,000 costly globs x 40 files"][0].startswith("SpecError: workdir: the patterns of .spotrainignore cost"), \
        cases["1,000 costly globs x 40 files"]
    # Too many files: refused at submit, before any archive is built.
    many = workdir(tmp_path, "many")
    for i in range(1_500):
        (many / f"f{i}").touch()
    cases["1,500 files, limit 1,000"] = check_in_child(many, {"SPOTRAIN_WORKDIR_MAX_FILES": "1000"})
    assert cases["1,500 files, limit 1,000"][0].startswith("SpecError: workdir:") and \
        "more than 1000 files" in cases["1,500 files, limit 1,000"][0]
    for kind, (out, took) in cases.items():
        assert took < 15.0 and not out.startswith(("HUNG", "CRASHED")), (kind, out, took)
    record("hostile_workdirs", tried="; ".join(cases),
           held=f"each a one-line SpecError or shipped, none hung (slowest child {max(t for _, t in cases.values()):.2f} s)",
           cases={k: {"outcome": v[0][:200], "seconds": round(v[1], 3)} for k, v in cases.items()})


def test_finding10_a_symlink_loop_is_a_one_line_spec_error(tmp_path: Path) -> None:
    root = workdir(tmp_path)
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    with pytest.raises(SpecError, match="'?a'? is a symbolic link loop") as err:
        check_workdir(root)
    assert "\n" not in str(err.value)


def test_finding10_an_absolute_in_tree_link_ships_as_a_relative_one_that_unpacks(tmp_path: Path) -> None:
    root = workdir(tmp_path)
    (root / "data").mkdir()
    (root / "data" / "x.csv").write_text("1,2\n")
    (root / "abs").symlink_to(root / "data" / "x.csv")  # absolute, inside the tree
    (root / "data" / "up").symlink_to("../train.py")
    blob, _ = build_archive(root)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        assert tar.getmember("abs").linkname == "data/x.csv"
        dest = tmp_path / "unpacked"
        tar.extractall(dest, filter="data")  # what the instance's agent does: refuses absolute links
    assert (dest / "abs").read_text() == "1,2\n" and (dest / "data" / "up").read_text() == "print('hi')\n"


def test_finding10_a_path_too_long_for_an_instance_is_refused_at_submit(tmp_path: Path) -> None:
    root = workdir(tmp_path)
    # 20 x 200 characters: a 4,000-character path, each name within NAME_MAX. Made one directory at a
    # time relative to the last (dir_fd): with tmp_path's own length in front (longer under xdist) the
    # absolute path would pass PATH_MAX (4,096) and the test's own mkdir fail with ENAMETOOLONG.
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(20):
            name = f"{i:02d}" + "d" * 198
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("f.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    with pytest.raises(SpecError, match="over the 1024-byte limit") as err:
        check_workdir(root)
    assert "\n" not in str(err.value)


def test_finding10_names_with_newlines_do_not_escape_exclusions(tmp_path: Path) -> None:
    root = workdir(tmp_path)
    (root / IGNORE_FILE).write_text("*.pem\nsecrets/**\n")
    (root / "dir\nname").mkdir()
    (root / "dir\nname" / "key.pem").write_text("KEY")
    (root / "secrets" / "a\nb").mkdir(parents=True)
    (root / "secrets" / "a\nb" / "token").write_text("TOKEN")
    (root / "ok\nname.py").write_text("")
    blob, _ = build_archive(root)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        names = set(tar.getnames())
    assert "dir\nname/key.pem" not in names and "secrets/a\nb/token" not in names
    assert "ok\nname.py" in names and "train.py" in names


# ----- finding 5: a job's output on the controller's disk ---------------------------------------------
def test_finding5_local_workers_logs_are_kept_to_the_jobs_cap(spotrain_home: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from autoscaler.client.logs import job_logs
    from autoscaler.home import logs_dir

    def dir_bytes(d: Path) -> int:
        return sum(f.lstat().st_size for f in d.iterdir())

    monkeypatch.setenv("SPOTRAIN_JOB_LOG_MAX_MB", "1")
    setup = local_cloud("logcap")
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                     controller_id="logcap", tick_s=0.1, clock_rate=setup.clock_rate)
    spec, wd = load_spec(write_pw_spec(tmp_path, name="noisy", workers="{min: 1, max: 1}"))
    job = ctl.submit(spec, wd)
    d = logs_dir(job["job_id"])
    d.mkdir(parents=True, exist_ok=True)
    # A worker's stdout: a file it holds open for appending, as the local agent gives it.
    fd = os.open(d / "attempt-9-rank-0.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        written = 0
        for _ in range(3):
            os.write(fd, b"noise " * 300_000)  # 1.8 MB between two ticks
            written += 1_800_000
            ctl.tick()
            assert dir_bytes(d) <= 1024 * 1024 + 256 * 1024, dir_bytes(d)  # the workers' own logs too
        os.write(fd, b"last line\n")
        assert (d / "attempt-9-rank-0.log").read_bytes().endswith(b"last line\n")
        assert (d / "attempt-9-rank-0.log").stat().st_size < 1024  # the writer goes on at the emptied file's end
    finally:
        os.close(fd)
        ctl.cancel(job["job_id"])
        ctl.tick()
    text = job_logs(ctl.store, job["job_id"], rank=0)
    assert "output rotated 3 time(s)" in text and f"the first {written} bytes" in text and "last line" in text
