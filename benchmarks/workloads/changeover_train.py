"""Training script for ``benchmarks/changeover.py``: a stack of square linear layers whose checkpoint
is ``CHANGEOVER_STATE_MB`` megabytes (float32 weights, plain SGD, so the state is the model).

Runs under the local cloud like any job (``ElasticTrainer``, settings from the environment).
``CHANGEOVER_STEP_S`` pads each step to at least that long, so that a tiny model's run lasts
long enough for a notice to land in the middle of it. The script adds two moments of its own to
the runtime's timeline, ``imports_done`` and ``model_built``, so that the benchmark can split a
worker's start into interpreter + imports, model construction and the trainer's own start.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import runtime  # noqa: E402
from runtime.timeline import Timeline  # noqa: E402

IMPORTS_DONE_UNIX_S = time.time()
LAYERS = 4


def width_for(state_mb: float) -> int:
    """Layer width (a multiple of 64) so that LAYERS square float32 layers hold ``state_mb`` MB."""
    return max(64, 64 * round(math.sqrt(state_mb * 1e6 / 4 / LAYERS) / 64))


def main() -> int:
    state_mb = float(os.environ.get("CHANGEOVER_STATE_MB", "1"))
    steps = int(os.environ.get("CHANGEOVER_STEPS", "12"))
    min_step_s = float(os.environ.get("CHANGEOVER_STEP_S", "0"))  # pads fast steps (small states)
    config = runtime.TrainerConfig.from_env(
        training=runtime.TrainingConfig(logical_workers=1, global_batch_size=4, determinism="fast"),
        max_steps=steps)
    runtime.prefetch_checkpoint(config)  # a replacement reads its checkpoint while it builds the model
    timeline = Timeline(config.timeline_file if os.environ.get("RANK", "0") == "0" else None,
                        attempt=config.attempt)
    timeline.mark("imports_done", t_unix_s=IMPORTS_DONE_UNIX_S)
    d = width_for(state_mb)
    torch.manual_seed(config.training.seed)
    model = nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(LAYERS)])
    timeline.mark("model_built", width=d, state_bytes=LAYERS * d * d * 4)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, d, generator=g), torch.randn(64, d, generator=g))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    trainer = runtime.ElasticTrainer(model, optimizer, data, config=config,
                                     loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]))
    for step in trainer:
        if step.step_time_s < min_step_s:
            time.sleep(min_step_s - step.step_time_s)
        if config.log_every_steps and step.step % config.log_every_steps == 0:
            print(f"step {step.step} loss {step.loss:.4f} {step.step_time_s * 1e3:.0f} ms", flush=True)
    return trainer.finish()


if __name__ == "__main__":
    runtime.exit_worker(main())
