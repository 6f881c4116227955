"""The training layout contract (``cost_models.batching``): seeded invariants over random layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cost_models import batching


def _layouts(seed: int, n: int = 400) -> list[tuple[int, int, int, int | None]]:
    """(batch, world, K, per-GPU limit) drawn at random: world <= K, batch a multiple of K."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int, int, int | None]] = []
    for _ in range(n):
        k = int(rng.integers(1, 33))
        world = int(rng.integers(1, k + 1))
        batch = k * int(rng.integers(1, 200))
        limit = None if rng.random() < 0.3 else int(rng.integers(1, 300))
        out.append((batch, world, k, limit))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_layout_covers_the_batch_within_the_limit(seed: int) -> None:
    for batch, world, k, limit in _layouts(seed):
        p = batching.plan(batch, world_size=world, logical_workers=k, max_local_bsz=limit)
        micro = batch // k
        # Every logical worker's samples are trained: its chunks hold its micro-batch, none empty.
        assert p.chunks * p.local_bsz >= micro > (p.chunks - 1) * p.local_bsz - p.chunks
        assert limit is None or p.local_bsz <= limit
        assert p.chunks == (1 if limit is None else math.ceil(micro / limit))
        # The busiest GPU runs ceil(K / W) logical workers, each in its chunks.
        assert p.accum_steps + 1 == math.ceil(k / world) * p.chunks
        # The split does not depend on the world size beyond the accumulation (bitwise across sizes).
        one = batching.plan(batch, world_size=1, logical_workers=k, max_local_bsz=limit)
        assert (one.chunks, one.local_bsz) == (p.chunks, p.local_bsz)
        assert one.accum_steps >= p.accum_steps


def test_the_grid_is_the_scalar_plan() -> None:
    rows = _layouts(7, 200)
    for k in {r[2] for r in rows}:
        for limit in (None, 3, 50):
            mine = [r for r in rows if r[2] == k]
            b = np.array([r[0] for r in mine], dtype=np.float64)
            w = np.array([r[1] for r in mine], dtype=np.float64)
            chunks, local, accum = batching.plan_grid(b, w, k, limit)
            for i, (batch, world, _, _) in enumerate(mine):
                p = batching.plan(batch, world_size=world, logical_workers=k, max_local_bsz=limit)
                assert (p.chunks, p.local_bsz, p.accum_steps) == (chunks[i], local[i], accum[i])


def test_plan_refuses_a_batch_that_is_not_a_multiple_of_k() -> None:
    with pytest.raises(ValueError, match="multiple of logical_workers"):
        batching.plan(100, world_size=2, logical_workers=8)
    assert batching.check_layout(100, 8) == "global_batch_size (100) must be a multiple of logical_workers (8)"
    assert batching.check_layout(64, 8, 32) == "max_batch_size (32) is below global_batch_size (64)"
    assert batching.check_layout(64, 8, 64) is None


@pytest.mark.parametrize("seed", [0, 1])
def test_pollux_split_uses_the_fewest_accumulation_steps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(300):
        b, k = int(rng.integers(1, 5000)), int(rng.integers(1, 64))
        limit = float(rng.integers(1, 512))
        local, accum = batching.split(b, k, limit)
        assert local <= limit + 1e-9 and local * k * (accum + 1) == pytest.approx(b)
        assert accum == 0 or b / (k * accum) > limit  # one fewer step would overflow the limit
    assert batching.split(96, 4) == (24.0, 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_caps_rounding_and_candidates_stay_multiples_of_k_within_bounds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(300):
        k = int(rng.integers(1, 33))
        m0 = k * int(rng.integers(1, 20))
        spec_cap = None if rng.random() < 0.4 else m0 + int(rng.integers(0, 5000))
        samples = None if rng.random() < 0.5 else int(rng.integers(1, 20000))
        cap = batching.batch_cap(m0, k, spec_cap, samples)
        assert cap % k == 0 and cap >= m0
        if spec_cap is None and samples is None:
            assert cap == batching.default_cap(m0, k) == m0 * k
        if cap > m0:  # the cap honours the spec and the dataset when it can
            assert cap <= (spec_cap if spec_cap is not None else m0 * k) and (samples is None or cap <= samples)
        target = float(rng.uniform(0, 2 * cap))
        b = batching.round_batch(target, logical_workers=k, init_batch_size=m0, max_batch_size=cap)
        assert b % k == 0 and m0 <= b <= cap
        if m0 + k / 2 <= target <= cap - k / 2:
            assert abs(b - target) <= k / 2 + 1e-9
        grid = batching.candidates(m0, cap, k, count=int(rng.integers(1, 60)), extra=[target])
        assert grid[0] == m0 and grid[-1] == cap and np.all(np.diff(grid) > 0)
        assert np.all(grid % k == 0) and b in grid


def test_the_rebatch_test_needs_the_gain_and_the_payback() -> None:
    rule = batching.RebatchRule(min_gain=0.05, payback_restarts=3.0)
    # 10 % more goodput over 1000 s of work left saves ~91 s: pays three 30 s restarts, not 31 s ones.
    assert batching.rebatch_pays(1.0, 1.1, remaining_s=1000.0, restart_s=30.0, rule=rule)
    assert not batching.rebatch_pays(1.0, 1.1, remaining_s=1000.0, restart_s=31.0, rule=rule)
    # Below the gain threshold nothing pays, however much work is left.
    assert not batching.rebatch_pays(1.0, 1.04, remaining_s=1e9, restart_s=0.0, rule=rule)
    # No work left (or unknown), or no old goodput: no restart.
    assert not batching.rebatch_pays(1.0, 2.0, remaining_s=0.0, restart_s=0.0, rule=rule)
    assert not batching.rebatch_pays(0.0, 2.0, remaining_s=100.0, restart_s=0.0, rule=rule)
    with pytest.raises(ValueError, match="min_gain"):
        batching.RebatchRule(min_gain=-0.1)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_rebatch_test_is_monotone(seed: int) -> None:
    """More gain, more work left or cheaper restarts never turn a restart that pays into one that does not."""
    rng = np.random.default_rng(seed)
    for _ in range(500):
        rule = batching.RebatchRule(float(rng.uniform(0, 0.3)), float(rng.uniform(0, 5)))
        old, new = float(rng.uniform(0.1, 2)), float(rng.uniform(0.1, 4))
        left, d = float(rng.uniform(0, 1e4)), float(rng.uniform(0, 600))
        if batching.rebatch_pays(old, new, remaining_s=left, restart_s=d, rule=rule):
            assert batching.rebatch_pays(old, new * 1.1, remaining_s=left, restart_s=d, rule=rule)
            assert batching.rebatch_pays(old, new, remaining_s=left * 2, restart_s=d, rule=rule)
            assert batching.rebatch_pays(old, new, remaining_s=left, restart_s=d / 2, rule=rule)


def test_local_of_is_the_per_gpu_share_of_a_layout() -> None:
    for batch, world, k, limit in _layouts(3, 100):
        p = batching.plan(batch, world_size=world, logical_workers=k, max_local_bsz=limit)
        if k % world == 0 and p.chunks == 1:  # an even split: exactly the plan's micro-batch
            assert batching.local_of(batch, world, p.accum_steps) == p.local_bsz
    assert batching.local_of(96, 4, 1) == 12.0
