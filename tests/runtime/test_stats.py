"""Gradient-noise estimators against gradients drawn from known distributions (issue 11).

Per-example gradients have mean G and covariance Sigma, so a gradient averaged over b examples has mean G
and covariance Sigma / b. The estimators must recover |G|^2 (``grad_sqr``) and tr(Sigma) / M0 (``grad_var``:
the variance of a gradient at the initial batch M0), whatever the batch, the logical workers and the
noise's shape. Each draw is one step; the estimates are averaged over steps (the runtime's EMA does the
same), and the mean must land within a few standard errors of the truth.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.stats import ConsecutiveSteps, GradientNoiseStats, estimate, estimate_consecutive

DIM = 256
M0 = 32


def _truth(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A mean gradient and a per-example variance per coordinate (diagonal Sigma)."""
    g = rng.normal(0.0, 0.05, DIM)
    var = rng.uniform(0.05, 0.5, DIM)
    return g, var


def _draw(rng: np.random.Generator, g: np.ndarray, var: np.ndarray, examples: int, shape: tuple[int, ...],
          noise: str) -> np.ndarray:
    """Gradients averaged over ``examples`` examples: mean g, covariance diag(var) / examples."""
    sd = np.sqrt(var / examples)
    if noise == "gaussian":
        z = rng.standard_normal((*shape, DIM))
    elif noise == "laplace":  # heavy tails, unit variance
        z = rng.laplace(0.0, 1.0 / np.sqrt(2.0), (*shape, DIM))
    else:  # uniform, unit variance
        z = rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), (*shape, DIM))
    return g + sd * z


def _sqr(x: np.ndarray) -> np.ndarray:
    return np.sum(x * x, axis=-1)


@pytest.mark.parametrize("noise", ["gaussian", "laplace", "uniform"])
@pytest.mark.parametrize("k,batch", [(2, 32), (8, 64), (4, 256)])
def test_logical_worker_estimate_converges_to_truth(noise: str, k: int, batch: int) -> None:
    rng = np.random.default_rng(k * 1000 + batch)
    g, var = _truth(rng)
    steps = 1500
    grads = _draw(rng, g, var, batch // k, (steps, k), noise)  # (steps, K, DIM): one micro-batch each
    local = _sqr(grads).mean(axis=1)
    total = _sqr(grads.mean(axis=1))
    est = np.array([estimate(local_sqr=lo, total_sqr=to, logical_workers=k, global_batch_size=batch,
                             init_batch_size=M0) for lo, to in zip(local, total)])
    true_sqr, true_var = float(g @ g), float(var.sum()) / M0
    for col, truth in ((0, true_sqr), (1, true_var)):
        mean, se = est[:, col].mean(), est[:, col].std() / np.sqrt(steps)
        assert abs(mean - truth) < 4 * se + 0.01 * truth, (col, mean, truth, se)
    # More steps, closer: the error of the running mean shrinks like 1/sqrt(steps).
    err = [abs(est[:n, 1].mean() - true_var) / true_var for n in (15, steps)]
    assert err[1] < 0.05 and err[1] < err[0] + 1e-9


def test_ema_of_estimates_converges_and_is_bias_corrected() -> None:
    rng = np.random.default_rng(7)
    g, var = _truth(rng)
    k, batch = 4, 128
    stats = GradientNoiseStats(smoothing=0.99)
    for _ in range(800):
        grads = _draw(rng, g, var, batch // k, (k,), "gaussian")
        est = estimate(local_sqr=float(_sqr(grads).mean()), total_sqr=float(_sqr(grads.mean(axis=0))),
                       logical_workers=k, global_batch_size=batch, init_batch_size=M0)
        assert est is not None
        stats.update(*est, batch_scale=batch / M0)
    assert stats.grad_sqr == pytest.approx(float(g @ g), rel=0.1)
    assert stats.grad_var == pytest.approx(float(var.sum()) / M0, rel=0.1)
    first = GradientNoiseStats(smoothing=0.999)
    first.update(3.0, 5.0, 1.0)  # the bias correction makes one sample its own estimate
    assert (first.grad_sqr, first.grad_var) == (pytest.approx(3.0), pytest.approx(5.0))


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_consecutive_steps_estimate_converges_to_truth(noise: str) -> None:
    """One logical worker (AdaptDL's differenced estimator): two consecutive steps are the two samples."""
    rng = np.random.default_rng(11)
    g, var = _truth(rng)
    batch, steps = 64, 2000
    est = ConsecutiveSteps()
    out = []
    for grad in _draw(rng, g, var, batch, (steps,), noise):
        r = est.update([grad[:100], grad[100:]], batch_size=batch, init_batch_size=M0)  # two "parameters"
        if r is not None:
            out.append(r)
    arr = np.array(out)
    assert len(out) == steps - 1
    assert arr[:, 0].mean() == pytest.approx(float(g @ g), rel=0.05)
    assert arr[:, 1].mean() == pytest.approx(float(var.sum()) / M0, rel=0.05)


def test_consecutive_steps_formula_reset_and_batch_change() -> None:
    a, b = np.array([1.0, 2.0]), np.array([3.0, 0.0])
    prev, cur, mean = float(a @ a), float(b @ b), float(((a + b) / 2) @ ((a + b) / 2))
    sqr, var = estimate_consecutive(prev_sqr=prev, cur_sqr=cur, mean_sqr=mean, batch_size=8, init_batch_size=4)
    assert sqr == pytest.approx(2 * mean - (prev + cur) / 2)
    assert var == pytest.approx(((prev + cur) / 2 - mean) * 2 * 8 / 4)
    est = ConsecutiveSteps()
    assert est.update([a], batch_size=8, init_batch_size=4) is None  # first step: nothing to pair with
    assert est.update([b], batch_size=8, init_batch_size=4) == pytest.approx((sqr, var))
    assert est.update([a], batch_size=16, init_batch_size=4) is None  # batch changed: not one distribution
    est.reset()
    assert est.update([a], batch_size=16, init_batch_size=4) is None
    a[:] = 0.0  # the estimator kept its own copy
    assert est.update([b], batch_size=16, init_batch_size=4) is not None


def test_consecutive_steps_on_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    mean, sd, batch = torch.full((500,), 0.1), 0.5, 16
    est = ConsecutiveSteps()
    out = []
    for _ in range(400):
        grad = mean + sd / batch ** 0.5 * torch.randn(500, generator=gen)
        r = est.update([grad.view(20, 25)], batch_size=batch, init_batch_size=batch)
        if r is not None:
            out.append(r)
    arr = np.array(out)
    assert arr[:, 0].mean() == pytest.approx(float(mean.pow(2).sum()), rel=0.1)
    assert arr[:, 1].mean() == pytest.approx(500 * sd ** 2 / batch, rel=0.05)
