"""User data that installs and starts the worker agent on a real instance, without a shell injection.

The job's strings (name, ``setup``, ``run``, environment) are never spliced into a script. They travel
as one JSON document, base64-encoded inside cloud-init ``write_files`` (so no YAML or shell quoting
is involved), to a root-only file; the commands cloud-init runs are a fixed argv list chosen by the
operator (interpreter, package, agent module, the pinned install source: ``agent_boot.AgentInstall``)
that only names that file. cloud-init quotes list-form
``runcmd`` entries itself, and our entries contain no job data anyway. The agent reads the file and
runs the user's commands as its own child processes.

The document is written as JSON, which is also YAML, so no YAML emitter decides our quoting.
User data is readable by anyone allowed ``ec2:DescribeInstanceAttribute``. With ``--executor remote``
the config carries the instance's agent credential (``autoscaler/remote/executor.py``): it is bound to
that one launch decision, so reading it exposes that instance's agent endpoints only, never the
controller's tokens (docs/aws.md, "Workers on real instances"). Put nothing else secret here.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from ..agent_boot import CONFIG_PATH, AgentBootSettings, config_json

# EC2 accepts at most 16 KiB of user data (before its own base64 encoding).
MAX_USER_DATA_BYTES = 16 * 1024
# The PyTorch Deep Learning AMI's interpreter (see docs/aws.md).
DEFAULT_PYTHON = "/opt/pytorch/bin/python"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentBoot(AgentBootSettings):
    """How an EC2 instance installs and starts the agent (checked by ``AgentBootSettings``)."""

    python: str = DEFAULT_PYTHON
    # The workers' s3:// checkpoint store needs boto3, an extra; the image brings torch.
    package: str = "spotrain[aws]"

    def commands(self) -> list[list[str]]:
        """Fixed argv lists: they depend on operator settings only, never on the job. The agent is
        installed pinned to the controller's version from the operator's source (``AgentInstall``)."""
        return [
            *self.install_commands(),
            # A transient systemd service: restarted if it crashes, logs in the journal.
            [
                "systemd-run",
                f"--unit={self.unit_name}",
                "--property=Restart=on-failure",
                self.python,
                "-m",
                self.agent_module,
                "--config",
                CONFIG_PATH,
            ],
        ]


def render(config: Mapping[str, Any], boot: AgentBoot | None = None) -> str:
    """cloud-config text carrying ``config`` (JSON-serialisable) for the agent. ValueError if too big."""
    boot = boot or AgentBoot()
    payload = config_json(config).encode()
    document = {
        "write_files": [
            {
                "path": CONFIG_PATH,
                "permissions": "0600",
                "owner": "root:root",
                "encoding": "b64",
                "content": base64.b64encode(payload).decode("ascii"),
            }
        ],
        "runcmd": boot.commands(),
    }
    text = "#cloud-config\n" + json.dumps(document, indent=1, ensure_ascii=True) + "\n"
    if len(text.encode()) > MAX_USER_DATA_BYTES:
        raise ValueError(
            f"agent config too large for EC2 user data ({len(text.encode())} > {MAX_USER_DATA_BYTES} bytes)"
        )
    return text


def decode(text: str) -> dict[str, Any]:
    """The agent config inside user data rendered by ``render`` (ValueError if there is none)."""
    try:
        document = yaml.safe_load(text)
        for entry in document.get("write_files", []):
            if entry.get("path") == CONFIG_PATH:
                config = json.loads(base64.b64decode(entry["content"], validate=True))
                if isinstance(config, dict):
                    return config
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, binascii.Error, ValueError) as exc:
        raise ValueError(f"user data is not a spotrain agent config: {exc}") from exc
    raise ValueError("user data has no spotrain agent config")


def commands(text: str) -> Sequence[Sequence[str]]:
    """The runcmd argv lists of rendered user data (for tests and operators inspecting an instance)."""
    document = yaml.safe_load(text)
    return [list(map(str, c)) for c in document.get("runcmd", [])]
