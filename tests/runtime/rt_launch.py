"""Launch ``rt_worker.py`` (or any script) as a gang of real torch.distributed (gloo) processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from safetensors.torch import load_file

WORKER = Path(__file__).with_name("rt_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GangResult:
    codes: list[int]
    outputs: list[str]
    summaries: list[dict]


def start(world: int, env: dict[str, str], *, per_rank: Callable[[int], dict[str, str]] | None = None,
          script: Path = WORKER) -> list[subprocess.Popen[str]]:
    port = free_port()
    procs = []
    for rank in range(world):
        e = {**os.environ, **env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
             "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        e.update(per_rank(rank) if per_rank else {})
        procs.append(subprocess.Popen([sys.executable, str(script)], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def wait(procs: list[subprocess.Popen[str]], out_dir: Path | None = None, timeout: float = 120) -> GangResult:
    outputs, codes = [], []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outputs.append(o)
        codes.append(p.returncode)
    summaries = []
    if out_dir is not None:
        for rank in range(len(procs)):
            f = out_dir / f"rank{rank}.json"
            summaries.append(json.loads(f.read_text()) if f.exists() else {})
            if f.exists():
                f.unlink()
    return GangResult(codes, outputs, summaries)


def run(world: int, env: dict[str, str], out_dir: Path, **kw: object) -> GangResult:
    return wait(start(world, {**env, "RT_OUT": str(out_dir)}, **kw), out_dir)  # type: ignore[arg-type]


def final_tensors(ckpt_root: Path) -> dict:
    return load_file(str(ckpt_root / "final" / "model.safetensors"))
