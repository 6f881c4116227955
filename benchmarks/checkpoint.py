"""Checkpoint stall and time-to-durable against state size, beside the disk's raw write bandwidth.

The state is a model's: four square float32 linear layers of the given total size, trained with
plain SGD (so the state is the weights). For each size, the same run measures:

1. I/O, interleaved repeat by repeat so that a shared machine's load hits both alike: the raw
   sequential bandwidth of this directory's disk (the same number of bytes in 32 MiB chunks, fsync,
   close) and ``CheckpointManager``'s persist (safetensors files + sha256 + fsync + manifest fsynced;
   pruning the previous checkpoint afterwards is not counted, nothing waits for it). Also the
   snapshot copied in full while training waits (``sync stall``), the cold stall of a first
   snapshot without ``prepare_async`` (buffer allocation and page faults; the trainer prepares the
   buffer in the background after its first step), and the time to read a checkpoint back, verified.
2. Training, the way ``ElasticTrainer`` checkpoints: forward/backward/SGD steps, a checkpoint at a
   step boundary with the weights' copy deferred (CheckFreq's pipelined snapshot), the next
   optimizer step waiting for that copy. The stall is what the training thread is blocked for
   (snapshot call + wait before the update); time-to-durable runs from the boundary to the
   manifest's fsync while training goes on. ``ckpt step +s`` is how much longer the step that
   carries the checkpoint took than the median plain step (both copy and persist compete with
   training for this machine's two cores; noisy).

Targets for 1 GB: stall < 10% of time-to-durable, persist >= half the raw bandwidth.

    python benchmarks/checkpoint.py [--quick] [--sizes-mb 1 10 100 1000] [--repeats 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runtime import CheckpointManager, make_store

MB = 1_000_000
LAYERS = 4


def raw_write_s(path: str, nbytes: int) -> float:
    chunk = os.urandom(1 << 20) * 32
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, memoryview(chunk)[: min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - t0
    os.unlink(path)
    return elapsed


def make_model(nbytes: int) -> nn.Module:
    d = max(64, 64 * round(math.sqrt(nbytes / 4 / LAYERS) / 64))
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(LAYERS)])


def state_of(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def measure_io(directory: str, model: nn.Module, opt: torch.optim.Optimizer, repeats: int) -> dict[str, Any]:
    state = state_of(model, opt)
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values())
    cold = CheckpointManager(make_store(f"file://{directory}/cold"), keep=1)
    t0 = time.perf_counter()
    cold.snapshot(0, state, {"epoch": 0})
    cold_stall = time.perf_counter() - t0
    del cold
    mgr = CheckpointManager(make_store(f"file://{directory}/io"), keep=1)
    mgr.prepare_async(state)
    mgr.wait()
    raw, stalls, persists, loads = [], [], [], []
    for step in range(1, repeats + 1):
        raw.append(raw_write_s(os.path.join(directory, "raw.bin"), nbytes))
        t0 = time.perf_counter()
        snap = mgr.snapshot(step, state, {"epoch": 0})
        stalls.append(time.perf_counter() - t0)
        t1_unix = time.time()
        mgr.persist_async(snap)
        mgr.wait()
        assert mgr.last_durable_unix_s is not None
        persists.append(mgr.last_durable_unix_s - t1_unix)
        loaded = mgr.load(step)
        assert mgr.last_load_s is not None
        assert all(torch.equal(loaded.state["model"][k], v) for k, v in state["model"].items())
        loads.append(mgr.last_load_s)
    files = os.listdir(os.path.join(directory, "io", "checkpoints", str(repeats)))
    return {
        "state_mb": round(nbytes / MB, 1), "files": sum(f.endswith(".safetensors") for f in files),
        "raw_write_mb_per_s": round(nbytes / MB / statistics.median(raw), 1),
        "persist_mb_per_s": round(nbytes / MB / statistics.median(persists), 1),
        "persist_over_raw": round(statistics.median(r / p for r, p in zip(raw, persists)), 3),
        "sync_stall_s": round(statistics.median(stalls), 4), "cold_stall_s": round(cold_stall, 4),
        "load_s": round(statistics.median(loads), 4),
    }


def measure_training(directory: str, model: nn.Module, opt: torch.optim.Optimizer, repeats: int) -> dict[str, Any]:
    d = model[0].in_features
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, d, generator=g), torch.randn(4, d, generator=g)
    mgr = CheckpointManager(make_store(f"file://{directory}/train"), keep=1)
    defer = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def forward_backward() -> None:
        opt.zero_grad(set_to_none=False)
        F.mse_loss(model(x), y).backward()

    forward_backward()
    opt.step()
    mgr.prepare_async(state_of(model, opt))  # as the trainer does after its first step
    mgr.wait()
    plain, with_ckpt, stalls, durables = [], [], [], []
    for step in range(1, repeats + 1):
        for _ in range(2):  # plain steps between checkpoints
            t0 = time.perf_counter()
            forward_backward()
            opt.step()
            plain.append(time.perf_counter() - t0)
        t0, t0_unix = time.perf_counter(), time.time()
        snap = mgr.snapshot(step, state_of(model, opt), {"epoch": 0}, defer=defer)
        stall = time.perf_counter() - t0
        mgr.persist_async(snap, urgent=False)
        forward_backward()
        stall += mgr.wait_copied()
        opt.step()
        with_ckpt.append(time.perf_counter() - t0)
        stalls.append(stall)
        while mgr.in_flight:  # training goes on until the checkpoint is durable
            forward_backward()
            mgr.wait_copied()
            opt.step()
        mgr.wait()
        assert mgr.last_durable_unix_s is not None
        durables.append(mgr.last_durable_unix_s - t0_unix)
    return {
        "step_s": round(statistics.median(plain), 4),
        "stall_s": round(statistics.median(stalls), 4),
        "time_to_durable_s": round(statistics.median(durables), 4),
        "stall_fraction": round(statistics.median(s / d_ for s, d_ in zip(stalls, durables)), 4),
        "ckpt_step_extra_s": round(statistics.median(with_ckpt) - statistics.median(plain), 4),
    }


def measure(base: str, nbytes: int, repeats: int) -> dict[str, Any]:
    directory = os.path.join(base, f"{nbytes // MB}mb")  # one store per size: steps restart at 1
    os.makedirs(directory)
    model = make_model(nbytes)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    return {**measure_io(directory, model, opt, repeats), **measure_training(directory, model, opt, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--dir", default=None,
                        help="directory on the disk to measure (default: a temp dir under benchmarks/results)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 10, 100, 1000])
    args = parser.parse_args()
    sizes_mb = [1, 10, 50] if args.quick else args.sizes_mb
    repeats = 1 if args.quick else args.repeats
    torch.set_num_threads(1)
    base = args.dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(base, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="ckpt-bench-", dir=base)
    try:
        rows = [measure(directory, mb * MB, repeats) for mb in sizes_mb]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"checkpoint I/O (median of {repeats}, interleaved with raw writes), directory {base}")
    print(f"{'state MB':>9}{'files':>6}{'raw MB/s':>10}{'persist MB/s':>13}{'persist/raw':>12}"
          f"{'sync stall s':>13}{'cold s':>8}{'load s':>8}")
    for r in rows:
        print(f"{r['state_mb']:>9}{r['files']:>6}{r['raw_write_mb_per_s']:>10}{r['persist_mb_per_s']:>13}"
              f"{r['persist_over_raw']:>12}{r['sync_stall_s']:>13}{r['cold_stall_s']:>8}{r['load_s']:>8}")
    print(f"checkpoints while training (pipelined snapshot; median of {repeats})")
    print(f"{'state MB':>9}{'step s':>9}{'stall s':>9}{'durable s':>10}{'stall/dur':>10}{'ckpt step +s':>13}")
    for r in rows:
        print(f"{r['state_mb']:>9}{r['step_s']:>9}{r['stall_s']:>9}{r['time_to_durable_s']:>10}"
              f"{r['stall_fraction']:>10}{r['ckpt_step_extra_s']:>13}")
    print(json.dumps({"quick": args.quick, "repeats": repeats, "rows": rows}))


if __name__ == "__main__":
    main()
