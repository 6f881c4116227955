"""Checkpoint store and manager: atomicity, sha256 verification, fallback, keep-N, S3 (moto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load

from runtime import CheckpointManager, make_store
from runtime.errors import CheckpointCorrupt, CheckpointError
from runtime.serialization import write_safetensors


def _state(step: int) -> dict:
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(16, 8), "b": torch.zeros(8, dtype=torch.bfloat16)},
            "opt": {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "pos": {"epoch": 1, "step": step}, "flags": torch.tensor([True, False])}


def _save(mgr: CheckpointManager, step: int, *, background: bool = True) -> None:
    snap = mgr.snapshot(step, _state(step), {"epoch": 1, "world_size": 2})
    mgr.persist_async(snap) if background else mgr.persist(snap)
    mgr.wait()


def test_safetensors_writer_matches_the_reference_loader(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5), "c": torch.tensor(2.5, dtype=torch.float64),
               "d": torch.zeros(0), "e": torch.ones(2, dtype=torch.bfloat16), "f": torch.tensor([True])}
    with open(tmp_path / "x.safetensors", "wb") as f:
        nbytes, _ = write_safetensors(f, tensors, {"k": "v"})
    data = (tmp_path / "x.safetensors").read_bytes()
    assert len(data) == nbytes
    back = st_load(data)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k


def test_round_trip_keep_n_and_manifest_written_last(tmp_path: Path) -> None:
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=2)
    for step in (5, 10, 15):
        _save(mgr, step)
    assert mgr.steps() == [10, 15]
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 15
    assert torch.equal(loaded.state["model"]["w"], _state(15)["model"]["w"])
    assert loaded.state["opt"]["state"][0]["step"].item() == 15.0
    assert loaded.state["flags"].tolist() == [True, False]
    manifest = json.loads((tmp_path / "checkpoints" / "15" / "manifest.json").read_text())
    assert manifest["step"] == 15 and manifest["world_size"] == 2
    assert set(manifest["files"]) == {"state.safetensors"} and len(manifest["files"]["state.safetensors"]["sha256"]) == 64
    assert not [p for p in (tmp_path / "checkpoints" / "15").iterdir() if ".tmp-" in p.name]


def test_incomplete_checkpoint_without_manifest_is_ignored(tmp_path: Path) -> None:
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=3)
    _save(mgr, 1)
    (tmp_path / "checkpoints" / "2").mkdir()
    (tmp_path / "checkpoints" / "2" / "state.safetensors").write_bytes(b"partial")
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest"])
def test_corrupt_newest_falls_back_to_previous(tmp_path: Path, damage: str) -> None:
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=3)
    _save(mgr, 1)
    _save(mgr, 2)
    newest = tmp_path / "checkpoints" / "2"
    if damage == "truncate":
        data = (newest / "state.safetensors").read_bytes()
        (newest / "state.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data = bytearray((newest / "state.safetensors").read_bytes())
        data[len(data) - 3] ^= 0x01
        (newest / "state.safetensors").write_bytes(bytes(data))
    else:
        (newest / "manifest.json").write_text('{"step": 2, "form')
    with pytest.raises(CheckpointCorrupt):
        mgr.load(2)
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.state["model"]["w"], _state(1)["model"]["w"])
    assert mgr.steps() == [1]  # the corrupt one is set aside by the writer, not deleted
    assert (newest / "CORRUPT").read_text().startswith("checkpoint 2:") and (newest / "manifest.json").exists()


def test_reader_never_deletes_and_all_corrupt_means_fresh_start(tmp_path: Path) -> None:
    writer = CheckpointManager(make_store(f"file://{tmp_path}"), keep=3)
    _save(writer, 3)
    (tmp_path / "checkpoints" / "3" / "state.safetensors").write_bytes(b"x")
    reader = CheckpointManager(make_store(f"file://{tmp_path}"), keep=3, writer=False)
    assert reader.load_latest() is None
    assert reader.steps() == [3]


def test_snapshot_is_isolated_from_later_training(tmp_path: Path) -> None:
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=2)
    w = torch.ones(1000)
    snap = mgr.snapshot(1, {"w": w}, {})
    w.add_(1.0)  # training goes on while the persist runs
    mgr.persist_async(snap)
    mgr.wait()
    loaded = mgr.load(1)
    assert torch.equal(loaded.state["w"], torch.ones(1000))


def test_persist_failure_surfaces_on_wait(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    mgr = CheckpointManager(make_store(f"file://{blocker}"), keep=2)
    mgr.persist_async(mgr.snapshot(1, {"w": torch.ones(2)}, {}))
    with pytest.raises(CheckpointError, match="persist failed"):
        mgr.wait()


def test_final_weights_and_store_uris(tmp_path: Path) -> None:
    mgr = CheckpointManager(make_store(f"file://{tmp_path}/job"), keep=1)
    url = mgr.write_final({"w": torch.arange(4.0)})
    assert url == f"file://{tmp_path}/job/final/model.safetensors"
    assert torch.equal(st_load((tmp_path / "job" / "final" / "model.safetensors").read_bytes())["w"], torch.arange(4.0))
    assert make_store("gs://bucket/job").uri == "gs://bucket/job"  # built lazily; tests/gcp/test_gcs_store.py runs it
    with pytest.raises(ValueError, match="unsupported scheme"):
        make_store("ftp://host/x")


@pytest.mark.aws
def test_s3_store_round_trip_fallback_and_pruning(monkeypatch: pytest.MonkeyPatch) -> None:
    moto = pytest.importorskip("moto")
    import boto3

    for k in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="ckpts")
        mgr = CheckpointManager(make_store("s3://ckpts/team/job-1"), keep=2)
        for step in (1, 2, 3):
            _save(mgr, step)
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"])
        assert keys == [f"team/job-1/checkpoints/{s}/{f}" for s in (2, 3) for f in ("manifest.json", "state.safetensors")]
        s3.put_object(Bucket="ckpts", Key="team/job-1/checkpoints/3/state.safetensors", Body=b"garbage")
        loaded = mgr.load_latest()
        assert loaded is not None and loaded.step == 2
        assert torch.equal(loaded.state["model"]["w"], _state(2)["model"]["w"])
        url = mgr.write_final({"w": torch.ones(3)})
        assert url == "s3://ckpts/team/job-1/final/model.safetensors"
        body = s3.get_object(Bucket="ckpts", Key="team/job-1/final/model.safetensors")["Body"].read()
        assert torch.equal(st_load(body)["w"], torch.ones(3))


def test_a_failing_prune_or_an_earlier_failed_persist_does_not_lose_the_next_checkpoint(tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pruning runs after the durable point and only logs its failures; a periodic persist that
    failed is superseded by the next snapshot (say, the notice's) instead of blocking it."""
    from runtime.errors import StoreError

    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=1)
    _save(mgr, 1)

    def refuse(relpath: str) -> None:
        raise StoreError(f"delete {relpath}: access denied")

    monkeypatch.setattr(mgr.store, "delete_tree", refuse)
    _save(mgr, 2)  # complete although step 1 could not be pruned
    assert mgr.load_latest().step == 2  # type: ignore[union-attr]
    monkeypatch.undo()
    real_writer = mgr.store.writer
    calls = {"n": 0}

    def flaky_writer(relpath: str, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreError(f"write {relpath}: connection reset")
        return real_writer(relpath, **kw)

    monkeypatch.setattr(mgr.store, "writer", flaky_writer)
    mgr.persist_async(mgr.snapshot(3, _state(3), {"epoch": 1, "world_size": 2}), urgent=False)  # fails in the background
    snap = mgr.snapshot(4, _state(4), {"epoch": 1, "world_size": 2})  # must not raise the stale failure
    mgr.persist(snap)
    assert mgr.load_latest().step == 4  # type: ignore[union-attr]


def test_an_edited_manifest_fails_its_hash(tmp_path: Path) -> None:
    """The manifest holds the state's skeleton (here the epoch): a change that keeps it valid JSON
    must still be caught."""
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=3)
    _save(mgr, 1)
    _save(mgr, 2)
    path = tmp_path / "checkpoints" / "2" / "manifest.json"
    m = json.loads(path.read_text())
    assert "manifest_sha256" in m
    m["epoch"] = 9
    path.write_text(json.dumps(m, indent=1))
    with pytest.raises(CheckpointCorrupt, match="manifest fails its sha256"):
        mgr.load(2)
    assert mgr.load_latest().step == 1  # type: ignore[union-attr]


def test_the_durable_checkpoint_size_is_measured(tmp_path: Path) -> None:
    """Issue 23: the size a move of the job carries is what the store holds (files and manifest),
    reported as the progress record's ``checkpoint_size_gb``."""
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=2)
    assert mgr.last_durable_size_gb is None
    _save(mgr, 7)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "checkpoints" / "7").iterdir())
    assert mgr.last_durable_size_gb == pytest.approx(on_disk / 1e9)
