"""Quickstart: a small CNN with dropout on scikit-learn's handwritten digits, trained elastically.

Runs under spotrain (the controller sets the SPOTRAIN_* environment), under plain
``torchrun --nproc_per_node=2 train.py`` and as ``python train.py``. In bitwise mode the final
weights are bitwise identical whatever the number of workers and however many preemptions happened.
``QUICKSTART_EPOCHS`` shortens the run (tests).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

import runtime

EPOCHS = int(os.environ.get("QUICKSTART_EPOCHS", "60"))
DEFAULTS = runtime.TrainingConfig(logical_workers=8, global_batch_size=128, seed=0, determinism="bitwise")


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.drop = nn.Dropout(0.3)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.drop(torch.flatten(x, 1))
        return self.fc2(self.drop(F.relu(self.fc1(x))))


def digits(seed: int) -> tuple[TensorDataset, TensorDataset]:
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(range(len(y)), test_size=0.2, random_state=seed, stratify=data.target)
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[test_idx], y[test_idx])


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    shift = torch.randint(-1, 2, (2,))  # augmentation: drawn from this logical worker's own stream
    x = torch.roll(x, shifts=(int(shift[0]), int(shift[1])), dims=(2, 3))
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    x, y = data.tensors
    return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> int:
    config = runtime.TrainerConfig.from_env(training=DEFAULTS, epochs=EPOCHS)
    train_set, test_set = digits(config.training.seed)
    torch.manual_seed(config.training.seed)
    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = EPOCHS * (len(train_set) // config.training.global_batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    trainer = runtime.ElasticTrainer(model, optimizer, train_set, loss_fn=loss_fn, config=config,
                                     lr_scheduler=scheduler)
    for step in trainer:
        if step.epoch_end and trainer.is_rank0:
            acc = accuracy(model, test_set)
            trainer.report(metric=acc, metric_name="test_accuracy")
            if step.epoch % 5 == 4 or step.step == step.total_steps:
                print(f"epoch {step.epoch + 1:3d}  step {step.step:4d}/{step.total_steps}  "
                      f"loss {step.loss:.4f}  test_accuracy {acc:.4f}", flush=True)
    return trainer.finish()


if __name__ == "__main__":
    runtime.exit_worker(main())  # finish()'s code: 0 with final weights, 85 to be rescheduled
