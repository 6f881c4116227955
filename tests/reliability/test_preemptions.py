"""100 preemptions in one job: the real ``ElasticTrainer`` on real ``file://`` checkpoints, stopped by
a notice at 100 random step boundaries and resumed each time from its checkpoint, against the same
job run without interruption.

Each attempt is what a worker process does after a replacement starts it: a new model, optimizer
and learning-rate schedule built from scratch, a new trainer on the job's checkpoint URI, its own
notice file (``SPOTRAIN_NOTICE_FILE``), iterate, ``finish()``. The notice is written between two
steps, as the controller does when the cloud warns; the trainer sees it during the next step and
stops at that step's boundary with a checkpoint. The model has dropout and the optimizer momentum,
and a schedule decays the learning rate, so that every kind of state (weights, optimizer, schedule,
data position, per-logical-worker RNG) must come back exactly.

Every sample is counted as the loss function sees it (its index rides along in the batch): each
epoch must see every sample exactly once, no more samples may be trained in all than one minibatch
per preemption beyond the uninterrupted run, and the final weights must be bitwise equal to the
uninterrupted run's (``determinism: bitwise``), as must the final weights file.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime import CheckpointConfig, ElasticTrainer, NoticeConfig, TrainerConfig, TrainingConfig, protocol

from .figures import record

pytestmark = pytest.mark.chaos

PREEMPTIONS = 100
SAMPLES, BATCH, LOGICAL = 192, 8, 4  # 24 steps an epoch, 4 logical workers of 2 samples each
EPOCHS = 6  # 144 steps: 100 of the 143 boundaries between them get a notice
JOB = "rel-preempt"


class Attempt:
    """One worker process's life: build everything, train until done or stopped, finish."""

    def __init__(self, root: Path, notice_file: Path | None, log: list[tuple[int, int, tuple[int, ...]]],
                 attempt: int) -> None:
        torch.manual_seed(1234)  # the script's own initial draws: overwritten by a resume
        g = torch.Generator().manual_seed(99)
        x = torch.randn(SAMPLES, 6, generator=g)
        y = (x @ torch.randn(6, 1, generator=g)).tanh() + 0.1 * torch.randn(SAMPLES, 1, generator=g)
        dataset = torch.utils.data.TensorDataset(x, y, torch.arange(SAMPLES))
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                    torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.8)
        config = TrainerConfig(
            training=TrainingConfig(logical_workers=LOGICAL, global_batch_size=BATCH, determinism="bitwise", seed=3),
            checkpoint=CheckpointConfig(uri=f"file://{root}/{JOB}", interval_s=1e9, keep=3),
            notices=NoticeConfig(notice_file=str(notice_file) if notice_file else None, handle_sigterm=False),
            epochs=EPOCHS, job_id=JOB, attempt=attempt, progress_interval_s=1e9)
        self.notice_file = notice_file
        self.trainer = ElasticTrainer(model, optimizer, dataset, config=config, lr_scheduler=schedule,
                                      loss_fn=self._loss)
        self.log, self.attempt = log, attempt

    def _loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y, idx = batch
        pos = self.trainer.position  # the step being trained, before the boundary moves it on
        self.log.append((self.attempt, pos.step, tuple(int(i) for i in idx)))
        return F.mse_loss(model(x), y)

    def run(self, notice_after: set[int], *, notice_first: bool = False) -> tuple[int, int | None]:
        """(exit code, step resumed from); a notice is written right after each step in ``notice_after``,
        or with ``notice_first`` before the first (it came while the replacement was starting)."""
        if notice_first and self.notice_file is not None:
            self.notice_file.write_text('{"reason": "preemption"}')
        for step in self.trainer:
            if step.step in notice_after and self.notice_file is not None:
                self.notice_file.write_text('{"reason": "preemption"}')
        return self.trainer.finish(), self.trainer.resumed_from


