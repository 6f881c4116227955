"""The progress file's last word is the step the script reached (issue 24, item 8: "exited 0 at step 1
of 640" for a script that stopped at step 10). Writes are throttled to one per 0.5 s, so 10 fast steps
after the write at step 1 went unwritten; the writer now flushes at close and at interpreter exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import TensorDataset
    import runtime

    config = runtime.TrainerConfig.from_env(
        training=runtime.TrainingConfig(logical_workers=2, global_batch_size=8, seed=0), epochs=40)
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    model = nn.Linear(4, 2)
    trainer = runtime.ElasticTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), TensorDataset(x, y),
                                     loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]), config=config)
    for step in trainer:
        if step.step >= 10:
            break      # the script's own stop, without trainer.finish()
    if sys.argv[1] == "close":
        trainer.close()
    sys.exit(0)
""")


@pytest.mark.parametrize("how", ["close", "exit"])
def test_a_script_that_stops_at_step_10_leaves_step_10_in_its_progress(tmp_path: Path, how: str) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    progress = tmp_path / "progress.json"
    env = dict(os.environ, SPOTRAIN_PROGRESS_FILE=str(progress), SPOTRAIN_CHECKPOINT_URI=f"file://{tmp_path}/ckpt",
               SPOTRAIN_JOB_ID="progress-at-exit")
    r = subprocess.run([sys.executable, str(tmp_path / "train.py"), how], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    body = json.loads(progress.read_text())
    assert body["step"] == 10 and body["total_steps"] == 40 * 64 // 8, body
