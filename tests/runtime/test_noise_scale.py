"""The gradient noise scale at known truths from 100 to 100,000 examples and batches 32-512 (issue 20).

Per-example gradients have mean G (|G|^2 = 1) and isotropic covariance Sigma with tr(Sigma) = phi, so the
true noise scale is phi = tr(Sigma) / |G|^2 examples; the project's estimate is ``grad_var / grad_sqr *
M0`` (``cost_models.goodput.efficiency``). Each test feeds 2,000 steps to the estimator as
``runtime/trainer.py`` does with ``trainer.noise_every_steps = 1`` (``estimate`` per step for K logical
workers, ``ConsecutiveSteps`` for one; each into ``GradientNoiseStats`` with ``batch_scale = B / M0``),
at the initial batch (M0 = B), and asks for the truth within 15 %.

How many parameters. One step's estimate of |G|^2 has a relative standard deviation of about
``r = phi / B * sqrt(2 K / ((K - 1) d))`` (noise x noise products; ``_relative_sd``), and 2,000 steps of the
EMA (smoothing 0.999) average about 1,500 of them, so a few-hundred-parameter model at phi / B = 3,000
would need ~10^8 steps for 15 %: no estimator can. Each case therefore takes the model size ``d`` at which
one step's r is 1.75 (the standard error after 2,000 steps is then ~4.5 %, a third of the tolerance), or
256 where that is smaller. That is also where clamping each step at 0 before averaging (the estimator
before issue 20) fails: it reads a true 10,000 or 100,000 21-28 % low.

The estimators read nothing but norms and inner products of the gradients, so n Gaussian gradients in
R^d are drawn as vectors in R^(n+1) with exactly the joint law of their norms and inner products:
coordinate 0 along G, the rest the Bartlett factor of the Wishart matrix of the d - 1 other coordinates.
This lets d reach 10^7 at no cost; ``test_gram_draws_match_plain_draws`` checks it against plain draws.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.stats import ConsecutiveSteps, GradientNoiseStats, estimate

STEPS = 2000
TOLERANCE = 0.15
TARGET_RELATIVE_SD = 1.75
MIN_DIM = 256
NOISE_SCALES = (100, 1_000, 10_000, 100_000)
BATCHES = (32, 128, 512)


def gram_draws(rng: np.random.Generator, shape: tuple[int, ...], dim: int, mean_norm: float, sd: float) -> np.ndarray:
    """``shape[:-1]`` independent groups of ``n = shape[-1]`` independent draws of N(G, sd^2 I_dim), |G| =
    mean_norm, as vectors in R^(n+1) with the draws' exact joint law of norms and inner products."""
    n = shape[-1]
    if dim <= n:
        raise ValueError(f"dim must exceed the draws per group: {dim} <= {n}")
    out = np.empty((*shape, n + 1))
    out[..., 0] = mean_norm + sd * rng.standard_normal(shape)
    lower = np.tril(rng.standard_normal((*shape, n)), -1)  # Bartlett: N(0, 1) below the diagonal ...
    idx = np.arange(n)
    lower[..., idx, idx] = np.sqrt(rng.chisquare(dim - 1 - idx, size=shape))  # ... chi(d - 1 - i) on it
    out[..., 1:] = sd * lower
    return out


def _relative_sd(phi: float, batch: int, k: int, dim: int) -> float:
    """Relative sd of one step's |G|^2 estimate from K samples of B / K examples each (|G|^2 = 1)."""
    q = phi / batch
    return math.sqrt(q * q * 2 * k / ((k - 1) * dim) + 4 * q / dim)


def _dim_for(phi: float, batch: int, k: int, floor: int = MIN_DIM) -> int:
    q = phi / batch
    return max(floor, math.ceil((q * q * 2 * k / (k - 1) + 4 * q) / TARGET_RELATIVE_SD ** 2))


def _sqr(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(x * x, axis=-1))