def _final_weights(root: Path) -> bytes:
    return (root / JOB / "final" / "model.safetensors").read_bytes()


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_100_preemptions_lose_nothing_and_end_bitwise_equal(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    calm_log: list[tuple[int, int, tuple[int, ...]]] = []
    calm = Attempt(tmp_path / "calm", None, calm_log, attempt=1)
    assert calm.run(set()) == (protocol.EXIT_DONE, None)
    calm_model = {k: v.clone() for k, v in calm.trainer.model.state_dict().items()}
    total_steps = calm.trainer.position.step
    assert total_steps == EPOCHS * SAMPLES // BATCH

    # A notice after each of these steps: increasing, some right after the previous stop (the notice
    # arrives before the replacement's first step), most a few steps later.
    rng = random.Random(14)
    draws = sorted(rng.choices(range(1, total_steps - PREEMPTIONS), k=PREEMPTIONS))
    boundaries = [d + i for i, d in enumerate(draws)]
    storm_log: list[tuple[int, int, tuple[int, ...]]] = []
    stops: list[int] = []
    resumes: list[int | None] = []
    attempt = 0
    pending = list(boundaries)
    while True:
        attempt += 1
        notice = tmp_path / f"notice-{attempt}"  # each attempt its own notice file, as the executor gives
        run = Attempt(tmp_path / "storm", notice, storm_log, attempt=attempt)
        at_once = bool(pending) and bool(stops) and pending[0] == stops[-1]
        code, resumed = run.run({pending[0]} if pending else set(), notice_first=at_once)
        resumes.append(resumed)
        if code == protocol.EXIT_DONE:
            break
        assert code == protocol.EXIT_RESCHEDULE and attempt <= PREEMPTIONS, (attempt, code)
        stops.append(run.trainer.position.step)
        pending.pop(0)
    assert attempt == PREEMPTIONS + 1 and len(stops) == PREEMPTIONS
    # The notice after step k is seen during step k+1, which ends with the checkpoint the next
    # attempt resumes from: every resume is from the stop just before it, nothing older.
    assert stops == [b + 1 for b in boundaries]
    assert resumes == [None, *stops]

    # Samples: per (attempt, step), the logical workers' micro-batches; a step trained twice would
    # show up as the same step in two attempts.
    trained = Counter(step for _, step, _ in storm_log)
    calm_trained = Counter(step for _, step, _ in calm_log)
    assert set(trained) == set(calm_trained) == set(range(total_steps))
    redone_steps = sum(n // LOGICAL - 1 for n in trained.values())
    samples = sum(len(idx) for _, _, idx in storm_log)
    calm_samples = sum(len(idx) for _, _, idx in calm_log)
    assert samples - calm_samples == redone_steps * BATCH
    assert redone_steps <= PREEMPTIONS  # at most the last minibatch of each preemption
    # The storm trained exactly the calm run's samples, step by step, in the same order.
    by_step_storm: dict[int, list[int]] = {}
    for _, step, idx in storm_log:
        by_step_storm.setdefault(step, []).extend(idx)
    by_step_calm: dict[int, list[int]] = {}
    for _, step, idx in calm_log:
        by_step_calm.setdefault(step, []).extend(idx)
    assert {s: v[-BATCH:] for s, v in by_step_storm.items()} == by_step_calm
    steps_per_epoch = SAMPLES // BATCH
    for epoch in range(EPOCHS):
        seen = sorted(i for s in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch) for i in by_step_calm[s])
        assert seen == list(range(SAMPLES)), f"epoch {epoch}: a sample missing or twice"
        seen_storm = sorted(i for s in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
                            for i in by_step_storm[s][-BATCH:])
        assert seen_storm == list(range(SAMPLES)), f"epoch {epoch} (preempted run): a sample missing or twice"

    # Bitwise: the weights in memory and the final weights file.
    storm_model = run.trainer.model.state_dict()
    assert all(torch.equal(calm_model[k], storm_model[k]) for k in calm_model)
    assert _final_weights(tmp_path / "storm") == _final_weights(tmp_path / "calm")
    # Pruning kept three checkpoints and nothing else.
    left = _leftovers(tmp_path / "storm" / JOB)
    assert len([f for f in left if f.endswith("manifest.json")]) == 3 and not [f for f in left if ".tmp" in f], left
    elapsed = time.perf_counter() - t0
    record("preemptions", tried=f"{PREEMPTIONS} preemption notices in one job at random step boundaries "
                                f"({total_steps} steps, {EPOCHS} epochs), in-process ElasticTrainer, file:// checkpoints",
           held=f"{attempt} attempts, each resumed from the last stop; {samples:,} samples trained vs "
                f"{calm_samples:,} uninterrupted ({redone_steps} minibatches redone); every epoch each sample "
                "once; final weights bitwise equal",
           preemptions=PREEMPTIONS, attempts=attempt, steps=total_steps, samples_trained=samples,
           samples_uninterrupted=calm_samples, minibatches_redone=redone_steps, bitwise_equal=True,
           notices_before_first_step=sum(1 for a, b in zip(boundaries, boundaries[1:]) if b == a + 1),
           checkpoints_left=3, elapsed_s=round(elapsed, 2))
