"""Issue 11 item 3: the runtime measures its profile and gradient statistics, keeps them in its
checkpoints (JSON, no pickle) and reports them through the worker protocol (in-process trainers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cost_models.goodput import GoodputFunction, ThroughputModel, ThroughputParams
from runtime import CheckpointConfig, ElasticTrainer, TrainerConfig, TrainingConfig
from runtime.adaptive import (
    Profile,
    ScaleInvariantProgress,
    choose_batch,
    parse_batch_json,
    plan_batch,
    round_batch,
)


def test_batch_plan_maps_logical_workers_and_chunks_to_pollux_terms() -> None:
    # 8 logical workers on 2 GPUs: 4 micro-batches of B/K per GPU per step
    assert plan_batch(64, world_size=2, logical_workers=8).to_json() == {"batch_size": 64, "local_bsz": 8, "accum_steps": 3}
    # uneven: the busiest GPU sets the step (3 of 8 logical workers on each of the first two of 3)
    assert plan_batch(64, world_size=3, logical_workers=8).accum_steps == 2
    # a per-GPU limit of 3 splits each micro-batch of 8 into 3 chunks (3, 3, 2)
    p = plan_batch(64, world_size=8, logical_workers=8, max_local_bsz=3)
    assert (p.chunks, p.local_bsz, p.accum_steps) == (3, 3, 2)
    with pytest.raises(ValueError, match="multiple"):
        plan_batch(60, world_size=1, logical_workers=8)
    assert round_batch(796, logical_workers=8, init_batch_size=64, max_batch_size=4096) == 800
    assert round_batch(10, logical_workers=8, init_batch_size=64, max_batch_size=4096) == 64
    assert round_batch(9999, logical_workers=8, init_batch_size=64, max_batch_size=1001) == 1000


def test_batch_directive_is_read_and_malformed_ones_are_ignored() -> None:
    assert parse_batch_json('{"batch_size": 796, "local_bsz": 199, "accum_steps": 0}') == 796
    for bad in (None, "", "{", "[]", '{"batch_size": "x"}', '{"batch_size": -3}', '{"batch_size": true}',
                '{"local_bsz": 3}', '{"batch_size": NaN}'):
        assert parse_batch_json(bad) is None, bad


def test_profile_means_survive_json_and_feed_the_optimizer() -> None:
    true = ThroughputModel(ThroughputParams(0.05, 0.004, 0.0, 0.0, 0.02, 0.002, 1.5))
    prof = Profile()
    for n, k, m, a in [(1, 1, 16, 3), (1, 2, 16, 1), (1, 4, 16, 0), (1, 4, 32, 0)]:
        t = float(true.step_time(n, k, m, a))
        for _ in range(3):
            prof.add((n, k, m, a), t, 0.25 * t / (a + 1))
    clone = Profile()
    clone.load_state_dict(json.loads(json.dumps(prof.state_dict())))  # plain JSON
    assert clone.rows() == prof.rows() and len(clone) == 4
    row = prof.rows()[0]
    assert set(row) == {"nodes", "replicas", "local_bsz", "accum_steps", "step_time_s", "sync_time_s"}
    fitted = prof.fit()
    assert fitted is not None
    args = dict(nodes=1, replicas=4, logical_workers=8, init_batch_size=64, max_batch_size=1024, max_local_bsz=None)
    got = choose_batch(prof, grad_sqr=1.0, grad_var=20.0, **args)  # type: ignore[arg-type]
    assert got is not None and got % 8 == 0 and 64 <= got <= 1024
    fn = GoodputFunction(fitted, grad_sqr=1.0, grad_var=20.0, init_batch_size=64)

    def goodput(b: int) -> float:  # at the runtime's own plan of batch b on 4 GPUs
        p = plan_batch(b, world_size=4, logical_workers=8)
        return b / float(fitted.step_time(1, 4, p.local_bsz, p.accum_steps)) * fn.efficiency(b)

    # the best of every batch this runtime can train with, the optimizer's own pick among them
    pick = round_batch(fn.optimize(1, 4, max_batch_size=1024).batch_size, logical_workers=8, init_batch_size=64,
                       max_batch_size=1024)
    assert goodput(got) >= goodput(pick) and goodput(got) >= 0.99 * max(goodput(b) for b in range(64, 1025, 8))
    # with the current batch: None unless more than the gain
    assert choose_batch(prof, grad_sqr=1.0, grad_var=20.0, current=got, min_gain=0.05, **args) is None  # type: ignore[arg-type]
    assert choose_batch(prof, grad_sqr=1.0, grad_var=20.0, current=64, min_gain=0.05, **args) == got  # type: ignore[arg-type]
    # nothing to choose from without statistics or without a profile
    assert choose_batch(prof, grad_sqr=None, grad_var=None, **args) is None  # type: ignore[arg-type]
    assert choose_batch(Profile(), grad_sqr=1.0, grad_var=1.0, **args) is None  # type: ignore[arg-type]


def test_scale_invariant_progress_steps_the_scheduler_per_whole_iteration() -> None:
    p = ScaleInvariantProgress()
    assert [p.advance(g) for g in (1.0, 0.5, 0.5, 2.5, 1.0)] == [1, 0, 1, 2, 1]
    assert p.scheduler_steps == int(p.iterations) == 5


def _trainer(tmp: Path, *, logical_workers: int, steps: int, batch: int = 8, policy: str = "fixed",
             batch_json: str | None = None, max_local: int | None = None, noise_every: int = 2,
             optimizer: str = "sgd", lr_scaling: str = "adascale", epochs: int | None = None,
             label_noise: float = 0.3) -> ElasticTrainer:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + label_noise * torch.randn(256, 1, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = (torch.optim.Adam(model.parameters(), lr=0.01) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.05))
    training = TrainingConfig(logical_workers=logical_workers, global_batch_size=batch, batch_policy=policy,  # type: ignore[arg-type]
                              lr_scaling=lr_scaling, max_batch_size=128, max_local_batch_size=max_local)  # type: ignore[arg-type]
    config = TrainerConfig(training=training, checkpoint=CheckpointConfig(uri=f"file://{tmp}/ckpt", interval_s=1e6),
                           max_steps=None if epochs else steps, epochs=epochs, job_id="ckpt",
                           progress_file=str(tmp / "progress.json"), progress_interval_s=0.0,
                           noise_every_steps=noise_every, batch_json=batch_json)
    return ElasticTrainer(model, opt, torch.utils.data.TensorDataset(x, y), config=config,
                          loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]))


def _run(trainer: ElasticTrainer, *, checkpoint: bool = True) -> None:
    try:
        for _ in trainer:
            pass
        if checkpoint:
            trainer.checkpoint(wait=True)
    finally:
        trainer.close()


def test_one_logical_worker_reports_profile_and_consecutive_step_statistics(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, logical_workers=1, steps=12)
    _run(trainer)
    prog = json.loads((tmp_path / "progress.json").read_text())
    assert prog["grad_sqr"] is not None and prog["grad_var"] > 0  # ConsecutiveSteps, K = 1
    assert (prog["batch_size"], prog["local_bsz"], prog["accum_steps"]) == (8, 8, 0)
    (row,) = prog["profile"]
    assert (row["nodes"], row["replicas"], row["local_bsz"], row["accum_steps"]) == (1, 1, 8, 0)
    assert 0 < row["sync_time_s"] < row["step_time_s"]
    # kept in the checkpoint: JSON in the manifest, and in the trainer's state (no pickle)
    manifest = json.loads((tmp_path / "ckpt/checkpoints/12/manifest.json").read_text())
    assert manifest["profile"] == prog["profile"] and manifest["progress_iterations"] == 12.0
    resumed = _trainer(tmp_path, logical_workers=1, steps=12)
    resumed._started = True
    resumed._resume()
    try:
        assert resumed.profile.rows() == prog["profile"] and resumed.iterations.iterations == 12.0
        assert resumed.noise.grad_var == pytest.approx(prog["grad_var"])
    finally:
        resumed.close()


def test_without_a_directive_an_adaptive_gang_picks_the_optimizers_batch(tmp_path: Path) -> None:
    _run(_trainer(tmp_path, logical_workers=2, steps=10, policy="adaptive", noise_every=1))
    second = _trainer(tmp_path, logical_workers=2, steps=20, policy="adaptive", noise_every=1)
    second._started = True
    second._resume()
    try:
        want = choose_batch(second.profile, grad_sqr=second.noise.grad_sqr, grad_var=second.noise.grad_var,
                            nodes=1, replicas=1, logical_workers=2, init_batch_size=8, max_batch_size=128,
                            max_local_bsz=None)
        assert want is not None
        assert second.batch.global_batch_size == want and second.plan.batch_size == want
    finally:
        second.close()
    # a directive wins over the runtime's own pick
    third = _trainer(tmp_path, logical_workers=2, steps=20, policy="adaptive", batch_json='{"batch_size": 33}')
    third._started = True
    third._resume()
    try:
        assert third.batch.global_batch_size == 34  # rounded to a multiple of the logical workers
    finally:
        third.close()


def test_chunks_within_the_per_gpu_limit_give_the_same_update_up_to_rounding(tmp_path: Path) -> None:
    whole = _trainer(tmp_path / "a", logical_workers=2, steps=3, batch=16)
    chunked = _trainer(tmp_path / "b", logical_workers=2, steps=3, batch=16, max_local=3)
    assert (chunked.plan.chunks, chunked.plan.local_bsz, chunked.plan.accum_steps) == (3, 3, 5)
    for t in (whole, chunked):
        _run(t, checkpoint=False)
    for a, b in zip(whole.model.parameters(), chunked.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert not np.isclose(whole.profile.rows()[0]["local_bsz"], chunked.profile.rows()[0]["local_bsz"])


def test_a_gang_without_a_directive_re_optimizes_at_fixed_steps(tmp_path: Path) -> None:
    t = _trainer(tmp_path, logical_workers=2, steps=60, policy="adaptive", noise_every=1, label_noise=10.0)
    object.__setattr__(t.config, "rebatch_every_steps", 20)
    seen: dict[int, int] = {}
    try:
        for step in t:
            seen[step.step] = step.batch_size
    finally:
        t.close()
    changes = [s for s in seen if s - 1 in seen and seen[s] != seen[s - 1]]
    assert all((s - 1) % 20 == 0 for s in changes), changes  # only right after a re-optimization step
    assert seen[1] == 8 and len(set(seen.values())) >= 2  # noisy labels: a larger batch pays
    assert all(b % 2 == 0 and 8 <= b <= 128 for b in seen.values())


def test_a_gang_with_a_directive_never_changes_its_batch_itself(tmp_path: Path) -> None:
    """Issue 20: with the controller's directive the policy is the only decider. The same noisy run
    that re-optimizes to a larger batch without one (test above) keeps the directive's batch, and
    reports it as the controller's; without one it reports ``batch_source: runtime``."""
    t = _trainer(tmp_path / "c", logical_workers=2, steps=60, policy="adaptive", noise_every=1, label_noise=10.0,
                 batch_json='{"batch_size": 8, "local_bsz": 4, "accum_steps": 0}')
    object.__setattr__(t.config, "rebatch_every_steps", 20)
    try:
        sizes = {step.batch_size for step in t}
        assert sizes == {8} and t.batch_source == "controller"
    finally:
        t.close()
    free = _trainer(tmp_path / "r", logical_workers=2, steps=3, policy="adaptive")
    try:
        assert free.batch_source == "runtime"
    finally:
        free.close()


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_end_early_stops_at_that_boundary_and_finish_writes_the_final_weights(tmp_path: Path, policy: str) -> None:
    """A script's own stop rule (a target metric): the loop ends right after the step that called
    end_early, and finish() treats the run as complete (exit 0, final weights), not as cut short."""
    trainer = _trainer(tmp_path, logical_workers=2, steps=40, policy=policy)
    seen = []
    for step in trainer:
        seen.append(step.step)
        if step.step == 7:
            trainer.end_early()
    assert seen == list(range(1, 8)) and trainer.done
    assert trainer.finish() == 0
    prog = json.loads((tmp_path / "progress.json").read_text())
    assert prog["completed"] is True and prog["step"] == 7 and prog["final_model"]
