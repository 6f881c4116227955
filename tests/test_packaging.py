"""Packaging: the core install (controller, CLI, local cloud, simulator) needs neither torch nor a cloud SDK.

The imports run in a fresh interpreter whose import system refuses torch, the cloud SDKs and the
other extras' packages, as on a machine where only ``pip install spotrain`` was run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTRAS_ONLY = ("torch", "boto3", "botocore", "safetensors", "sklearn", "moto", "google")

BLOCK = textwrap.dedent(f"""
    import importlib.abc, sys

    class _NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {EXTRAS_ONLY!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
""")


def run_blocked(code: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_core_dependencies_leave_torch_and_cloud_sdks_to_extras() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not names & {"torch", "boto3", "safetensors", "scikit-learn", "google-cloud-compute", "google-cloud-storage"}
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["runtime"])
    assert any(d.startswith("boto3") for d in extras["aws"])
    assert {"google-cloud-compute", "google-cloud-storage"} <= {re.split(r"[<>=]", d)[0] for d in extras["gcp"]}


def test_controller_cli_local_cloud_and_simulator_import_without_the_extras() -> None:
    res = run_blocked("""
        import importlib, pkgutil, sys
        for name in ("autoscaler", "cloud_providers", "cost_models"):
            package = importlib.import_module(name)
            for info in pkgutil.walk_packages(package.__path__, name + "."):
                importlib.import_module(info.name)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in EXTRAS)
        assert not heavy, heavy
        print("ok")
    """.replace("EXTRAS", repr(EXTRAS_ONLY)))
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_every_cli_command_answers_help_without_the_extras() -> None:
    res = run_blocked("""
        import contextlib, io
        from autoscaler.cli.main import COMMANDS, main
        for argv in [["--help"]] + [[name, "--help"] for name in COMMANDS] + [["controller", "start", "--help"]]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                main(argv)
            assert "Usage: spotrain" in out.getvalue(), (argv, out.getvalue())
        print("ok")
    """)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_aws_controller_without_boto3_says_which_extra_in_one_line(tmp_path: Path) -> None:
    res = run_blocked("""
        import sys
        from autoscaler.cli.main import main
        sys.exit(main(["controller", "start", "--cloud", "aws", "--port", "0"]))
    """, env={"SPOTRAIN_HOME": str(tmp_path / "home"), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spotrain: ") and "pip install 'spotrain[aws]'" in lines[0], res.stderr


def test_ci_runs_readmes_test_line_and_the_linters() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.strip().splitlines()
    assert len(lines) == 2 and "spotrain run examples/quickstart/job.yaml" in lines[0]
    ci = (REPO / ".ci" / "run").read_text()
    assert lines[1] in ci.splitlines()
    assert "ruff check ." in ci and "mypy" in ci
    assert ci.index("torch==2.13.0") < ci.index("ruff check .") < ci.index(lines[1])
