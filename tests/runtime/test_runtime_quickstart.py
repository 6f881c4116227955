"""The Quickstart script: trains, reports test accuracy, and is bitwise reproducible across restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import rt_launch
from runtime import protocol

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "train.py"
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_quickstart_preempted_and_resized_matches_uninterrupted(tmp_path: Path) -> None:
    def env(name: str) -> dict[str, str]:
        return {"QUICKSTART_EPOCHS": "2", protocol.ENV_CHECKPOINT_URI: f"file://{tmp_path / name}",
                protocol.ENV_PROGRESS_FILE: str(tmp_path / f"{name}.json"), protocol.ENV_JOB_ID: name}

    plain = rt_launch.wait(rt_launch.start(2, env("plain"), script=QUICKSTART))
    assert plain.codes == [0, 0], plain.outputs
    notice = tmp_path / "notice"
    notice.write_text(json.dumps({"reason": "preemption", "deadline_unix_s": 0}))
    first = rt_launch.wait(rt_launch.start(2, {**env("resumed"), protocol.ENV_NOTICE_FILE: str(notice)},
                                           script=QUICKSTART))
    assert first.codes == [protocol.EXIT_RESCHEDULE] * 2, first.outputs
    second = rt_launch.wait(rt_launch.start(1, env("resumed"), script=QUICKSTART))
    assert second.codes == [0], second.outputs
    assert "resumed from checkpoint 1" in second.outputs[0]
    a, b = rt_launch.final_tensors(tmp_path / "plain"), rt_launch.final_tensors(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a) and sorted(a) == sorted(b)
    progress = json.loads((tmp_path / "resumed.json").read_text())
    assert progress["metric_name"] == "test_accuracy" and 0.0 <= progress["metric"] <= 1.0
    assert progress["final_model"] == f"file://{tmp_path / 'resumed'}/final/model.safetensors"
    assert progress["step"] == progress["total_steps"] == 22
