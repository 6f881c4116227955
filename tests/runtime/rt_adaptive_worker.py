"""Training script of the adaptive-batch gang tests (run as a subprocess by ``test_adaptive.py``).

A small MLP regression on a seeded synthetic set, 4 logical workers, SGD with an epoch-based StepLR.
The spec's training section comes through ``SPOTRAIN_TRAINING_JSON`` as usual. ``RT_STOP_AT``: at
exactly that step every rank checkpoints at the boundary and exits 85 (a deterministic change of
instances, unlike a notice, whose boundary depends on when it is seen). ``RT_OUT``: per-rank summary.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import runtime

SAMPLES = 512
INIT_BATCH = 16


def train(env: Mapping[str, str]) -> dict[str, Any]:
    """Train as the worker would under ``env`` (the worker protocol's variables and the RT_ knobs);
    the summary. Also called in-process by the tests, for a gang of one."""
    config = runtime.TrainerConfig.from_env(
        training=runtime.TrainingConfig(logical_workers=4, global_batch_size=INIT_BATCH, seed=3),
        epochs=int(env.get("RT_EPOCHS", "2")), progress_interval_s=0.0, noise_every_steps=1, env=env,
    )
    g = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.5 * torch.randn(SAMPLES, 1, generator=g)
    torch.manual_seed(config.training.seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    per_epoch = SAMPLES // INIT_BATCH  # an epoch-based schedule, in iterations at the initial batch
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=per_epoch, gamma=0.5)
    trainer = runtime.ElasticTrainer(model, optimizer, TensorDataset(x, y), config=config, lr_scheduler=scheduler,
                                     loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]))
    stop_at = int(env.get("RT_STOP_AT", "-1"))
    batches: set[int] = set()
    epoch_ends, code = 0, None
    for step in trainer:
        batches.add(step.batch_size)
        epoch_ends += step.epoch_end
        if step.step == stop_at:
            trainer.checkpoint(wait=True)
            trainer.close()
            code = runtime.protocol.EXIT_RESCHEDULE
            break
    if code is None:
        code = trainer.finish()
    return {"step": trainer.position.step, "code": code, "batches": sorted(batches),
            "epoch_ends": epoch_ends, "iterations": trainer.iterations.iterations,
            "scheduler_epoch": scheduler.last_epoch, "lr": optimizer.param_groups[0]["lr"],
            "plan": trainer.plan.to_json(), "chunks": trainer.plan.chunks}


def main() -> int:
    summary = train(os.environ)
    out = os.environ.get("RT_OUT")
    if out:
        with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(summary, f)
    return int(summary["code"])


if __name__ == "__main__":
    sys.exit(main())
