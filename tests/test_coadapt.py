"""Co-adaptation on a live job (issue 20, item 4): ``examples/coadapt`` under its scenario on the local
cloud. Spot capacity goes 2 -> 1 -> 2; the controller shrinks and grows the gang, and each new gang
trains at the batch the controller's directive sets. Every ``batch`` event names its source, and with a
controller running the job that source is always the controller (the runtime's own re-optimisation is
only for runs without one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import run_cli

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "coadapt"
EVENT = re.compile(r"^\d\d:\d\d:\d\d\s+(\S+)\s+(.*)$")


@pytest.mark.e2e
@pytest.mark.slow
def test_the_controller_grows_shrinks_and_sets_the_batch_of_a_live_job(spotrain_home: Path) -> None:
    r = run_cli("run", str(EXAMPLE / "job.yaml"), "--scenario", str(EXAMPLE / "scenarios" / "capacity.yaml"),
                "--policy-params", str(EXAMPLE / "policy.yaml"), "--json", "--quiet", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    job = json.loads(r.stdout.strip().splitlines()[-1])
    assert job["state"] == "SUCCEEDED", job
    logs = run_cli("logs", job["job_id"])
    assert logs.returncode == 0, logs.stderr
    events = [(m[1], m[2]) for m in map(EVENT.match, logs.stdout.splitlines()) if m]
    gangs = [int(m[1]) for kind, why in events if (m := re.search(r"attempt \d+: (\d+) worker\(s\)", why))]
    assert max(gangs) >= 2 and min(gangs) == 1, gangs  # grown past one worker, and shrunk to one
    batches = [why for kind, why in events if kind == "batch"]
    assert batches and all(why.endswith("; source=controller") for why in batches), batches
    sizes = [int(m[1]) for why in batches if (m := re.search(r"batch (\d+) ", why))]
    assert len(batches) >= 2 and len(sizes) == len(batches), batches
    # The workers trained at what the controller said: none changed its batch on its own.
    assert "source=runtime" not in logs.stdout and "re-optimized every" not in logs.stdout
