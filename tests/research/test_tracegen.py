"""The trace generator (research/tracegen.py): seeded, heavy-tailed, on the 5-minute grid."""

from __future__ import annotations

import numpy as np

from research.tracegen import SINGLE_ZONE, generate_trace, generate_trace_text


def test_generator_is_seeded_and_heavy_tailed() -> None:
    assert generate_trace_text(SINGLE_ZONE, hours=200, seed=3) == generate_trace_text(SINGLE_ZONE, hours=200, seed=3)
    tr = generate_trace(SINGLE_ZONE, hours=24 * 60, seed=3)
    key = tr.keys[0]
    times = [t for t in tr.change_times()]
    avail = [tr.offering_at(key, t).spot_available for t in times]
    runs = np.diff(np.array(times + [tr.duration_s]))
    up = runs[np.array(avail) > 0] / 3600
    share = up.sum() / (runs.sum() / 3600)
    assert 0.45 < share < 0.8  # mean up 3 h, mean down 2 h
    assert np.max(up) > 5 * np.median(up)  # heavy tail
    assert all(t % 300 == 0 for t in times)
