"""Adaptive batch size: an MLP learns a random teacher's 10-way labels (with label noise),
on data generated in this script from the seed (no downloads), with ``batch_policy: adaptive``.

Why batch size matters here: the labels are noisy, so the gradient noise scale is large early in
training and a small batch wastes little; as the loss falls the signal shrinks relative to the noise
and larger batches stay efficient, so the goodput-optimal batch grows with the GPUs the job holds.
At each change of instances the runtime takes the controller's batch (or picks one from its own
profile with Pollux's goodput optimizer), scales the learning rate by the AdaScale gain, and counts
progress in scale-invariant iterations, so the cosine schedule below (written in iterations at the
initial batch) and the epoch count stay right whatever the batch does.

Runs under spotrain (``spotrain run examples/adaptive/job.yaml``), under plain
``torchrun --nproc_per_node=2 train.py`` and as ``python train.py``. ``ADAPTIVE_EPOCHS`` sets the
schedule's length; ``ADAPTIVE_TARGET`` is the test accuracy the run reports reaching, and with
``ADAPTIVE_STOP_AT_TARGET=1`` the job ends there (it trains to a target, as Pollux's jobs do:
benchmarks/adaptive.py compares the GPU-seconds each batch policy needs to get there).
``ADAPTIVE_LR`` is the learning rate at the spec's batch (default 0.1, the user's).
"""

from __future__ import annotations

import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import runtime

EPOCHS = int(os.environ.get("ADAPTIVE_EPOCHS", "10"))
TARGET = float(os.environ.get("ADAPTIVE_TARGET", "0.72"))
STOP_AT_TARGET = os.environ.get("ADAPTIVE_STOP_AT_TARGET", "0") == "1"
# Test accuracy is evaluated this many times per epoch, at equal scale-invariant progress whatever
# the batch, so that both batch policies are judged at the same points.
EVALS_PER_EPOCH = int(os.environ.get("ADAPTIVE_EVALS_PER_EPOCH", "1"))
DEFAULTS = runtime.TrainingConfig(logical_workers=8, global_batch_size=64, batch_policy="adaptive",
                                  lr_scaling="adascale", max_batch_size=1024, max_local_batch_size=64, seed=0)
FEATURES, CLASSES, TEST, LABEL_NOISE = 32, 10, 4096, 0.15
TRAIN = int(os.environ.get("ADAPTIVE_TRAIN_EXAMPLES", "16384"))  # more: training outweighs start-up
# The learning rate at ``global_batch_size`` (SGD with momentum 0.9). A fixed-batch run at another
# batch sets its own (benchmarks/adaptive.py sweeps it); AdaScale scales it from there.
LR = float(os.environ.get("ADAPTIVE_LR", "0.1"))


def teacher_data(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Inputs ~ N(0, I); labels from a fixed random two-layer teacher, a share of them replaced by
    random classes. A pure function of the seed."""
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(TRAIN + TEST, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ w + 0.5 * (x[:, :CLASSES] * x[:, CLASSES:2 * CLASSES])).argmax(dim=1)
    flip = torch.rand(len(y), generator=g) < LABEL_NOISE
    y = torch.where(flip, torch.randint(0, CLASSES, (len(y),), generator=g), y)
    return TensorDataset(x[:TRAIN], y[:TRAIN]), TensorDataset(x[TRAIN:], y[TRAIN:])


def student() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, CLASSES))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    x, y = data.tensors
    return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> int:
    config = runtime.TrainerConfig.from_env(training=DEFAULTS, epochs=EPOCHS)
    train_set, test_set = teacher_data(config.training.seed)
    torch.manual_seed(config.training.seed)
    model = student()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    iterations = EPOCHS * (len(train_set) // config.training.global_batch_size)  # at the initial batch
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=iterations)
    trainer = runtime.ElasticTrainer(model, optimizer, train_set, loss_fn=loss_fn, config=config,
                                     lr_scheduler=scheduler)
    every = iterations / EPOCHS / max(EVALS_PER_EPOCH, 1)  # scale-invariant iterations between evaluations
    reached, evaluated = False, None
    for step in trainer:
        due = math.floor(trainer.iterations.iterations / every + 1e-9)
        if evaluated is None:  # the first step of this process (a resumed one included)
            evaluated = due
        if not step.epoch_end and due <= evaluated:
            continue
        evaluated = due
        # Every rank evaluates (the replicas' weights are identical), so all agree on stopping.
        acc = accuracy(model, test_set)
        if trainer.is_rank0:
            trainer.report(metric=acc, metric_name="test_accuracy")
            if acc >= TARGET and not reached:
                print(f"reached test_accuracy {TARGET} at {time.time():.3f} (unix s), step {step.step}", flush=True)
            label = "epoch" if step.epoch_end else "eval "
            print(f"{label} {due / max(EVALS_PER_EPOCH, 1):5.2f}  step {step.step:5d}/{step.total_steps}  "
                  f"batch {step.batch_size:4d}  lr x{trainer.lr_factor():.2f}  loss {step.loss:.4f}  "
                  f"test_accuracy {acc:.4f}", flush=True)
        reached = reached or acc >= TARGET
        if reached and STOP_AT_TARGET:
            trainer.end_early()
    return trainer.finish()


if __name__ == "__main__":
    runtime.exit_worker(main())
