"""What ``spotrain init`` writes: a job spec and a training script that run as they are.

``examples/init/`` holds exactly these files (``spotrain init examples/init --force`` rewrites them;
``tests/test_cli_getting_started.py`` checks they agree).
"""

from __future__ import annotations

JOB_YAML = """\
# A spotrain job (docs/spec.md lists every field). Run it on the local cloud, a stand-in for AWS and
# GCP spot markets on this machine:   spotrain run job.yaml
# Check it without running anything:  spotrain validate job.yaml
name: {name}
workdir: .
run: python train.py
envs:
  EPOCHS: 4               # read by train.py: the environment every worker gets
resources:
  accelerators: [T4:1]    # spotrain offerings --accelerator T4 lists where and at what price
  clouds: [aws, gcp]
  spot: auto              # spot when it pays, on-demand when the deadline needs it
workers: {{min: 1, max: 2}}
training:
  logical_workers: 2      # a multiple of workers.max: the run is the same on 1 or 2 workers
  global_batch_size: 64
  determinism: bitwise
  seed: 0
objective:
  deadline: 2h            # durations need a unit: 90s, 10m, 2h, 1d
  budget_usd: 5
checkpoint:
  interval: 10m
retries: {{max_restarts_on_errors: 2}}
simulate:
  work_gpu_hours: 0.1     # what spotrain estimate plans with: measure your job and set it
"""

TRAIN_PY = '''\
"""A spotrain training script: linear regression on synthetic data, elastic and preemption-safe.

Replace the data, model and loss with yours and keep the shape of the loop: the trainer resumes from
the newest checkpoint, checkpoints on a preemption notice at the next minibatch boundary, and
``finish()`` returns the exit code the controller reads (0 with the final weights written, 85 after
a notice). Runs under spotrain (``spotrain run job.yaml``), under ``torchrun`` and as ``python train.py``.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import runtime

EPOCHS = int(os.environ.get("EPOCHS", "4"))  # the spec's envs


def make_data(seed: int, n: int = 1024, dim: int = 8) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = x @ torch.randn(dim, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def loss_fn(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def main() -> int:
    config = runtime.TrainerConfig.from_env(epochs=EPOCHS)
    data = make_data(config.training.seed)
    torch.manual_seed(config.training.seed)
    model = torch.nn.Linear(data.tensors[0].shape[1], 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = runtime.ElasticTrainer(model, optimizer, data, loss_fn=loss_fn, config=config)
    for step in trainer:
        if step.epoch_end and trainer.is_rank0:
            with torch.no_grad():
                mse = float(F.mse_loss(model(data.tensors[0]), data.tensors[1]))
            trainer.report(metric=mse, metric_name="train_mse")
            print(f"epoch {step.epoch + 1}  step {step.step}/{step.total_steps}  train_mse {mse:.4f}", flush=True)
    return trainer.finish()


if __name__ == "__main__":
    # Pass finish()'s code on: a script that drops it exits 0 after a preemption notice, and the
    # job fails as unfinished. exit_worker is sys.exit, minus a slow teardown after a notice.
    runtime.exit_worker(main())
'''

FILES = {"job.yaml": JOB_YAML, "train.py": TRAIN_PY}
