"""A tiny training script for the runtime's multi-process tests (run as a subprocess).

A small MLP with BatchNorm and dropout on a synthetic, seeded dataset. Knobs (env):
RT_MAX_STEPS, RT_STEP_SLEEP_S (slow steps down so a test can act mid-run),
RT_NOTICE_AT_STEP (this rank writes its own notice file after that step: a notice that only one
rank sees, at an arbitrary moment), RT_NOTICE_REASON, RT_OUT (directory for a per-rank JSON summary).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import runtime


def main() -> int:
    config = runtime.TrainerConfig.from_env(
        training=runtime.TrainingConfig(logical_workers=4, global_batch_size=32, seed=7),
        max_steps=int(os.environ.get("RT_MAX_STEPS", "20")), progress_interval_s=0.0,
    )
    if os.environ.get("RT_BUCKET_BYTES"):  # many small all-reduce buckets (fast mode's overlap)
        from runtime import reducer

        reducer.FIRST_BUCKET_BYTES = reducer.BUCKET_BYTES = int(os.environ["RT_BUCKET_BYTES"])
    g = torch.Generator().manual_seed(123)
    x = torch.randn(200, 10, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long()
    torch.manual_seed(config.training.seed)
    model = nn.Sequential(nn.Linear(10, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return F.cross_entropy(m(xb + 0.05 * torch.randn_like(xb)), yb)

    trainer = runtime.ElasticTrainer(model, optimizer, TensorDataset(x, y), loss_fn=loss_fn, config=config,
                                     lr_scheduler=scheduler)
    notice_at = int(os.environ.get("RT_NOTICE_AT_STEP", "-1"))
    sleep_s = float(os.environ.get("RT_STEP_SLEEP_S", "0"))
    between = None
    for step in trainer:
        between = torch.rand(1).item()  # a draw between steps (evaluation, augmentation set-up ...)
        if sleep_s:
            time.sleep(sleep_s)
        if step.step == notice_at and config.notices.notice_file:
            with open(config.notices.notice_file, "w") as f:
                json.dump({"reason": os.environ.get("RT_NOTICE_REASON", "preemption"),
                           "deadline_unix_s": time.time() + 2}, f)
    code = trainer.finish()
    out = os.environ.get("RT_OUT")
    if out:
        with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump({"step": trainer.position.step, "code": code, "resumed_from": trainer.resumed_from,
                       "world_size": trainer.ctx.world_size, "between_draw": between}, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
