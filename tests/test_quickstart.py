"""The product end to end: README's Quickstart job on the local cloud with the real runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import REPO, run_cli, worker_pids

QUICKSTART = REPO / "examples" / "quickstart"


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def tensors(uri: str) -> dict:
    from safetensors.torch import load_file

    return load_file(uri.removeprefix("file://"))


@pytest.mark.e2e
def test_quickstart_survives_a_preemption(spotrain_home: Path) -> None:
    r = run_cli("run", str(QUICKSTART / "job.yaml"), "--json", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    job = last_json(r.stdout)
    assert job["state"] == "SUCCEEDED"
    assert job["preemptions"] >= 1
    assert job["metric_name"] == "test_accuracy" and job["metric"] > 0.9
    assert 0 < job["cost_usd"] < job["on_demand_cost_usd"]
    assert job["final_model"].endswith(f"{job['job_id']}/final/model.safetensors")
    assert tensors(job["final_model"])
    # The human summary (on stderr with --json) names what a user looks for.
    for words in ("test_accuracy", "preemptions", "survived", "on-demand", "spot"):
        assert words in r.stderr
    assert "preemption-notice" in r.stderr
    assert worker_pids("train.py") == []
    # status and logs still work with no controller running.
    st = run_cli("status", job["job_id"], "--json")
    assert st.returncode == 0 and last_json(st.stdout)["state"] == "SUCCEEDED"
    logs = run_cli("logs", job["job_id"])
    assert logs.returncode == 0 and "test_accuracy" in logs.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_bitwise_identical_through_preemptions_and_resizes(spotrain_home: Path) -> None:
    """EasyScale's promise through the whole product: fixed workers on a calm market, and a stormy
    market with capacity changes and preemptions, give final weights with equal tensors."""
    env = {"QUICKSTART_EPOCHS": "6"}
    calm = run_cli("run", str(QUICKSTART / "job.yaml"), "--scenario", str(QUICKSTART / "scenarios" / "calm.yaml"),
                   "--set", "workers.min=2", "--set", "training.determinism=bitwise", "--json", env=env, timeout=180)
    assert calm.returncode == 0, calm.stderr[-3000:]
    storm = run_cli("run", str(QUICKSTART / "job.yaml"), "--scenario", str(QUICKSTART / "scenarios" / "storm.yaml"),
                    "--set", "training.determinism=bitwise", "--json", env=env, timeout=240)
    assert storm.returncode == 0, storm.stderr[-3000:]
    a, b = last_json(calm.stdout), last_json(storm.stdout)
    assert a["preemptions"] == 0 and b["preemptions"] >= 2
    assert b["attempts"] >= 3
    ta, tb = tensors(a["final_model"]), tensors(b["final_model"])
    assert sorted(ta) == sorted(tb)
    import torch

    assert all(torch.equal(ta[k], tb[k]) for k in ta)
