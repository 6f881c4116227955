"""Regression tests of issue 14's findings 2, 3 and 10 (the checkpoint store and checkpoint loading).

Each test is named after its finding and fails on the code before the fix. Damage is done to a
``file://`` store on disk, the way an attacker with write access to it (or a crash) would leave it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import runtime.checkpoint as checkpoint
from runtime import CheckpointManager, make_store
from runtime.errors import CheckpointCorrupt, ForeignCheckpoint


def _state(step: int) -> dict[str, Any]:
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(16, 8)}, "pos": {"epoch": 1, "step": step}}


def _save(mgr: CheckpointManager, step: int, job_id: str = "job-1") -> None:
    mgr.persist(mgr.snapshot(step, _state(step), {"epoch": 1, "job_id": job_id}))


def _mgr(root: Path, *, keep: int = 3, job_id: str | None = "job-1", writer: bool = True) -> CheckpointManager:
    return CheckpointManager(make_store(f"file://{root}"), keep=keep, writer=writer, job_id=job_id)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def _assert_falls_back_to(mgr: CheckpointManager, step: int) -> None:
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == step
    assert torch.equal(loaded.state["model"]["w"], _state(step)["model"]["w"])


# ----- finding 2: a `?` or `#` in checkpoint.store makes two jobs share checkpoints ---------------
@pytest.mark.parametrize("uri", [
    "file:///data/ckpt?/job-2", "file:///data/ckpt#/job-2", "file:///data/ckpt?x=1", "file:///", "file://data/x",
    "s3://bucket/ckpt?/job-2", "gs://bucket/ckpt#/job-2",
    "file:///data/ckpt%2F..%2Fother", "file:///data//ckpt", "file:///data/./ckpt", "file:///data/ckpt/../x",
    "file:///data/ck\npt", "file:///data/ck\tpt", "file://localhost/data/ckpt", "file://host/data",
    "s3://bucket//ckpt", "s3://Bucket_Name:80/ckpt", "s3://user@bucket/ckpt", "gs://bucket/a/../b",
])
def test_finding2_store_uris_that_do_not_round_trip_are_refused(uri: str) -> None:
    with pytest.raises(ValueError, match="checkpoint URI"):
        make_store(uri)


def test_finding2_ordinary_store_uris_still_work(tmp_path: Path) -> None:
    assert make_store(f"file://{tmp_path}/job-1/").uri == f"file://{tmp_path}/job-1"
    assert make_store("s3://bucket/team/job-1").uri == "s3://bucket/team/job-1"
    assert make_store("s3://my.bucket-1/").uri == "s3://my.bucket-1"
    assert make_store("gs://bucket_x/team/job-1").uri == "gs://bucket_x/team/job-1"
    assert make_store("file:///data/My Checkpoints/job-1").uri == "file:///data/My Checkpoints/job-1"


def test_finding2_two_jobs_under_a_store_with_a_query_never_share(tmp_path: Path) -> None:
    """The controller appends ``/<job_id>`` to the spec's store: with a ``?`` both jobs' URIs used to
    parse to the same directory, and job 2 resumed from job 1's checkpoint."""
    store = f"file://{tmp_path}?"
    for job in ("job-1", "job-2"):
        with pytest.raises(ValueError, match="query"):
            make_store(f"{store}/{job}")


def test_finding2_a_checkpoint_of_another_job_is_refused_and_left_alone(tmp_path: Path) -> None:
    _save(_mgr(tmp_path, job_id="job-1"), 1, job_id="job-1")
    before = {p: (tmp_path / p).read_bytes() for p in _files(tmp_path)}
    other = _mgr(tmp_path, job_id="job-2")
    with pytest.raises(ForeignCheckpoint, match="job-1.*job-2|job-2.*job-1"):
        other.load_latest()
    with pytest.raises(ForeignCheckpoint):
        other.load(1)
    assert {p: (tmp_path / p).read_bytes() for p in _files(tmp_path)} == before  # no marker, nothing pruned
    _assert_falls_back_to(_mgr(tmp_path, job_id="job-1"), 1)  # its own job still resumes from it