def noise_scale_logical_workers(phi: float, batch: int, k: int, seed: int) -> tuple[float, int]:
    """(estimated noise scale, d): K logical workers of B / K examples each, one ``estimate`` per step."""
    rng = np.random.default_rng(seed)
    dim = _dim_for(phi, batch, k)
    sd = math.sqrt(phi / (batch // k) / dim)  # per coordinate of a micro-batch mean: tr(Sigma) / b / d
    grads = gram_draws(rng, (STEPS, k), dim, 1.0, sd)  # (steps, K, K + 1)
    local, total = _sqr(grads).mean(axis=1), _sqr(grads.mean(axis=1))
    stats = GradientNoiseStats()
    for lo, to in zip(local, total):
        est = estimate(local_sqr=float(lo), total_sqr=float(to), logical_workers=k, global_batch_size=batch,
                       init_batch_size=batch)
        assert est is not None
        stats.update(*est, batch_scale=1.0)  # B / M0 * noise_every_steps
    assert stats.grad_sqr is not None and stats.grad_var is not None
    return stats.grad_var / max(stats.grad_sqr, 1e-300) * batch, dim


def noise_scale_consecutive(phi: float, batch: int, seed: int) -> tuple[float, int]:
    """(estimated noise scale, d): one logical worker, ``ConsecutiveSteps`` on each step's mean gradient
    (as ``Trainer._consecutive_noise`` with noise_every_steps = 1: every step pairs with the one before)."""
    rng = np.random.default_rng(seed)
    dim = _dim_for(phi, 2 * batch, 2, floor=max(MIN_DIM, STEPS + 2))  # a pair: K = 2 over 2 B examples
    sd = math.sqrt(phi / batch / dim)
    grads = gram_draws(rng, (STEPS + 1,), dim, 1.0, sd)  # one sequence: consecutive pairs share a draw
    pairs, stats = ConsecutiveSteps(), GradientNoiseStats()
    for g in grads:
        est = pairs.update([g[: len(g) // 2], g[len(g) // 2:]], batch_size=batch, init_batch_size=batch)
        if est is not None:
            stats.update(*est, batch_scale=1.0)
    assert stats.grad_sqr is not None and stats.grad_var is not None
    return stats.grad_var / max(stats.grad_sqr, 1e-300) * batch, dim


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("phi", NOISE_SCALES)
def test_noise_scale_within_15_percent_with_logical_workers(phi: int, batch: int) -> None:
    got, dim = noise_scale_logical_workers(phi, batch, 8, seed=phi + batch)
    assert abs(got / phi - 1) <= TOLERANCE, (got, phi, batch, dim)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("phi", NOISE_SCALES)
def test_noise_scale_within_15_percent_one_worker_consecutive_steps(phi: int, batch: int) -> None:
    got, dim = noise_scale_consecutive(phi, batch, seed=phi + batch + 1)
    assert abs(got / phi - 1) <= TOLERANCE, (got, phi, batch, dim)


def test_gram_draws_match_plain_draws() -> None:
    """The R^(n+1) representation has the law of plain Gaussian draws in R^d: the same mean and spread of
    the K-worker estimate and of the consecutive-step estimate (10,000 samples each, d = 300)."""
    rng = np.random.default_rng(3)
    dim, k, n, sd = 300, 4, 10_000, 0.2
    g = rng.normal(0.0, 1.0, dim)
    g /= np.linalg.norm(g)
    plain = g + sd * rng.standard_normal((n, k, dim))
    gram = gram_draws(rng, (n, k), dim, 1.0, sd)
    for draws in (plain, gram):
        assert _sqr(draws).mean() == pytest.approx(1 + dim * sd * sd, rel=0.01)
    stats = []
    for draws in (plain, gram):
        local, total = _sqr(draws).mean(axis=1), _sqr(draws.mean(axis=1))
        sqr = (k * total - local) / (k - 1)
        var = (local - total) * k / (k - 1)
        stats.append((sqr.mean(), sqr.std(), var.mean(), var.std()))
    (ps, pss, pv, pvs), (gs, gss, gv, gvs) = stats
    assert gs == pytest.approx(ps, abs=0.05) and gss == pytest.approx(pss, rel=0.05)
    assert gv == pytest.approx(pv, rel=0.01) and gvs == pytest.approx(pvs, rel=0.05)
    assert pss == pytest.approx(_relative_sd(dim * sd * sd, k, k, dim), rel=0.05)  # the formula above (B = K)
    # Sequences (consecutive pairs share a draw): the products of neighbours have the plain draws' law.
    seq_plain = g + sd * rng.standard_normal((50, 200, dim))
    seq_gram = gram_draws(rng, (50, 200), dim, 1.0, sd)
    for seq in (seq_plain, seq_gram):
        dots = np.sum(seq[:, 1:] * seq[:, :-1], axis=-1)
        assert dots.mean() == pytest.approx(1.0, abs=0.05)
        assert dots.std() == pytest.approx(math.sqrt(dim * sd ** 4 + 2 * sd * sd), rel=0.05)


def test_state_from_before_raw_averaging_loads() -> None:
    """A checkpoint's ``noise`` state written by the clamping estimator (same four keys) loads and keeps
    being averaged; the reported statistics are clamped, the averages are not."""
    old = {"smoothing": 0.999, "sqr_biased": 0.0021, "var_biased": 0.37, "unbias": 0.0021}
    stats = GradientNoiseStats()
    stats.load_state_dict(old)
    assert stats.grad_sqr == pytest.approx(1.0) and stats.grad_var == pytest.approx(0.37 / 0.0021)
    assert stats.state_dict() == old
    for _ in range(5):
        stats.update(-50.0, 1.0, 1.0)  # raw negative estimates pull the average below 0 ...
    assert stats.sqr_biased < 0 and stats.grad_sqr == 0.0  # ... the report clamps at 0 (AdaptDL)
    stats.update(float("nan"), 1.0, 1.0)  # a mixed-precision overflow is skipped, not averaged in
    assert np.isfinite(stats.sqr_biased) and stats.grad_sqr == 0.0
