"""The goodput function (throughput x efficiency) and its batch optimizer (Pollux section 3.2)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from cost_models.goodput import BatchChoice, GoodputFunction, ThroughputModel, ThroughputParams, efficiency
from cost_models.scaling import pollux_model

PARAMS = ThroughputParams(0.02, 0.001, 0.05, 0.004, 0.01, 0.002, 2.0)


def _fn(grad_sqr: float = 1.0, grad_var: float = 4.0, m0: float = 64) -> GoodputFunction:
    return GoodputFunction(ThroughputModel(PARAMS), grad_sqr=grad_sqr, grad_var=grad_var, init_batch_size=m0)


def test_goodput_is_throughput_times_efficiency() -> None:
    fn = _fn()
    nodes, replicas, batch, accum = np.array([1, 2, 4]), np.array([4, 8, 16]), np.array([256, 1024, 4096]), np.array([0, 1, 3])
    local = batch / (replicas * (accum + 1))
    want = fn.model.throughput(nodes, replicas, local, accum) * efficiency(batch, 64, 1.0, 4.0)
    assert np.allclose(fn(nodes, replicas, batch, accum), want)
    assert np.allclose(fn.evaluate(nodes, replicas, local, accum), want)
    assert isinstance(fn(1, 1, 64), float) and fn(1, 1, 64) == pytest.approx(fn.model.throughput(1, 1, 64))
    # grad_sqr == 0: efficiency 1, goodput is throughput.
    assert _fn(grad_sqr=0.0)(2, 8, 4096) == pytest.approx(fn.model.throughput(2, 8, 512))


def _brute_force(fn: GoodputFunction, nodes: int, replicas: int, max_batch: int, max_local: int) -> float:
    best = 0.0
    for local, accum in itertools.product(range(1, max_local + 1), range(0, 16)):
        total = replicas * local * (accum + 1)
        if fn.init_batch_size <= total <= max_batch:
            best = max(best, fn.evaluate(nodes, replicas, local, accum))
    return best


@pytest.mark.parametrize("grad_var", [0.5, 8.0, 200.0])
def test_optimize_finds_the_best_configuration(grad_var: float) -> None:
    fn = _fn(grad_var=grad_var)
    allocs = [(1, 1), (1, 4), (2, 8), (4, 16)]
    choice = fn.optimize([a[0] for a in allocs], [a[1] for a in allocs], max_batch_size=4096, max_local_bsz=128)
    for i, (n, k) in enumerate(allocs):
        b, m, s = int(choice.batch_size[i]), int(choice.local_bsz[i]), int(choice.accum_steps[i])
        assert b == k * m * (s + 1) and 64 <= b <= 4096 and 1 <= m <= 128
        assert choice.goodput[i] == pytest.approx(fn.evaluate(n, k, m, s))
        # 50 geometric candidates come within 2 % of the best of every integer configuration.
        assert choice.goodput[i] >= 0.98 * _brute_force(fn, n, k, 4096, 128)


def test_optimize_follows_the_noise_scale() -> None:
    """Little gradient noise: stay near the initial batch; lots: use the largest batch the cap allows."""
    low, high = _fn(grad_var=0.01), _fn(grad_var=1e4)
    assert low.optimize(2, 8, max_batch_size=8192, max_local_bsz=256).batch_size <= 2 * 64
    big = high.optimize(2, 8, max_batch_size=8192, max_local_bsz=256)
    assert big.batch_size >= 0.9 * 8192
    # The per-GPU limit binds: accumulation makes up the rest; without accumulation, the cap is k * limit.
    assert big.local_bsz <= 256 and big.accum_steps >= 3
    plain = high.optimize(2, 8, max_batch_size=8192, max_local_bsz=256, accumulation=False)
    assert plain.accum_steps == 0 and plain.batch_size <= 8 * 256


def test_optimize_is_vectorized_and_keeps_shapes() -> None:
    fn = GoodputFunction(pollux_model("imagenet"), grad_sqr=1.0, grad_var=20.0, init_batch_size=200)
    nodes = np.repeat(np.arange(1, 17), 64).reshape(16, 64)
    replicas = nodes * np.tile(np.arange(1, 5), 256).reshape(16, 64)
    t0 = time.perf_counter()
    choice = fn.optimize(nodes, replicas, max_batch_size=12800, max_local_bsz=200)
    elapsed = time.perf_counter() - t0
    assert isinstance(choice, BatchChoice) and choice.goodput.shape == (16, 64) == choice.batch_size.shape
    assert choice.accum_steps.dtype == np.int64
    one = fn.optimize(int(nodes[5, 7]), int(replicas[5, 7]), max_batch_size=12800, max_local_bsz=200)
    assert isinstance(one.goodput, float) and isinstance(one.batch_size, int)
    assert (one.goodput, one.batch_size, one.local_bsz, one.accum_steps) == (
        pytest.approx(choice.goodput[5, 7]), choice.batch_size[5, 7], choice.local_bsz[5, 7], choice.accum_steps[5, 7])
    assert elapsed < 0.5, elapsed  # 1,024 allocations x 50 candidates in one numpy pass
    # Broadcasting: one node count against several replica counts.
    assert fn.optimize(1, np.array([1, 2, 4]), max_batch_size=12800).goodput.shape == (3,)


def test_optimize_edge_cases() -> None:
    fn = _fn()
    # More GPUs than the cap allows at the smallest per-GPU batch: nothing fits, goodput 0.
    none = fn.optimize(4, 16, max_batch_size=128, min_local_bsz=16)
    assert (none.goodput, none.batch_size, none.local_bsz, none.accum_steps) == (0.0, 0, 0, 0)
    # max_batch_size == init: the only batch is the initial one.
    only = fn.optimize(1, 4, max_batch_size=64)
    assert only.batch_size == 64 and only.local_bsz == 16
    # A cap that is not a multiple of the replicas: never exceeded.
    odd = _fn(grad_var=1e4).optimize(1, 3, max_batch_size=1000, max_local_bsz=1000)
    assert odd.batch_size <= 1000 and odd.batch_size >= 990
    with pytest.raises(ValueError, match="below the initial"):
        fn.optimize(1, 1, max_batch_size=32)
    with pytest.raises(ValueError, match="min_local_bsz"):
        fn.optimize(1, 1, max_batch_size=128, max_local_bsz=8, min_local_bsz=16)
    with pytest.raises(ValueError, match="nodes <= replicas"):
        fn.optimize(2, 1, max_batch_size=128)
    with pytest.raises(ValueError, match="grad_sqr"):
        GoodputFunction(ThroughputModel(PARAMS), grad_sqr=-1.0, grad_var=1.0, init_batch_size=64)


@pytest.mark.parametrize("seed", range(10))
def test_goodput_invariants_over_random_jobs(seed: int) -> None:
    """A looser cap never lowers the best goodput (beyond the 1 % a grid of candidates may miss), and the
    choice stays within its limits."""
    rng = np.random.default_rng(seed)
    p = ThroughputParams(rng.uniform(1e-3, 0.1), rng.uniform(1e-5, 1e-2), rng.uniform(1e-3, 0.2), rng.uniform(0, 0.02),
                         rng.uniform(1e-4, 0.05), rng.uniform(0, 0.01), rng.uniform(1, 10))
    m0 = float(rng.integers(16, 256))
    fn = GoodputFunction(ThroughputModel(p), grad_sqr=rng.uniform(0.1, 10), grad_var=rng.uniform(0.01, 100), init_batch_size=m0)
    replicas = np.array([4, 8, 16, 32])
    tight = fn.optimize(replicas // 4, replicas, max_batch_size=m0 * 8, max_local_bsz=m0)
    loose = fn.optimize(replicas // 4, replicas, max_batch_size=m0 * 64, max_local_bsz=m0)
    assert np.all(loose.goodput >= tight.goodput * 0.99)
    assert np.all(loose.batch_size <= m0 * 64) and np.all(loose.local_bsz <= m0)
    # Efficiency never exceeds 1 at the chosen batches (all at least the initial one).
    assert np.all(fn.efficiency(loose.batch_size) <= 1.0 + 1e-12)