def test_finding2_a_manifest_without_a_job_id_is_not_resumed_by_a_job(tmp_path: Path) -> None:
    anonymous = _mgr(tmp_path, job_id=None)
    anonymous.persist(anonymous.snapshot(1, _state(1), {"epoch": 1}))
    with pytest.raises(ForeignCheckpoint, match="no job id"):
        _mgr(tmp_path, job_id="job-2").load_latest()
    assert _mgr(tmp_path, job_id=None).load_latest() is not None  # a tool without a job reads it


def test_finding2_a_manager_with_a_job_stamps_its_manifests(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path, job_id="job-7")
    mgr.persist(mgr.snapshot(1, _state(1), {"epoch": 1}))
    assert json.loads((tmp_path / "checkpoints/1/manifest.json").read_text())["job_id"] == "job-7"


def _trainer(uri: str, job_id: str, max_steps: int) -> Any:
    from runtime import CheckpointConfig, ElasticTrainer, TrainerConfig

    torch.manual_seed(0)
    config = TrainerConfig(checkpoint=CheckpointConfig(uri=uri), max_steps=max_steps, job_id=job_id)
    model = torch.nn.Linear(2, 1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 2), torch.randn(64, 1))
    return ElasticTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                          loss_fn=lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), config=config)


def _train(uri: str, job_id: str, max_steps: int) -> int | None:
    """Train to ``max_steps``, checkpoint there; the step it resumed from."""
    trainer = _trainer(uri, job_id, max_steps)
    try:
        for _ in trainer:
            pass
        trainer.checkpoint(wait=True)
        return trainer.resumed_from
    finally:
        trainer.close()


def test_finding2_the_trainer_refuses_another_jobs_checkpoint(tmp_path: Path) -> None:
    assert _train(f"file://{tmp_path}/job-1", "job-1", 2) is None
    shutil.copytree(tmp_path / "job-1", tmp_path / "job-2")  # job 2's URI names job 1's checkpoints
    trainer = _trainer(f"file://{tmp_path}/job-2", "job-2", 4)
    try:
        with pytest.raises(ForeignCheckpoint, match="job-1"):
            next(iter(trainer))
    finally:
        trainer.close()
    assert sorted(os.listdir(tmp_path / "job-2/checkpoints")) == ["2"]  # nothing marked or written there
    assert _files(tmp_path / "job-2") == _files(tmp_path / "job-1")


def test_finding2_a_job_resumed_by_spotrain_resume_continues_the_ended_jobs_directory(tmp_path: Path) -> None:
    """``spotrain resume`` starts a new job on the ended job's checkpoint URI: that directory is the
    ended job's, and so are the checkpoints the new job writes there (a resume of the resumed job
    reads them)."""
    uri = f"file://{tmp_path}/job-1"
    assert _train(uri, "job-1", 2) is None
    assert _train(uri, "job-3", 4) == 2
    manifest = _manifest(tmp_path / "job-1", 4)
    assert manifest["job_id"] == "job-1" and manifest["written_by_job_id"] == "job-3"
    assert _train(uri, "job-4", 6) == 4


# ----- finding 3: a CORRUPT marker hides a later good checkpoint; .tmp files are kept forever ------
def _corrupt(root: Path, step: int) -> None:
    (root / f"checkpoints/{step}/state.safetensors").write_bytes(b"garbage")


def test_finding3_a_newer_complete_checkpoint_replaces_a_corrupt_marker(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path)
    _save(mgr, 1)
    _save(mgr, 2)
    _corrupt(tmp_path, 2)
    _assert_falls_back_to(mgr, 1)  # step 2 is set aside
    assert (tmp_path / "checkpoints/2/CORRUPT").exists() and mgr.steps() == [1]
    _save(mgr, 2)  # resumed from 1, the job reached step 2 again
    assert mgr.steps() == [1, 2] and not (tmp_path / "checkpoints/2/CORRUPT").exists()
    _assert_falls_back_to(mgr, 2)


