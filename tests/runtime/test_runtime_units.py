"""Unit tests of the runtime's pure parts: data order, placement, seeds, state flattening, stats, LR."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runtime import TrainerConfig, TrainingConfig, lr_factor
from runtime.config import CheckpointConfig, NoticeConfig
from runtime.data import DataOrder, DataPosition, epoch_permutation, logical_workers_of
from runtime.errors import StateError
from runtime.seeding import derive_seed, seed_logical_worker
from runtime.serialization import flatten, unflatten
from runtime.stats import GradientNoiseStats, estimate


@pytest.mark.parametrize("k,w", [(4, 1), (4, 3), (8, 3), (5, 5), (7, 2)])
def test_logical_placement_partitions_in_order(k: int, w: int) -> None:
    blocks = [list(logical_workers_of(r, w, k)) for r in range(w)]
    assert sum(blocks, []) == list(range(k))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_world_larger_than_logical_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds logical_workers"):
        logical_workers_of(0, 5, 4)


def test_global_batches_do_not_depend_on_the_world_and_cover_each_epoch_once() -> None:
    order = DataOrder(num_samples=103, seed=3)
    pos, seen = DataPosition(), []
    while pos.epoch == 0:
        batch = [order.logical_indices(pos, global_batch_size=20, logical_workers=4, logical_rank=k) for k in range(4)]
        assert np.array_equal(np.concatenate(batch), order.permutation(0)[pos.samples_in_epoch: pos.samples_in_epoch + 20])
        seen.extend(np.concatenate(batch).tolist())
        order.advance(pos, 20)
    assert len(seen) == len(set(seen)) == 100  # drop-last: 5 full batches
    assert pos.step == 5 and pos.samples_in_epoch == 0
    assert not np.array_equal(epoch_permutation(3, 0, 103), epoch_permutation(3, 1, 103))
    assert np.array_equal(epoch_permutation(3, 1, 103), DataOrder(num_samples=103, seed=3).permutation(1))


def test_resume_from_state_dict_and_batch_size_change_skips_and_repeats_nothing() -> None:
    order = DataOrder(num_samples=120, seed=1)
    pos, seen = DataPosition(), []
    for _ in range(2):
        seen += order.logical_indices(pos, global_batch_size=16, logical_workers=4, logical_rank=0).tolist()
        seen += np.concatenate([order.logical_indices(pos, global_batch_size=16, logical_workers=4, logical_rank=k)
                                for k in range(1, 4)]).tolist()
        order.advance(pos, 16)
    restored = DataPosition()
    restored.load_state_dict(pos.state_dict())
    order2 = DataOrder(num_samples=120, seed=1)
    while restored.epoch == 0:  # resumed with a larger global batch
        seen += np.concatenate([order2.logical_indices(restored, global_batch_size=40, logical_workers=4,
                                                       logical_rank=k) for k in range(4)]).tolist()
        order2.advance(restored, 40)
    assert len(seen) == len(set(seen)) == 32 + 80


def test_seeds_are_stable_and_distinct() -> None:
    assert derive_seed(0, "logical", 3, 1) == derive_seed(0, "logical", 3, 1)
    assert len({derive_seed(0, "logical", s, k) for s in range(10) for k in range(10)}) == 100
    seed_logical_worker(5, 2, 1)
    a = torch.rand(3)
    seed_logical_worker(5, 2, 1)
    assert torch.equal(a, torch.rand(3))


def test_optimizer_state_round_trips_through_json_and_tensors() -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = opt.state_dict()
    skeleton, tensors = flatten(state, "opt")
    import json

    back = unflatten(json.loads(json.dumps(skeleton)), tensors)
    assert back["param_groups"][0]["betas"] == (0.8, 0.95)
    assert set(back["state"]) == {0, 1}
    assert torch.equal(back["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    opt2 = torch.optim.AdamW(model.parameters(), lr=5.0)
    opt2.load_state_dict(back)
    assert opt2.param_groups[0]["lr"] == 1e-3


def test_unpicklable_free_state_is_refused_with_its_path() -> None:
    with pytest.raises(StateError, match="state/cb"):
        flatten({"cb": object()}, "state")


def test_noise_estimate_recovers_known_statistics() -> None:
    torch.manual_seed(0)
    true_grad, sigma, K, B = torch.full((2000,), 0.1), 1.0, 8, 64
    b = B // K
    est_sqr, est_var = [], []
    for _ in range(50):  # per-sample noise sigma^2 per coordinate -> per-micro-batch var sigma^2/b
        g = true_grad + sigma / math.sqrt(b) * torch.randn(K, 2000)
        local = float((g * g).sum(dim=1).mean())
        total = float(g.mean(dim=0).pow(2).sum())
        sqr, var = estimate(local_sqr=local, total_sqr=total, logical_workers=K, global_batch_size=B, init_batch_size=B)
        est_sqr.append(sqr)
        est_var.append(var)
    assert np.mean(est_sqr) == pytest.approx(float(true_grad.pow(2).sum()), rel=0.15)
    assert np.mean(est_var) == pytest.approx(2000 * sigma**2 / B, rel=0.05)  # variance at batch M0 = B
    assert estimate(local_sqr=1, total_sqr=1, logical_workers=1, global_batch_size=8, init_batch_size=8) is None
    stats = GradientNoiseStats(smoothing=0.5)
    stats.update(2.0, 4.0, 1.0)
    assert stats.grad_sqr == pytest.approx(2.0) and stats.grad_var == pytest.approx(4.0)
    clone = GradientNoiseStats()
    clone.load_state_dict(stats.state_dict())
    assert clone.grad_var == stats.grad_var


def test_lr_scaling_rules() -> None:
    assert lr_factor("none", batch_size=256, init_batch_size=64) == 1.0
    assert lr_factor("linear", batch_size=256, init_batch_size=64) == 4.0
    assert lr_factor("sqrt", batch_size=256, init_batch_size=64) == 2.0
    assert lr_factor("adascale", batch_size=256, init_batch_size=64) == 1.0  # no statistics yet
    # pure noise -> gain = scale; no noise -> gain = 1
    assert lr_factor("adascale", batch_size=256, init_batch_size=64, grad_sqr=0.0, grad_var=1.0) == pytest.approx(4.0)
    assert lr_factor("adascale", batch_size=256, init_batch_size=64, grad_sqr=1.0, grad_var=0.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown rule"):
        lr_factor("cubic", batch_size=2, init_batch_size=1)


def test_configs_validate_and_read_the_protocol_environment(tmp_path) -> None:
    with pytest.raises(ValueError, match="multiple of"):
        TrainingConfig(logical_workers=3, global_batch_size=32)
    with pytest.raises(ValueError, match="determinism"):
        TrainingConfig(determinism="exact")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep"):
        CheckpointConfig(uri="file:///x", keep=0)
    with pytest.raises(ValueError, match="SPOTRAIN_NOTICE_SOURCES"):
        NoticeConfig(sources=("azure",))
    with pytest.raises(ValueError, match="epochs or max_steps"):
        TrainerConfig(checkpoint=CheckpointConfig(uri="file:///x"))
    env = {
        "SPOTRAIN_JOB_ID": "j1", "SPOTRAIN_CHECKPOINT_URI": "s3://b/p/j1", "SPOTRAIN_CHECKPOINT_INTERVAL_S": "2.5",
        "SPOTRAIN_CHECKPOINT_KEEP": "4", "SPOTRAIN_TRAINING_JSON": '{"logical_workers": 8, "global_batch_size": 64}',
        "SPOTRAIN_NOTICE_SOURCES": "aws-imds", "SPOTRAIN_AWS_IMDS_ENDPOINT": "http://127.0.0.1:1",
    }
    cfg = TrainerConfig.from_env(training=TrainingConfig(seed=3), epochs=2, env=env)
    assert cfg.training.logical_workers == 8 and cfg.training.seed == 3
    assert cfg.checkpoint.uri == "s3://b/p/j1" and cfg.checkpoint.interval_s == 2.5 and cfg.checkpoint.keep == 4
    assert cfg.notices.sources == ("aws-imds",) and cfg.notices.aws_imds_endpoint == "http://127.0.0.1:1"
    plain = TrainerConfig.from_env(epochs=1, env={}, default_checkpoint_dir=str(tmp_path))
    assert plain.checkpoint.uri == f"file://{tmp_path}/local" and plain.notices.sources == ()
    with pytest.raises(ValueError, match="SPOTRAIN_TRAINING_JSON"):
        TrainerConfig.from_env(epochs=1, env={"SPOTRAIN_TRAINING_JSON": "{oops"})
