"""Steady-state step time of the runtime against a plain PyTorch DDP loop (2 gloo processes).

One gang of two processes runs the same model, data and per-worker batch under (1)
``DistributedDataParallel``, (2) ``ElasticTrainer`` in ``fast`` mode and (3) in ``bitwise`` mode,
with one logical worker per physical worker, all three live in the same processes and interleaved
in blocks of a few steps (the order rotating from block to block). Each block's ratios are taken
within a second or so, so the load of a shared machine hits the three loops alike; the figures are
medians over blocks, with the interquartile range of the per-block ratio. Target: fast within 5% of
DDP; bitwise overhead reported.

    python benchmarks/runtime_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterator

WORLD = 2


def _model():  # type: ignore[no-untyped-def]
    from torch import nn

    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Dropout(0.1), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def _data(n: int):  # type: ignore[no-untyped-def]
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g))


def _ddp_steps(steps: int, per_worker: int) -> Iterator[None]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x_all, y_all = _data(per_worker * WORLD * (steps + 1)).tensors
    perm = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(1))
    for step in range(steps):
        idx = perm[(step * WORLD + rank) * per_worker : (step * WORLD + rank + 1) * per_worker]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
        yield


def _runtime_steps(mode: str, steps: int, per_worker: int, ckpt_dir: str) -> Iterator[None]:
    import torch
    import torch.nn.functional as F

    import runtime

    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    config = runtime.TrainerConfig(
        training=runtime.TrainingConfig(logical_workers=WORLD, global_batch_size=per_worker * WORLD, determinism=mode),
        checkpoint=runtime.CheckpointConfig(uri=f"file://{ckpt_dir}/{mode}", interval_s=1e9),
        notices=runtime.NoticeConfig(handle_sigterm=False),
        max_steps=steps, progress_interval_s=1e9,
    )
    trainer = runtime.ElasticTrainer(model, opt, _data(per_worker * WORLD * (steps + 1)),
                                     loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]), config=config)
    for _ in trainer:
        yield
    trainer.finish()
    yield


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(False)
    dist.init_process_group("gloo")
    steps = args.warmup + args.blocks * args.block
    results: dict[str, list[float]] = {"ddp": [], "fast": [], "bitwise": []}
    with tempfile.TemporaryDirectory() as ckpt_dir:
        loops = {"ddp": _ddp_steps(steps, args.batch), "fast": _runtime_steps("fast", steps, args.batch, ckpt_dir),
                 "bitwise": _runtime_steps("bitwise", steps, args.batch, ckpt_dir)}
        for it in loops.values():
            for _ in range(args.warmup):
                next(it)
        names = list(loops)
        for b in range(args.blocks):
            for name in names[b % 3 :] + names[: b % 3]:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(args.block):
                    next(loops[name])
                dist.barrier()
                results[name].append((time.perf_counter() - t0) / args.block)
        for name in ("fast", "bitwise"):
            next(loops[name], None)  # finish(): final weights, like a real run
    if dist.get_rank() == 0:
        print(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps of each loop first")
    parser.add_argument("--block", type=int, default=10, help="steps per timed block")
    parser.add_argument("--blocks", type=int, default=45, help="timed blocks per loop")
    parser.add_argument("--batch", type=int, default=64, help="samples per physical worker per step")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.block, args.blocks = 3, 4, 3
    if args.child:
        return child(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--warmup", str(args.warmup), "--block",
            str(args.block), "--blocks", str(args.blocks), "--batch", str(args.batch)]
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("benchmark workers failed")
    results = json.loads(outs[0].strip().splitlines()[-1])
    ddp = statistics.median(results["ddp"])
    fast = statistics.median(results["fast"])
    bitwise = statistics.median(results["bitwise"])
    fast_ratios = [f / d for f, d in zip(results["fast"], results["ddp"])]
    bit_ratios = [b / d for b, d in zip(results["bitwise"], results["ddp"])]
    print(f"runtime overhead: {WORLD} gloo processes, {args.batch} samples/worker/step, "
          f"{args.blocks} interleaved blocks of {args.block} timed steps per loop")
    def iqr(xs: list[float]) -> str:
        if len(xs) < 4:
            return f"{min(xs):.3f}-{max(xs):.3f}"
        q = statistics.quantiles(xs, n=4)
        return f"{q[0]:.3f}-{q[2]:.3f}"

    print(f"{'loop':<10}{'step ms (median)':>18}{'ratio to DDP':>16}{'ratio IQR':>16}")
    print(f"{'DDP':<10}{ddp * 1e3:>18.2f}{1.0:>16.3f}{'':>16}")
    print(f"{'fast':<10}{fast * 1e3:>18.2f}{statistics.median(fast_ratios):>16.3f}{iqr(fast_ratios):>16}")
    print(f"{'bitwise':<10}{bitwise * 1e3:>18.2f}{statistics.median(bit_ratios):>16.3f}{iqr(bit_ratios):>16}")
    print(json.dumps({
        "world_size": WORLD, "per_worker_batch": args.batch, "blocks": args.blocks, "block_steps": args.block,
        "quick": args.quick,
        "ddp_step_ms": round(ddp * 1e3, 3), "fast_step_ms": round(fast * 1e3, 3),
        "bitwise_step_ms": round(bitwise * 1e3, 3),
        "fast_over_ddp": round(statistics.median(fast_ratios), 4),
        "bitwise_over_ddp": round(statistics.median(bit_ratios), 4),
        "fast_over_ddp_iqr": iqr(fast_ratios), "bitwise_over_ddp_iqr": iqr(bit_ratios),
    }))


if __name__ == "__main__":
    main()
