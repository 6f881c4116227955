"""The product end to end: README's Quickstart job on the local cloud with the real runtime."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from support import REPO, run_cli, worker_pids

QUICKSTART = REPO / "examples" / "quickstart"


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def readme_snippet(marker: str) -> str:
    """The fenced code block right after ``<!-- marker -->`` in README.md: the text users read is
    the text the test runs."""
    text = (REPO / "README.md").read_text()
    after = text.split(f"<!-- {marker} -->", 1)[1]
    assert after.lstrip().startswith("```python"), after[:80]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def load_with_readme_snippet(final_model: str) -> Any:
    """README's three lines, run as written, with the Quickstart's module and ``final_model`` from
    ``spotrain status JOB --json`` (issue 24, item 7)."""
    spec = importlib.util.spec_from_file_location("quickstart_train", QUICKSTART / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    code = readme_snippet("quickstart-load-weights")
    assert len(code.strip().splitlines()) == 3, code
    scope: dict[str, Any] = {"DigitsCNN": train.DigitsCNN, "final_model": final_model}
    exec(compile(code, "README.md", "exec"), scope)
    _, test_set = train.digits(0)
    return train.accuracy(scope["model"], test_set)


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
    # README's loading lines give back the model that scored the job's metric.
    assert load_with_readme_snippet(last_json(st.stdout)["final_model"]) == pytest.approx(job["metric"], abs=1e-6)
    logs = run_cli("logs", job["job_id"])
    assert logs.returncode == 0 and "test_accuracy" in logs.stdout
    # Its report picture (issue 13): a PNG, drawn from the database with no controller running.
    png = spotrain_home / "quickstart-report.png"
    rep = run_cli("report", job["job_id"], "-o", str(png))
    assert rep.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", rep.stderr


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
                    "--set", "workers.min=1", "--set", "training.determinism=bitwise", "--json", env=env, timeout=240)
    assert storm.returncode == 0, storm.stderr[-3000:]
    a, b = last_json(calm.stdout), last_json(storm.stdout)
    assert a["preemptions"] == 0 and b["preemptions"] >= 2
    # At least one resume from a checkpoint on other workers (a gang under notice is replaced once,
    # so two preemptions close together may cost a single restart).
    assert b["attempts"] >= 2
    ta, tb = tensors(a["final_model"]), tensors(b["final_model"])
    assert sorted(ta) == sorted(tb)
    import torch

    assert all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.e2e
@pytest.mark.slow
def test_corrupt_newest_checkpoint_resumes_from_the_previous(spotrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preempted job whose newest checkpoint got damaged (a flipped byte) resumes from the one
    before it and still finishes: the runtime verifies sha256 on load and falls back."""
    from autoscaler.controller import Controller
    from autoscaler.fleet.clouds import local_cloud
    from autoscaler.home import db_url
    from autoscaler.jobs.spec import load_spec
    from autoscaler.policy import get_policy
    from autoscaler.state import Store
    from cloud_providers.local.scenario import parse_scenario

    monkeypatch.setenv("QUICKSTART_EPOCHS", "4")
    setup = local_cloud("t-corrupt", scenario=parse_scenario("events:\n  - {at_step: 60, preempt: 1}\n", base_dir=QUICKSTART))
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                     controller_id="t-corrupt", tick_s=0.1, clock_rate=setup.clock_rate)
    # Periodic checkpoints every 10 market seconds (1/6 of a real second), so there is a previous one to fall back to.
    spec, workdir = load_spec(QUICKSTART / "job.yaml", overrides=["checkpoint.interval=10s", "workers.min=1", "workers.max=1"])
    job = ctl.submit(spec, workdir)
    ckpts = Path(job["checkpoint_uri"].removeprefix("file://")) / "checkpoints"
    damaged: list[tuple[int, int]] = []
    real_start = setup.executor.start

    def start_after_damage(launch):  # type: ignore[no-untyped-def]
        if launch.attempt == 2 and not damaged:
            steps = sorted(int(p.name) for p in ckpts.iterdir() if (p / "manifest.json").exists())
            assert len(steps) >= 2, steps
            newest = ckpts / str(steps[-1])
            victim = sorted(f for f in newest.iterdir() if f.name.endswith(".safetensors"))[0]
            data = bytearray(victim.read_bytes())
            data[-5] ^= 0x01
            victim.write_bytes(bytes(data))
            damaged.append((steps[-2], steps[-1]))
        return real_start(launch)

    monkeypatch.setattr(setup.executor, "start", start_after_damage)
    deadline = time.time() + 150
    while time.time() < deadline:
        ctl.tick()
        info = ctl.job_info(job["job_id"])
        if info["state"] in {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_BUDGET", "FAILED_NO_RESOURCE"}:
            break
        time.sleep(0.1)
    assert info["state"] == "SUCCEEDED", info
    assert damaged, "the job was never restarted"
    previous, newest = damaged[0]
    from autoscaler.home import logs_dir

    log = (logs_dir(job["job_id"]) / "attempt-2-rank-0.log").read_text()
    assert f"resumed from checkpoint {previous} " in log, log[-2000:]
    assert f"resumed from checkpoint {newest} " not in log
    assert tensors(info["final_model"])


@pytest.mark.e2e
def test_same_script_under_torchrun_and_plain_python(tmp_path: Path) -> None:
    """Users who bring their own cluster run the script under plain torchrun; with no SPOTRAIN_*
    environment it uses local defaults, and in bitwise mode 2 torchrun processes give the same
    weights as one plain `python train.py`."""
    import os
    import subprocess
    import sys

    from support import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRAIN_")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", QUICKSTART_EPOCHS="2")
    script = str(QUICKSTART / "train.py")
    runs = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                     f"--master_port={free_port()}", script],
        "python": [sys.executable, script],
    }
    weights = {}
    for name, cmd in runs.items():
        cwd = tmp_path / name
        cwd.mkdir()
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        final = cwd / "spotrain_checkpoints" / "local" / "final" / "model.safetensors"
        assert final.exists()
        weights[name] = tensors(str(final))
    import torch

    assert sorted(weights["torchrun"]) == sorted(weights["python"])
    assert all(torch.equal(weights["torchrun"][k], weights["python"][k]) for k in weights["python"])


def test_examples_extra_installs_what_the_loading_lines_import() -> None:
    """Issue 24, item 7: README's loading lines import safetensors, which `spotrain[examples]` lacked."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "safetensors" for d in extras["examples"]), extras["examples"]
    assert "from safetensors" in readme_snippet("quickstart-load-weights")
