"""What a changeover is made of: sharded parallel checkpoints, zero-copy verified loading, the
prepared snapshot buffer, the timeline, the fast worker exit and the overlapped all-reduce buckets."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load

import runtime.serialization as ser
from runtime import CheckpointManager, make_store, protocol
from runtime.dist import DistContext
from runtime.errors import CheckpointCorrupt, StateError
from runtime.reducer import GradientReducer
from runtime.timeline import Timeline, process_start_unix_s, read_timeline

REPO = Path(__file__).resolve().parents[2]


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"model": {f"w{i}": torch.randn(64, generator=g) for i in range(6)} | {
        "b": torch.ones(3, dtype=torch.bfloat16), "n": torch.tensor(7), "flag": torch.tensor([True, False]),
        "d": torch.tensor([1.5], dtype=torch.float64)}, "pos": {"step": 3}}


def test_large_state_is_written_as_parallel_shards_and_loads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ser, "MIN_SHARD_BYTES", 256)
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=2)
    state = _state()
    mgr.persist(mgr.snapshot(3, state, {"epoch": 0}))
    files = json.loads((tmp_path / "checkpoints" / "3" / "manifest.json").read_text())["files"]
    assert len(files) == ser.MAX_SHARDS and all(f.startswith("state-") for f in files)
    names: set[str] = set()
    for f in files:  # every shard is a standard safetensors file
        part = st_load((tmp_path / "checkpoints" / "3" / f).read_bytes())
        assert not names & set(part)
        names |= set(part)
    assert names == {f"state/model/{k}" for k in state["model"]}
    loaded = mgr.load(3)
    for k, t in state["model"].items():
        assert loaded.state["model"][k].dtype == t.dtype and torch.equal(loaded.state["model"][k], t), k
    # one damaged shard is enough to reject the checkpoint
    victim = tmp_path / "checkpoints" / "3" / sorted(files)[2]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x10
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match="sha256"):
        mgr.load(3)


def test_layout_keeps_every_tensor_aligned_for_its_dtype() -> None:
    tensors = {"a_bool": torch.tensor([True]), "b_f32": torch.ones(3), "c_i64": torch.arange(3),
               "d_bf16": torch.ones(5, dtype=torch.bfloat16), "e_u8": torch.ones(1, dtype=torch.uint8)}
    layout = ser.plan_layout(tensors)
    for name, t in tensors.items():
        assert layout.offsets[name] % t.element_size() == 0, name
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    views = ser.buffer_views(layout, buf, tensors)
    for name, t in tensors.items():
        views[name].copy_(t)
        assert views[name].data_ptr() - buf.data_ptr() == layout.offsets[name]


def test_parser_rejects_malformed_files_and_copes_with_misaligned_ones() -> None:
    def blob(header: dict, data: bytes) -> bytes:
        head = json.dumps(header).encode()
        return struct.pack("<Q", len(head)) + head + data

    # written by some other tool: a float32 at an odd offset is still read correctly (copied)
    raw = blob({"u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                "f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}, b"\x05" + struct.pack("<2f", 1.5, -2.0))
    out = ser.read_safetensors(raw)
    assert out["u"].tolist() == [5] and out["f"].tolist() == [1.5, -2.0]
    bad = [
        b"\x01",
        struct.pack("<Q", 1000) + b"{}",
        blob({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8),  # size mismatch
        blob({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4),  # beyond the data
        blob({"x": {"dtype": "Q99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        struct.pack("<Q", 3) + b"{{{",
    ]
    for data in bad:
        with pytest.raises(StateError):
            ser.read_safetensors(data)


def test_prepared_buffer_is_reused_and_a_new_shape_replans(tmp_path: Path) -> None:
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=1)
    state = {"w": torch.randn(1000), "m": torch.zeros(10, dtype=torch.float64)}
    mgr.prepare_async(state)
    mgr.wait()
    prepared = mgr._buffer
    assert prepared is not None and prepared.numel() == 1000 * 4 + 10 * 8
    snap = mgr.snapshot(1, state, {})
    assert snap.buffer is prepared
    mgr.persist(snap)
    grown = {"w": torch.randn(1000), "m": torch.zeros(10, dtype=torch.float64), "extra": torch.ones(4)}
    snap = mgr.snapshot(2, grown, {})
    assert snap.buffer is not prepared
    mgr.persist(snap)
    assert torch.equal(mgr.load(2).state["extra"], torch.ones(4))
    assert torch.equal(mgr.load(2).state["w"], grown["w"])


def test_timeline_appends_events_and_knows_when_the_process_started(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "timeline.jsonl"
    tl = Timeline(str(path), attempt=3)
    tl.mark("notice_seen", once=True, step=5)
    tl.mark("notice_seen", once=True, step=6)
    tl.mark("durable", t_unix_s=123.0, step=5)
    Timeline(None, attempt=1).mark("ignored")
    with open(path, "a") as f:
        f.write('{"event": "torn')
    events = read_timeline(str(path))
    assert [(e["event"], e["step"], e["attempt"]) for e in events] == [("notice_seen", 5, 3), ("durable", 5, 3)]
    assert events[1]["t_unix_s"] == 123.0
    started = process_start_unix_s()
    assert started is not None and time.time() - 3600 < started <= time.time()


@pytest.mark.parametrize("code", [protocol.EXIT_RESCHEDULE, protocol.EXIT_DONE])
def test_exit_worker_ends_fast_after_a_stop_and_normally_otherwise(code: int) -> None:
    script = ("import atexit, runtime\n"
              "atexit.register(lambda: print('atexit ran', flush=True))\n"
              "print('before exit', end='')\n"
              f"runtime.exit_worker({code})\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == code
    assert proc.stdout.startswith("before exit")  # flushed even on the fast path
    assert ("atexit ran" in proc.stdout) == (code == protocol.EXIT_DONE)


def test_fast_mode_buckets_cover_the_gradient_in_reverse_order() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(600, 600), torch.nn.ReLU(), torch.nn.Linear(600, 600),
                                torch.nn.ReLU(), torch.nn.Linear(600, 10))
    ctx = DistContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    reducer = GradientReducer(model, ctx, logical_ids=range(0, 1), logical_workers=2, mode="fast")
    assert reducer.overlap
    buckets = reducer._buckets
    assert buckets[0][1] == reducer.T + reducer.P and buckets[-1][0] == 0  # the last one carries the tail
    assert all(a[0] == b[1] for a, b in zip(buckets, buckets[1:]))  # contiguous, last layer first
    assert (buckets[0][1] - buckets[0][0]) * 4 >= 1 << 20  # DDP's 1 MB first bucket
    assert len(buckets) == 2
    bitwise = GradientReducer(model, ctx, logical_ids=range(0, 1), logical_workers=2, mode="bitwise")
    assert not bitwise.overlap


def test_deferred_copy_runs_before_the_persist_and_wait_copied_guards_the_weights(tmp_path: Path) -> None:
    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=2)
    w, b = torch.ones(1000), torch.zeros(10)
    snap = mgr.snapshot(1, {"w": w, "b": b}, {}, defer={w.untyped_storage().data_ptr()})
    assert len(snap.pending) == 1 and not snap.copied.is_set()
    b.add_(1.0)  # not deferred: copied during the call
    mgr.persist_async(snap)
    assert mgr.wait_copied() >= 0.0 and snap.copied.is_set()
    w.add_(1.0)  # the optimizer step, after waiting
    mgr.wait()
    loaded = mgr.load(1)
    assert torch.equal(loaded.state["w"], torch.ones(1000)) and torch.equal(loaded.state["b"], torch.zeros(10))
    # a snapshot never handed to persist_async is completed by wait_copied itself
    snap = mgr.snapshot(2, {"w": w}, {}, defer={w.untyped_storage().data_ptr()})
    mgr.wait_copied()
    assert snap.copied.is_set() and torch.equal(snap.tensors["state/w"], w)


def test_prefetched_checkpoint_is_used_once_for_its_step_only(tmp_path: Path) -> None:
    from runtime.checkpoint import _prefetches

    mgr = CheckpointManager(make_store(f"file://{tmp_path}"), keep=3)
    for step in (1, 2):
        mgr.persist(mgr.snapshot(step, {"w": torch.full((8,), float(step))}, {}))
    runtime_prefetch = __import__("runtime").prefetch_checkpoint
    config = __import__("runtime").TrainerConfig(checkpoint=__import__("runtime").CheckpointConfig(uri=f"file://{tmp_path}"),
                                                 max_steps=1)
    runtime_prefetch(config)
    _prefetches[f"file://{tmp_path}"][0].join()
    (tmp_path / "checkpoints" / "2" / "state.safetensors").write_bytes(b"gone")  # read already
    assert torch.equal(mgr.load_latest().state["w"], torch.full((8,), 2.0))  # type: ignore[union-attr]
    assert mgr.last_load_prefetched is True and mgr.last_load_s is not None
    with pytest.raises(CheckpointCorrupt):  # the prefetch is used once; now the damage shows
        mgr.load(2)
    runtime_prefetch(config)  # skips the damaged step 2 (a reader deletes nothing): step 1
    assert mgr.load(1).step == 1 and mgr.last_load_prefetched is True
    runtime_prefetch(config)
    _prefetches[f"file://{tmp_path}"][0].join()
    mgr.persist(mgr.snapshot(3, {"w": torch.full((8,), 3.0)}, {}))
    assert torch.equal(mgr.load(3).state["w"], torch.full((8,), 3.0))  # newer than the read-ahead
    assert mgr.last_load_prefetched is False
    assert f"file://{tmp_path}" not in _prefetches  # the stale read-ahead is dropped
