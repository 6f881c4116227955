"""``spotrain controller start --cloud gcp`` and ``make_provider``: credentials checked once, one-line errors
(no credentials, no SDK, no stand-in endpoint for --executor local), and a controller serving on the fake."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_packaging import run_blocked

from cloud_providers.errors import CredentialsError
from cloud_providers.gcp import make_provider
from support import REPO, start_controller

from .fake_compute import FakeCompute

pytestmark = pytest.mark.gcp

NO_CREDENTIALS = {"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/spotrain-test-key.json",
                  "CLOUDSDK_CONFIG": "/nonexistent/gcloud", "GCE_METADATA_HOST": "127.0.0.1:9",
                  "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "True"}


def _controller_start(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRAIN_GCP_", "GOOGLE_"))}
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--cloud", "gcp", "--port", "0", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**clean, "SPOTRAIN_HOME": str(tmp_path / "home"), **env},
    )


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spotrain: "), res.stderr
    return lines[0]


def test_missing_credentials_are_one_line_at_start(tmp_path: Path) -> None:
    line = _one_line(_controller_start(tmp_path, "--executor", "remote", env={
        **NO_CREDENTIALS, "SPOTRAIN_GCP_PROJECT": "p"}))
    assert "gcp: GCP credentials not found" in line and "gcloud auth application-default login" in line


def test_local_executor_needs_a_stand_in_endpoint(tmp_path: Path) -> None:
    line = _one_line(_controller_start(tmp_path, env={"SPOTRAIN_GCP_PROJECT": "p"}))
    assert "SPOTRAIN_GCP_ENDPOINT" in line and "--executor remote" in line


def test_without_the_sdk_gcp_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    res = run_blocked("""
        import sys
        from autoscaler.cli.main import main
        sys.exit(main(["controller", "start", "--cloud", "gcp", "--port", "0"]))
    """, env={"SPOTRAIN_HOME": str(tmp_path / "home"), "SPOTRAIN_GCP_ENDPOINT": "http://127.0.0.1:9",
              "SPOTRAIN_GCP_PROJECT": "p"})
    line = _one_line(res)
    assert "pip install 'spotrain[gcp]'" in line


def test_make_provider_checks_credentials_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in NO_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SPOTRAIN_GCP_ENDPOINT", raising=False)
    with pytest.raises(CredentialsError) as info:
        make_provider(controller_id="c", project="p")
    assert "\n" not in str(info.value)


def test_make_provider_rejects_bad_settings(gcp_fake_env: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown GCP provider setting"):
        make_provider(controller_id="c", region="us-central1")
    with pytest.raises(ValueError, match="controller_id"):
        make_provider()
    with pytest.raises(ValueError, match="must be http"):
        make_provider(controller_id="c", endpoint="127.0.0.1:9")
    with pytest.raises(ValueError, match="not zones of regions"):
        make_provider(controller_id="c", regions="us-east1", zones="us-central1-a")
    monkeypatch.setenv("SPOTRAIN_GCP_SPOT_PRICES", "[1, 2]")
    with pytest.raises(ValueError, match="SPOTRAIN_GCP_SPOT_PRICES"):
        make_provider(controller_id="c")
    monkeypatch.setenv("SPOTRAIN_GCP_SPOT_PRICES", '{"g2-standard-4": 0.25}')
    monkeypatch.delenv("SPOTRAIN_GCP_PROJECT")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    with pytest.raises(ValueError, match="SPOTRAIN_GCP_PROJECT"):
        make_provider(controller_id="c")


def test_controller_serves_on_the_fake(tmp_path: Path, gcp_fake_wall: FakeCompute) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = start_controller(home, "--cloud", "gcp", "--id", "ctl-gcp-smoke", env=gcp_fake_wall.env())
    try:
        assert gcp_fake_wall.count("GET", r"/machineTypes$") >= 1  # offerings were listed at start
        assert gcp_fake_wall.count("GET", r"/aggregated/instances$") >= 1  # recovery listed instances
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert "cloud gcp" in (home / "controller.log").read_text()
