"""Issue 11 item 4: ``batch_policy: adaptive`` rescales the batch and the learning rate at each change
of instances, counts progress in scale-invariant iterations, and stays deterministic for a given
schedule of allocations; a fixed batch stays bitwise identical whatever the world size (real gloo
gangs of ``rt_adaptive_worker.py``, besides in-process trainers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import rt_adaptive_worker
import torch
from test_profile import _run, _trainer

import rt_launch
from runtime import protocol
from runtime.lr_scaling import adascale_gain, is_adaptive_optimizer, lr_factor

WORKER = Path(__file__).with_name("rt_adaptive_worker.py")


def test_adam_gets_the_square_root_of_the_adascale_gain() -> None:
    net = torch.nn.Linear(2, 1)
    assert is_adaptive_optimizer(torch.optim.Adam(net.parameters()))
    assert is_adaptive_optimizer(torch.optim.AdamW(net.parameters()))
    assert not is_adaptive_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    gain = adascale_gain(batch_size=256, init_batch_size=64, grad_sqr=1.0, grad_var=3.0)
    assert gain == pytest.approx(4 / 1.75) and 1 < gain < 4
    assert lr_factor("adascale", batch_size=256, init_batch_size=64, grad_sqr=1.0, grad_var=3.0) == pytest.approx(gain)
    assert lr_factor("adascale", batch_size=256, init_batch_size=64, grad_sqr=1.0, grad_var=3.0,
                     adaptive_optimizer=True) == pytest.approx(math.sqrt(gain))
    # rules the user asked for apply as asked, Adam or not
    assert lr_factor("linear", batch_size=256, init_batch_size=64, adaptive_optimizer=True) == 4.0
    assert lr_factor("sqrt", batch_size=256, init_batch_size=64, adaptive_optimizer=True) == 2.0


def test_adam_trainer_scales_lr_by_sqrt_gain_and_progress_by_the_gain(tmp_path: Path) -> None:
    t = _trainer(tmp_path, logical_workers=2, steps=6, policy="adaptive", optimizer="adam", noise_every=1,
                 batch_json='{"batch_size": 32}')
    _run(t, checkpoint=False)
    gain = adascale_gain(batch_size=32, init_batch_size=8, grad_sqr=t.noise.grad_sqr, grad_var=t.noise.grad_var)
    assert gain > 1 and t.lr_factor() == pytest.approx(math.sqrt(gain))
    assert t.iterations.iterations >= 6  # the iterations count the gain, not the optimizer's steps
    assert t.position.step < 6


def test_an_epoch_based_schedule_follows_scale_invariant_iterations(tmp_path: Path) -> None:
    """At 4x the initial batch each step is worth the AdaScale gain (1..4) iterations: the job trains
    until 2 epochs' worth of iterations at the initial batch, StepLR (step_size = one epoch) decays
    exactly twice, and the trainer reports two epoch ends."""
    per_epoch = 256 // 8
    t = _trainer(tmp_path, logical_workers=2, steps=0, policy="adaptive", noise_every=1, epochs=2,
                 batch_json='{"batch_size": 32}')
    scheduler = torch.optim.lr_scheduler.StepLR(t.optimizer, step_size=per_epoch, gamma=0.5)
    t.lr_scheduler = scheduler
    ends = []
    try:
        for step in t:
            assert step.batch_size == 32
            ends.append(step.epoch) if step.epoch_end else None
    finally:
        t.close()
    assert ends == [0, 1] and t.done
    assert 2 * per_epoch <= t.iterations.iterations < 2 * per_epoch + 4
    assert scheduler.last_epoch == math.floor(t.iterations.iterations) == t.iterations.scheduler_steps
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * 0.25)
    assert per_epoch // 2 < t.position.step < 2 * per_epoch  # fewer optimizer steps than at the initial batch
    assert t.position.epoch >= 2  # and more passes over the data (AdaScale trades data for steps)


def _env(tmp: Path, name: str, **training: object) -> dict[str, str]:
    t = {"logical_workers": 4, "global_batch_size": 16, "batch_policy": "adaptive", "lr_scaling": "adascale",
         "max_batch_size": 128, "determinism": "bitwise", "seed": 3, **training}
    return {
        protocol.ENV_CHECKPOINT_URI: f"file://{tmp / name}",
        protocol.ENV_CHECKPOINT_INTERVAL_S: "600",
        protocol.ENV_PROGRESS_FILE: str(tmp / f"{name}-progress.json"),
        protocol.ENV_TRAINING_JSON: json.dumps(t),
        protocol.ENV_JOB_ID: name,
    }


def _gang(tmp: Path, env: dict[str, str], world: int, name: str, *, batch: int | None = None,
          stop_at: int | None = None) -> list:
    e = dict(env, RT_OUT=str(tmp / f"out-{name}"), RT_EPOCHS="1")
    (tmp / f"out-{name}").mkdir(exist_ok=True)
    if batch is not None:
        e[protocol.ENV_BATCH_JSON] = json.dumps({"batch_size": batch, "local_bsz": batch // world, "accum_steps": 0})
    if stop_at is not None:
        e["RT_STOP_AT"] = str(stop_at)
    return rt_launch.start(world, e, script=WORKER)


def _wait(tmp: Path, procs: list, name: str) -> rt_launch.GangResult:
    return rt_launch.wait(procs, tmp / f"out-{name}")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


def _one(tmp: Path, env: dict[str, str], *, batch: int | None = None) -> dict:
    """A gang of one GPU, in this process (the same arithmetic as a worker process: one thread)."""
    e = dict(env, RT_EPOCHS="1")
    if batch is not None:
        e[protocol.ENV_BATCH_JSON] = json.dumps({"batch_size": batch, "local_bsz": batch, "accum_steps": 0})
    return rt_adaptive_worker.train(e)


@pytest.mark.e2e
def test_adaptive_is_deterministic_for_a_schedule_of_allocations(tmp_path: Path) -> None:
    """The same schedule twice (2 GPUs at batch 32 until step 4, then 1 GPU at batch 64): the same
    weights bit for bit; batch and LR follow each allocation, and the profile has both configurations."""
    runs = ("a", "b")
    envs = {r: _env(tmp_path, r) for r in runs}
    first = {r: _gang(tmp_path, envs[r], 2, f"{r}1", batch=32, stop_at=4) for r in runs}
    res1 = {r: _wait(tmp_path, first[r], f"{r}1") for r in runs}
    res2 = {r: _one(tmp_path, envs[r], batch=64) for r in runs}
    for r in runs:
        assert res1[r].codes == [protocol.EXIT_RESCHEDULE] * 2, res1[r].outputs
        assert all(s["step"] == 4 and s["batches"] == [32] for s in res1[r].summaries)
        s2 = res2[r]
        assert s2["code"] == 0 and s2["batches"] == [64]
        assert s2["plan"] == {"batch_size": 64, "local_bsz": 16, "accum_steps": 3}
        assert s2["iterations"] >= 32 and s2["scheduler_epoch"] == math.floor(s2["iterations"])
        assert s2["epoch_ends"] >= 1 and s2["lr"] == pytest.approx(0.05 * 0.5 ** (s2["scheduler_epoch"] // 32))
        manifest = json.loads((tmp_path / r / "checkpoints" / "4" / "manifest.json").read_text())
        assert manifest["batch"]["global_batch_size"] == 32 and manifest["world_size"] == 2
        assert [(p["replicas"], p["local_bsz"], p["accum_steps"]) for p in manifest["profile"]] == [(2, 8, 1)]
    assert _same(rt_launch.final_tensors(tmp_path / "a"), rt_launch.final_tensors(tmp_path / "b"))
    prog = json.loads((tmp_path / "a-progress.json").read_text())
    assert prog["completed"] and prog["batch_size"] == 64 and prog["grad_var"] > 0 and prog["grad_sqr"] >= 0
    rows = {(p["replicas"], p["local_bsz"], p["accum_steps"]): p for p in prog["profile"]}
    assert set(rows) == {(2, 8, 1), (1, 16, 3)}
    assert rows[(2, 8, 1)]["sync_time_s"] > 0  # the all-gather after the last backward pass
    assert all(0 <= p["sync_time_s"] < p["step_time_s"] for p in rows.values())
    assert prog["lr_factor"] == pytest.approx(adascale_gain(batch_size=64, init_batch_size=16,
                                                            grad_sqr=prog["grad_sqr"], grad_var=prog["grad_var"]))


@pytest.mark.e2e
def test_fixed_batch_with_chunks_is_bitwise_identical_on_any_world(tmp_path: Path) -> None:
    """A fixed batch (a directive is ignored) split into chunks by the per-GPU limit: 2 GPUs and
    1 GPU give the same weights bit for bit."""
    two_env = _env(tmp_path, "two", batch_policy="fixed", max_local_batch_size=2)
    two = _wait(tmp_path, _gang(tmp_path, two_env, 2, "two", batch=64), "two")
    one = _one(tmp_path, _env(tmp_path, "one", batch_policy="fixed", max_local_batch_size=2))
    assert two.codes == [0, 0], two.outputs
    for s, w in ((two.summaries[0], 2), (one, 1)):
        assert s["batches"] == [16] and s["chunks"] == 2 and s["step"] == 32  # an epoch of 512 / 16
        assert s["plan"]["local_bsz"] == 2 and s["plan"]["accum_steps"] == 2 * (4 // w) - 1
    assert _same(rt_launch.final_tensors(tmp_path / "one"), rt_launch.final_tensors(tmp_path / "two"))


@pytest.mark.e2e
def test_the_adaptive_example_trains_and_reports(tmp_path: Path) -> None:
    """examples/adaptive/train.py as ``python train.py`` (no directive): one epoch's worth of
    iterations, its own re-optimized batch, test accuracy and the profile in the progress file."""
    example = Path(__file__).resolve().parents[2] / "examples" / "adaptive" / "train.py"
    env = {"ADAPTIVE_EPOCHS": "1", protocol.ENV_CHECKPOINT_URI: f"file://{tmp_path / 'ex'}",
           protocol.ENV_PROGRESS_FILE: str(tmp_path / "ex.json"), protocol.ENV_JOB_ID: "ex"}
    res = rt_launch.wait(rt_launch.start(1, env, script=example))
    assert res.codes == [0], res.outputs
    prog = json.loads((tmp_path / "ex.json").read_text())
    assert prog["completed"] and prog["metric_name"] == "test_accuracy" and 0.3 < prog["metric"] <= 1.0
    assert prog["progress_iterations"] >= 16384 // 64 and prog["profile"] and prog["batch_size"] % 8 == 0
