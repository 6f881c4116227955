"""Getting started (issue 13): ``init`` output runs as is, ``offerings`` on the local cloud and on
AWS-on-moto, ``validate`` / ``submit --dry-run``, ``envs:`` reaching the workers, "did you mean" on
unknown fields, and ``estimate`` saying where ``work_gpu_hours`` came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoscaler.cli.main import cli
from autoscaler.cli.templates import FILES
from autoscaler.errors import SpecError
from autoscaler.jobs.spec import parse_spec_text
from support import REPO, run_cli

BASE = "name: j\nrun: python train.py\nresources: {accelerators: [T4:1]}\n"


def invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


@pytest.mark.e2e
def test_init_output_runs_as_is_on_the_local_cloud(spotrain_home: Path, tmp_path: Path) -> None:
    """The skeleton, untouched, succeeds; its EPOCHS comes from the spec's envs (total steps follow it)."""
    r = run_cli("init", str(tmp_path / "proj"))
    assert r.returncode == 0 and "spotrain run" in r.stdout, r.stderr
    spec = tmp_path / "proj" / "job.yaml"
    r = run_cli("run", str(spec), "--set", "envs.EPOCHS=2", "--json", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    job = json.loads(r.stdout.strip().splitlines()[-1])
    assert job["state"] == "SUCCEEDED" and job["name"] == "proj" and job["metric_name"] == "train_mse"
    assert job["total_steps"] == 2 * (1024 // 64) and job["step"] == job["total_steps"]  # EPOCHS=2 reached it
    assert Path(job["final_model"].removeprefix("file://")).is_file()


def test_init_refuses_to_overwrite_and_checks_the_name(tmp_path: Path) -> None:
    code, out = invoke("init", str(tmp_path))
    assert code == 0 and (tmp_path / "train.py").is_file()
    r = run_cli("init", str(tmp_path))
    assert r.returncode == 2 and "exists: not overwritten" in r.stderr and "Traceback" not in r.stderr
    assert invoke("init", str(tmp_path), "--force")[0] == 0
    r = run_cli("init", str(tmp_path / "x"), "--name", "Bad_Name")
    assert r.returncode == 2 and "spec error: name:" in r.stderr and not (tmp_path / "x").exists()


def test_examples_init_is_what_init_writes() -> None:
    for fname, text in FILES.items():
        want = text.format(name="init") if fname.endswith(".yaml") else text
        assert (REPO / "examples" / "init" / fname).read_text() == want, "run: spotrain init examples/init --force"


def test_offerings_on_the_local_cloud() -> None:
    code, out = invoke("offerings")
    assert code == 0 and "ON-DEMAND $/h" in out and "SPOT ROOM" in out and "g4dn.xlarge" in out
    code, out = invoke("offerings", "--accelerator", "t4", "--json")
    rows = json.loads(out)
    assert rows and {r["accelerator"] for r in rows} == {"T4"}
    assert all(r["spot_usd_per_hour"] < r["on_demand_usd_per_hour"] and r["spot_available"] is not None for r in rows)
    r = run_cli("offerings", "--accelerator", "B200")
    assert r.returncode == 2 and "unknown accelerator 'B200'" in r.stderr


@pytest.mark.aws
def test_offerings_on_aws_on_moto(monkeypatch: pytest.MonkeyPatch) -> None:
    moto = pytest.importorskip("moto")
    from aws.harness import DUMMY_ENV, MOTO_ENV

    for k, v in {**DUMMY_ENV, **MOTO_ENV, "SPOTRAIN_AWS_REGIONS": "us-east-1",
                 "SPOTRAIN_AWS_SPOT_PRICES": json.dumps({"g4dn.xlarge": 0.16})}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        code, out = invoke("offerings", "--cloud", "aws", "--accelerator", "T4", "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert rows and all(r["cloud"] == "aws" and r["accelerator"] == "T4" for r in rows)
    g4 = [r for r in rows if r["instance_type"] == "g4dn.xlarge"]
    assert g4 and all(r["spot_usd_per_hour"] == 0.16 and r["on_demand_usd_per_hour"] > 0.16 for r in g4)
    assert all(r["spot_available"] is None for r in rows)  # a real cloud does not say


def test_validate_and_dry_run_contact_nothing(spotrain_home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE + "envs: {EPOCHS: 3, LR: 0.1}\nobjective: {deadline: 36h}\n")
    code, out = invoke("validate", str(spec))
    assert code == 0 and "valid" in out and "deadline 36h" in out and "EPOCHS=3, LR=0.1" in out
    code, out = invoke("submit", str(spec), "--dry-run", "--json")
    assert code == 0 and json.loads(out)["spec"]["envs"] == {"EPOCHS": "3", "LR": "0.1"}
    assert not (spotrain_home / "controller.json").exists()
    r = run_cli("submit", str(spec), "--dry-run", "--set", "training.global_batchsize=8")
    assert r.returncode == 2
    assert r.stderr.strip() == "spotrain: spec error: training.global_batchsize: unknown field (did you mean global_batch_size?)"


@pytest.mark.parametrize(("extra", "message"), [
    ("resorces: {}\n", "resorces: unknown field (did you mean resources?)"),
    ("objective: {dedline: 2h}\n", "objective.dedline: unknown field (did you mean deadline?)"),
    ("zzz: 1\n", "zzz: unknown field"),
    ("envs: {RANK: 1}\n", "envs: RANK is set by spotrain itself"),
    ("envs: {SPOTRAIN_X: 1}\n", "envs: SPOTRAIN_X is set by spotrain itself"),
    ("envs: {a-b: 1}\n", "envs: 'a-b' is not an environment variable name"),
    ("envs: {A: [1]}\n", "envs: A: [1] is not a string or number"),
    ("envs: [A]\n", "envs: must be a mapping"),
])
def test_spec_errors_name_the_field_and_suggest(extra: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec_text(BASE + extra)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_envs_are_strings_for_the_workers() -> None:
    s = parse_spec_text(BASE + "envs: {EPOCHS: 3, FLAG: true, NAME: x}\n")
    assert s.envs == {"EPOCHS": "3", "FLAG": "true", "NAME": "x"}
    assert parse_spec_text(BASE).envs == {}


def test_estimate_says_where_work_gpu_hours_came_from(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE)
    code, out = invoke("estimate", str(spec), "--runs", "2")
    assert code == 0, out
    assert "work: 1 GPU-hours on one reference GPU (the default: the spec sets no simulate.work_gpu_hours" in out
    assert "h of wall-clock (market) time after submission" in out
    code, out = invoke("estimate", str(spec), "--runs", "2", "--set", "simulate.work_gpu_hours=0.5", "--json")
    data = json.loads(out)
    assert data["work_gpu_hours"] == 0.5 and data["work_gpu_hours_source"] == "--set"
    spec.write_text(BASE + "simulate: {work_gpu_hours: 0.25}\n")
    assert json.loads(invoke("estimate", str(spec), "--runs", "2", "--json")[1])["work_gpu_hours_source"] == "spec"


def test_docs_spec_md_is_generated_from_the_model() -> None:
    from autoscaler.cli.spec_doc import render

    assert (REPO / "docs" / "spec.md").read_text() == render(), "run: python -m autoscaler.cli.spec_doc > docs/spec.md"


def test_docs_cli_md_covers_every_command_option_and_exit_code() -> None:
    import click

    from autoscaler import errors
    from autoscaler.cli.main import COMMANDS

    text = (REPO / "docs" / "cli.md").read_text()
    ctx = click.Context(cli)
    missing = []
    for name in COMMANDS:
        if f"## `spotrain {name}" not in text:
            missing.append(f"section spotrain {name}")
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        subs = list(cmd.commands.values()) if isinstance(cmd, click.Group) else [cmd]
        for sub in subs:
            if isinstance(cmd, click.Group) and f"`spotrain {name} {sub.name}" not in text and sub.name not in text:
                missing.append(f"spotrain {name} {sub.name}")
            for p in sub.params:
                missing += [f"{name} {sub.name} {o}" for o in p.opts if o.startswith("--") and o != "--help"
                            and f"`{o}" not in text]
    assert missing == [], f"docs/cli.md lacks: {missing}"
    codes = {c.exit_code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SpotrainError)}
    for code in codes | {0, 130}:
        assert f"\n| {code} |" in text, f"exit code {code} is not in docs/cli.md's table"


def test_one_way_to_end_a_training_script() -> None:
    """Issue 24, item 8: README's loop ended with ``sys.exit(trainer.finish())`` while ``spotrain init``'s
    template used ``runtime.exit_worker(main())``. The runtime recommends ``exit_worker`` (no slow
    teardown after a stop notice); README, docs/runtime.md, the template and every example agree."""
    from autoscaler.cli.templates import TRAIN_PY

    texts = {"README.md": (REPO / "README.md").read_text(), "docs/runtime.md": (REPO / "docs" / "runtime.md").read_text(),
             "init template": TRAIN_PY}
    texts.update({str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "examples").glob("*/train.py"))})
    assert len(texts) >= 6, sorted(texts)
    for where, text in texts.items():
        assert "runtime.exit_worker(" in text, where
        code_lines = [ln.strip() for ln in text.splitlines()]
        assert not [ln for ln in code_lines if ln.startswith(("sys.exit(trainer.finish())", "sys.exit(main())"))], where