def test_finding3_an_incomplete_checkpoint_set_aside_is_replaced_by_a_complete_one(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path)
    _save(mgr, 1)
    (tmp_path / "checkpoints/2").mkdir()
    (tmp_path / "checkpoints/2/state-00000-of-00002.safetensors").write_bytes(b"partial")  # killed writer
    _assert_falls_back_to(mgr, 1)
    _save(mgr, 2)
    _assert_falls_back_to(mgr, 2)
    assert sorted(os.listdir(tmp_path / "checkpoints/2")) == ["manifest.json", "state.safetensors"]


def test_finding3_corrupt_directories_are_pruned_under_keep(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path, keep=2)
    _save(mgr, 1)
    _save(mgr, 2)
    _corrupt(tmp_path, 2)
    _assert_falls_back_to(mgr, 1)
    _save(mgr, 3)
    _save(mgr, 4)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "4"]


def _killed_mid_write(store_root: Path, relpath: str) -> None:
    """A writer process SIGKILLed while writing ``relpath`` (forked; ``os._exit`` skips all cleanup)."""
    store = make_store(f"file://{store_root}")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            with store.writer(relpath) as f:
                f.write(b"x" * 4096)
                os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_finding3_temporaries_of_killed_writers_are_pruned(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path, keep=2)
    _save(mgr, 1)
    _killed_mid_write(tmp_path, "checkpoints/1/state.safetensors")  # a rewrite of step 1, killed
    _killed_mid_write(tmp_path, "checkpoints/2/state.safetensors")  # step 2 never finished
    _killed_mid_write(tmp_path, "final/model.safetensors")
    assert sum(".tmp-" in f for f in _files(tmp_path)) == 3
    _assert_falls_back_to(mgr, 1)
    _save(mgr, 2)
    _save(mgr, 3)
    mgr.write_final({"w": torch.ones(2)})
    assert _files(tmp_path) == ["checkpoints/2/manifest.json", "checkpoints/2/state.safetensors",
                                "checkpoints/3/manifest.json", "checkpoints/3/state.safetensors",
                                "final/model.safetensors"]


# ----- finding 10: checkpoint load --------------------------------------------------------------
def _manifest(root: Path, step: int) -> dict[str, Any]:
    return json.loads((root / f"checkpoints/{step}/manifest.json").read_text())


def _rewrite_manifest(root: Path, step: int, manifest: dict[str, Any], *, rehash: bool = True) -> None:
    if rehash:
        manifest["manifest_sha256"] = checkpoint._manifest_sha256(manifest)
    (root / f"checkpoints/{step}/manifest.json").write_text(json.dumps(manifest))


def _two(root: Path) -> CheckpointManager:
    mgr = _mgr(root)
    _save(mgr, 1)
    _save(mgr, 2)
    return mgr


def test_finding10_a_manifest_without_its_sha256_is_corrupt(tmp_path: Path) -> None:
    mgr = _two(tmp_path)
    m = _manifest(tmp_path, 2)
    del m["manifest_sha256"]
    m["epoch"] = 9  # edited, and the hash that would tell deleted
    _rewrite_manifest(tmp_path, 2, m, rehash=False)
    with pytest.raises(CheckpointCorrupt, match="manifest_sha256"):
        mgr.load(2)
    _assert_falls_back_to(mgr, 1)


