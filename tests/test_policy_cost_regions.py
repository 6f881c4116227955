"""benchmarks/policy_cost.py's multi-region cells (issue 23): egress is billed per region move in
every policy's figure, and omniscient, planned with the egress, stays the lower bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.parametrize("size_gb", [0.0, 4000.0])
def test_a_multi_region_cell_prices_moves_and_omniscient_bounds_it(size_gb: float) -> None:
    import policy_cost as pc

    market = "2 regions x 2 flapping zones"
    starts = [86400.0 * 2, 86400.0 * 11]
    runs = {p: pc._region_task((market, 1.5, size_gb, p, starts))[4] for p in pc.REGION_POLICIES}
    per_move = size_gb * pc.EGRESS_USD_PER_GB
    for p, out in runs.items():
        for x in out:
            assert x["met"], (p, x)
            assert x["egress_usd"] == pytest.approx(per_move * x["moves"])
    for i in range(len(starts)):
        om = runs["omniscient"][i]["cost_usd"]
        for p in ("spotrain", "uniform-progress"):
            assert om <= runs[p][i]["cost_usd"] + 1e-6, (p, i, om, runs[p][i])
    if size_gb:
        # $80 a move: omniscient moves less than when moves are free (and its plan says so).
        free = pc._region_task((market, 1.5, 0.0, "omniscient", starts))[4]
        assert sum(x["moves"] for x in runs["omniscient"]) < sum(x["moves"] for x in free)
