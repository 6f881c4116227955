"""User data never lets job strings reach a shell: they travel base64-encoded JSON, commands are fixed."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from cloud_providers.aws import userdata
from cloud_providers.aws.userdata import CONFIG_PATH, AgentBoot

pytestmark = pytest.mark.aws


def hostile(canary: Path) -> dict[str, object]:
    touch = f"touch {canary}"
    return {
        "job_id": "job-1",
        "name": f"x'; {touch}; echo '",
        "setup": f"$({touch})",
        "run": f"`{touch}`\n{touch}\n\"; {touch}; \"",
        "env": {"A": f"${{IFS}}$({touch})", "B": "line1\nline2", "C": "é ünïcode \\ back\\slash"},
        "workdir": "-rf /",
    }


def test_render_is_cloud_config_with_fixed_commands(tmp_path: Path) -> None:
    config = hostile(tmp_path / "pwned")
    text = userdata.render(config)
    assert text.startswith("#cloud-config\n")
    document = yaml.safe_load(text)
    assert set(document) == {"write_files", "runcmd"}
    (entry,) = document["write_files"]
    assert (entry["path"], entry["permissions"], entry["encoding"]) == (CONFIG_PATH, "0600", "b64")
    assert json.loads(base64.b64decode(entry["content"])) == config
    assert userdata.decode(text) == config
    # The commands do not depend on the job at all.
    assert document["runcmd"] == AgentBoot().commands() == userdata.commands(userdata.render({"job_id": "other"}))
    for needle in ("touch", "pwned", "$(", "${", "`", "-rf", "line2"):
        assert needle not in text


def _shim(bin_dir: Path, name: str, log: Path) -> None:
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done >> {shlex.quote(str(log))}\n'
                      f'printf "\\n" >> {shlex.quote(str(log))}\n')
    script.chmod(0o755)


def test_hostile_strings_never_run_when_cloud_init_executes_the_commands(tmp_path: Path) -> None:
    """Run runcmd the way cloud-init does (list entries shell-quoted into a script run by sh), with
    the interpreter and systemd-run replaced by recorders; and even run the whole user data as a
    shell script. The canary file must never appear."""
    canary = tmp_path / "pwned"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    boot = AgentBoot(python="python-shim")
    for name in ("python-shim", "systemd-run", "install"):
        _shim(bin_dir, name, log)
    text = userdata.render(hostile(canary), boot)
    script = "".join(shlex.join(argv) + "\n" for argv in userdata.commands(text))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    subprocess.run(["sh", "-c", script], check=True, env=env, cwd=tmp_path, timeout=10)
    # One record per call: each argument NUL-terminated, then a newline (arguments may hold newlines).
    recorded = [record.split("\0") for record in log.read_text().split("\0\n") if record]
    assert recorded == [c[1:] for c in boot.commands()]
    subprocess.run(["bash", "-c", text], env=env, cwd=tmp_path, timeout=10, capture_output=True)
    assert not canary.exists()


def test_user_data_limits_and_bad_input() -> None:
    with pytest.raises(ValueError, match="too large"):
        userdata.render({"blob": "x" * 20_000})
    with pytest.raises(ValueError, match="JSON"):
        userdata.render({"x": object()})
    with pytest.raises(ValueError, match="python"):
        AgentBoot(python="python3\nrm -rf /")
    with pytest.raises(ValueError, match="no spotrain agent config"):
        userdata.decode("#cloud-config\n{}\n")
    with pytest.raises(ValueError, match="not a spotrain agent config"):
        userdata.decode("#cloud-config\nwrite_files: [{path: /etc/spotrain/agent.json, content: '!!'}]\n")
