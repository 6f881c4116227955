"""A torch-free worker that speaks the worker protocol, for fast controller tests.

It counts steps (``PW_STEPS`` total, ``PW_STEP_S`` seconds each), resumes from the step it recorded
under the checkpoint URI, writes progress, stops with exit 85 at the next step after a notice, and
exits with ``PW_FAIL_CODE`` at step ``PW_FAIL_AT`` when asked (a user bug); ``PW_IGNORE_NOTICE=1`` makes
it ignore notices; ``PW_SAY_START=1`` makes each rank print the step it starts at. The real runtime is tested
end to end elsewhere; this isolates the controller's state machine.
"""

import json
import os
import sys
import time
from pathlib import Path

rank = int(os.environ.get("RANK", "0"))
uri = os.environ["SPOTRAIN_CHECKPOINT_URI"]
ckpt = Path(uri.removeprefix("file://")) / "checkpoints"
ckpt.mkdir(parents=True, exist_ok=True)
steps = int(os.environ.get("PW_STEPS", "20"))
step_s = float(os.environ.get("PW_STEP_S", "0.05"))
fail_at = int(os.environ.get("PW_FAIL_AT", "-1"))
fail_code = int(os.environ.get("PW_FAIL_CODE", "3"))
# A script that never looks at its notices (or hangs in a collective): it must be stopped for it.
ignore_notice = os.environ.get("PW_IGNORE_NOTICE") == "1"
# ``PW_PRINT=1``: each rank prints a line per step, as a training script logs (``spotrain logs``, the dashboard).
say = os.environ.get("PW_PRINT") == "1"
notice = Path(os.environ["SPOTRAIN_NOTICE_FILE"])
progress = Path(os.environ["SPOTRAIN_PROGRESS_FILE"])
state = ckpt / "step.txt"
step = int(state.read_text() or 0) if state.exists() else 0
if os.environ.get("PW_SAY_START") == "1":
    print(f"rank {rank}: starting at step {step}", flush=True)


def save_step():
    """Rank 0 records the step atomically: another rank may be reading it as it starts."""
    tmp = state.with_suffix(".tmp")
    tmp.write_text(str(step))
    os.replace(tmp, state)


def report(extra=None):
    if rank != 0:
        return
    d = {"step": step, "total_steps": steps, "metric": step / steps, "metric_name": "fraction",
         "world_size": int(os.environ.get("WORLD_SIZE", "1")), "last_checkpoint_step": step}
    d.update(extra or {})
    tmp = progress.with_suffix(".tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, progress)


# Steps keep a steady pace (step k of this process ends k * step_s after it began training), so a
# loaded machine's file writes do not stretch the run: tests compare its market time with a model.
began, first = time.monotonic(), step
while step < steps:
    if notice.exists() and not ignore_notice:
        if rank == 0:
            save_step()
        report()
        sys.exit(85)
    if step == fail_at:
        print(f"rank {rank}: simulated user bug at step {step}", flush=True)
        sys.exit(fail_code)
    time.sleep(max(0.0, began + (step - first + 1) * step_s - time.monotonic()))
    step += 1
    if say:
        print(f"rank {rank}: step {step} of {steps}", flush=True)
    if rank == 0:
        save_step()
    report()
if rank == 0:
    final = Path(uri.removeprefix("file://")) / "final"
    final.mkdir(parents=True, exist_ok=True)
    (final / "model.safetensors").write_bytes(b"fake")
    report({"final_model": uri + "/final/model.safetensors"})
sys.exit(0)
