"""Checkpoint stall and time-to-durable against state size, beside the disk's raw write bandwidth.

For each state size the same run measures (1) the raw sequential bandwidth of this directory's disk:
write the same number of bytes in 32 MiB chunks, fsync, close; (2) ``CheckpointManager``: the stall
(snapshot copy into reusable CPU buffers, what training waits for; the first, cold snapshot also
allocates the buffers) and the time until the checkpoint is durable (safetensors + sha256 + fsync
+ manifest). Targets for 1 GB: stall < 10% of time-to-durable, persist >= half the raw bandwidth.

    python benchmarks/checkpoint.py [--quick] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import torch

from runtime import CheckpointManager, make_store

MB = 1_000_000


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


def make_state(nbytes: int) -> dict[str, torch.Tensor]:
    """A model-like state: a few large and some small float32 tensors."""
    n = nbytes // 4
    sizes = [n // 4, n // 4, n // 4] + [max(1, (n - 3 * (n // 4)) // 16)] * 16
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(s, generator=g) for i, s in enumerate(sizes)}


def measure(directory: str, nbytes: int, repeats: int) -> dict[str, float]:
    state = make_state(nbytes)
    real_bytes = sum(t.numel() * t.element_size() for t in state.values())
    raw = [raw_write_s(os.path.join(directory, "raw.bin"), real_bytes) for _ in range(repeats)]
    mgr = CheckpointManager(make_store(f"file://{directory}/ckpt"), keep=1)
    stalls, durables, persists = [], [], []
    cold_stall = None
    for step in range(repeats + 1):
        t0 = time.perf_counter()
        snap = mgr.snapshot(step, {"model": state}, {"epoch": 0})
        t1 = time.perf_counter()
        mgr.persist_async(snap)
        mgr.wait()
        t2 = time.perf_counter()
        if step == 0:
            cold_stall = t1 - t0
            continue
        stalls.append(t1 - t0)
        durables.append(t2 - t0)
        persists.append(t2 - t1)
    raw_s = statistics.median(raw)
    stall = statistics.median(stalls)
    durable = statistics.median(durables)
    persist = statistics.median(persists)
    return {
        "state_mb": round(real_bytes / MB, 1), "raw_write_mb_per_s": round(real_bytes / MB / raw_s, 1),
        "stall_s": round(stall, 4), "cold_stall_s": round(cold_stall or 0.0, 4),
        "time_to_durable_s": round(durable, 4), "persist_mb_per_s": round(real_bytes / MB / persist, 1),
        "stall_fraction": round(stall / durable, 4), "persist_over_raw": round(raw_s / persist, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir under benchmarks/results)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes_mb = [1, 10, 50] if args.quick else [1, 10, 100, 1000]
    repeats = 1 if args.quick else args.repeats
    torch.set_num_threads(1)
    base = args.dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(base, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="ckpt-bench-", dir=base)
    try:
        rows = [measure(directory, mb * MB, repeats) for mb in sizes_mb]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"checkpoint: stall vs time-to-durable (median of {repeats}), directory {base}")
    print(f"{'state MB':>9}{'raw MB/s':>10}{'stall s':>9}{'cold s':>8}{'durable s':>10}{'persist MB/s':>13}"
          f"{'stall/dur':>10}{'persist/raw':>12}")
    for r in rows:
        print(f"{r['state_mb']:>9}{r['raw_write_mb_per_s']:>10}{r['stall_s']:>9}{r['cold_stall_s']:>8}"
              f"{r['time_to_durable_s']:>10}{r['persist_mb_per_s']:>13}{r['stall_fraction']:>10}{r['persist_over_raw']:>12}")
    print(json.dumps({"quick": args.quick, "rows": rows}))


if __name__ == "__main__":
    main()
