"""Co-adaptation on a live job (issue 20, item 4): a compute-heavy MLP whose gang the controller grows
and shrinks as spot capacity comes and goes, with the batch and learning rate of each gang set by the
controller's directive (``SPOTRAIN_BATCH_JSON``: ``batch`` events with ``source=controller``).

Compute-heavy on purpose: a small convolutional net (~20k parameters, an 80 KB all-reduce per step)
that spends ~18 MFLOP per sample, so that on a 2-core machine two one-thread workers train faster than
one (docs/goodput.md, "Co-adaptation on a live job": the measured figures). The data are generated
here from the seed (four 5x5 patterns at random places in noise, labels with noise), no downloads.

Runs under spotrain (``spotrain run examples/coadapt/job.yaml --scenario
examples/coadapt/scenarios/capacity.yaml``), under ``torchrun --nproc_per_node=2 train.py`` and as
``python train.py``; without a controller the runtime chooses its own batch and says so.
``COADAPT_EPOCHS`` sets the length (scale-invariant epochs at the initial batch).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import runtime

EPOCHS = int(os.environ.get("COADAPT_EPOCHS", "3"))
TRAIN = int(os.environ.get("COADAPT_TRAIN_EXAMPLES", "4096"))
DEFAULTS = runtime.TrainingConfig(logical_workers=4, global_batch_size=64, batch_policy="adaptive",
                                  lr_scaling="adascale", max_batch_size=1024, seed=0)
SIDE, CHANNELS, CLASSES, TEST, LABEL_NOISE = 16, 32, 4, 512, 0.2


def blobs(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """16x16 one-channel images: a class's pattern (one of four random 5x5 stamps) at a random place,
    in Gaussian noise; a share of the labels replaced by random classes. A pure function of the seed."""
    g = torch.Generator().manual_seed(30_000 + seed)
    n = TRAIN + TEST
    stamps = torch.randn(CLASSES, 5, 5, generator=g)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    images = 0.5 * torch.randn(n, 1, SIDE, SIDE, generator=g)
    rows, cols = torch.randint(0, SIDE - 5, (2, n), generator=g)
    for i in range(n):
        r, c = int(rows[i]), int(cols[i])
        images[i, 0, r:r + 5, c:c + 5] += stamps[labels[i]]
    noisy = torch.rand(n, generator=g) < LABEL_NOISE
    labels = torch.where(noisy, torch.randint(0, CLASSES, (n,), generator=g), labels)
    return TensorDataset(images[:TRAIN], labels[:TRAIN]), TensorDataset(images[TRAIN:], labels[TRAIN:])


def convnet() -> nn.Module:
    """~20k parameters (an 80 KB all-reduce) for ~18 MFLOP per sample forward and backward: the
    weights are shared across the image, so compute outweighs communication."""
    return nn.Sequential(
        nn.Conv2d(1, CHANNELS, 3, padding=1), nn.ReLU(),
        nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(CHANNELS, CLASSES))


def cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def main() -> int:
    config = runtime.TrainerConfig.from_env(training=DEFAULTS, epochs=EPOCHS)
    torch.manual_seed(config.training.seed)
    model = convnet()  # the same initial weights on every rank, from the seed
    train_set, test_set = blobs(config.training.seed)
    trainer = runtime.ElasticTrainer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), train_set,
                                     loss_fn=cross_entropy, config=config)
    for step in trainer:
        if step.epoch_end:
            with torch.no_grad():
                model.eval()
                acc = float((model(test_set.tensors[0]).argmax(dim=1) == test_set.tensors[1]).float().mean())
            if trainer.is_rank0:
                trainer.report(metric=acc, metric_name="test_accuracy")
                print(f"epoch {step.epoch}  step {step.step}/{step.total_steps}  batch {step.batch_size}  "
                      f"lr x{trainer.lr_factor():.2f}  loss {step.loss:.4f}  test_accuracy {acc:.4f}", flush=True)
    return trainer.finish()


if __name__ == "__main__":
    runtime.exit_worker(main())