@pytest.mark.parametrize("depth", [300, 200_000])
def test_finding10_a_very_deep_manifest_is_corrupt_and_falls_back(tmp_path: Path, depth: int) -> None:
    mgr = _two(tmp_path)
    m = _manifest(tmp_path, 2)
    body = json.dumps({k: v for k, v in m.items() if k != "state"})[:-1]
    if depth < 900:  # deeper than the limit, yet a hash and json.dumps still work: a consistent manifest
        m["state"] = json.loads("[" * depth + "]" * depth)
        _rewrite_manifest(tmp_path, 2, m)
    else:  # deeper than the interpreter's recursion limit
        body = json.dumps({k: v for k, v in m.items() if k != "state"})[:-1]
        (tmp_path / "checkpoints/2/manifest.json").write_text(body + ', "state": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(CheckpointCorrupt, match="deep"):
        mgr.load(2)
    _assert_falls_back_to(mgr, 1)


def test_finding10_a_very_large_manifest_is_corrupt_and_falls_back(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = _two(tmp_path)
    m = _manifest(tmp_path, 2)
    m["padding"] = "x" * 5000
    _rewrite_manifest(tmp_path, 2, m)
    monkeypatch.setattr(checkpoint, "MANIFEST_MAX_BYTES", 4096)
    with pytest.raises(CheckpointCorrupt, match="larger than"):
        mgr.load(2)
    _assert_falls_back_to(mgr, 1)


def _load_latest_within(mgr: CheckpointManager, seconds: float, unblock: Path) -> Any:
    """``mgr.load_latest()`` in a thread; a load that hangs on the FIFO ``unblock`` fails the test
    (and is released by opening the FIFO's other end, so that the process can exit)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(mgr.load_latest()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        fd = os.open(unblock, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(5)
        pytest.fail(f"the load hung on the FIFO {unblock}")
    return out[0] if out else None


@pytest.mark.parametrize("name", ["state.safetensors", "manifest.json"])
def test_finding10_a_fifo_in_place_of_a_file_falls_back_without_hanging(tmp_path: Path, name: str) -> None:
    mgr = _two(tmp_path)
    fifo = tmp_path / "checkpoints/2" / name
    fifo.unlink()
    os.mkfifo(fifo)
    loaded = _load_latest_within(mgr, 5.0, fifo)
    assert loaded is not None and loaded.step == 1
    assert (tmp_path / "checkpoints/2/CORRUPT").read_text().startswith("checkpoint 2:")


@pytest.mark.parametrize("name", ["state.safetensors", "manifest.json"])
def test_finding10_a_directory_in_place_of_a_file_falls_back(tmp_path: Path, name: str) -> None:
    mgr = _two(tmp_path)
    (tmp_path / "checkpoints/2" / name).unlink()
    (tmp_path / "checkpoints/2" / name).mkdir()
    with pytest.raises(CheckpointCorrupt, match="not a regular file"):
        mgr.load(2)
    _assert_falls_back_to(mgr, 1)


def test_finding10_an_io_error_reading_a_shard_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.store as store_module

    mgr = _two(tmp_path)
    real, failing = store_module.read_into, [True, True]  # the next two reads of a file: mgr.load(2), then 2 again

    def eio(read: Any, nbytes: int) -> Any:
        if failing and failing.pop():
            raise OSError(errno.EIO, "Input/output error")
        return real(read, nbytes)

    monkeypatch.setattr(store_module, "read_into", eio)
    with pytest.raises(CheckpointCorrupt, match="Input/output error"):
        mgr.load(2)
    _assert_falls_back_to(mgr, 1)


def test_finding10_a_symlinked_step_directory_is_corrupt_and_nothing_is_written_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    mgr = _two(root)
    outside.mkdir()
    shutil.move(str(root / "checkpoints/2"), str(outside / "2"))  # a complete, valid checkpoint...
    (root / "checkpoints/2").symlink_to(outside / "2", target_is_directory=True)  # ...behind a symlink
    before = _files(outside)
    with pytest.raises(CheckpointCorrupt, match="symbolic link|not a regular file"):
        mgr.load(2)
    _assert_falls_back_to(mgr, 1)
    assert _files(outside) == before  # no CORRUPT marker written through the link
    _save(mgr, 3)
    _save(mgr, 4)
    _save(mgr, 5)  # pruning removes the link, never what it points to
    assert not (root / "checkpoints/2").is_symlink() and _files(outside) == before


def test_finding10_a_symlinked_file_is_never_followed(tmp_path: Path) -> None:
    root, secret = tmp_path / "store", tmp_path / "secret.bin"
    mgr = _two(root)
    secret.write_bytes((root / "checkpoints/2/state.safetensors").read_bytes())  # even the right bytes
    (root / "checkpoints/2/state.safetensors").unlink()
    (root / "checkpoints/2/state.safetensors").symlink_to(secret)
    with pytest.raises(CheckpointCorrupt, match="symbolic link|not a regular file"):
        mgr.load(2)
    _assert_falls_back_to(mgr, 1)
    store = make_store(f"file://{root}")
    with store.writer("checkpoints/2/state.safetensors") as f:  # a write replaces the link itself
        f.write(b"new")
    assert secret.read_bytes() != b"new" and not (root / "checkpoints/2/state.safetensors").is_symlink()
