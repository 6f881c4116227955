"""The startup script that installs and starts the worker agent on a GCE instance, without a shell injection.

The twin of ``aws/userdata.py``. The job's strings (name, ``setup``, ``run``, environment) never enter
a script: the agent config travels as one JSON document in its own instance metadata key
(``spotrain-agent-config``), and the ``startup-script`` is fixed text built from operator settings
only (interpreter, package, agent module, unit name, the pinned install source, each
``shlex.quote``d). The script copies the config from the metadata server to a root-only file,
installs spotrain pinned to the controller's version, and starts the agent as a transient systemd
unit. Compute runs ``startup-script`` as root on every boot.

Instance metadata is readable by whoever may ``compute.instances.get`` the instance and by any
process on it. With ``--executor remote`` the config carries the instance's agent credential, bound to
that one launch decision (``autoscaler/remote/executor.py``), never the controller's tokens. Put
nothing else secret here.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from typing import Any

from ..agent_boot import CONFIG_PATH, AgentBootSettings, config_json

CONFIG_KEY = "spotrain-agent-config"
SCRIPT_KEY = "startup-script"
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
# One metadata value may hold 256 KiB; keep the agent config far below.
MAX_CONFIG_BYTES = 64 * 1024
# The interpreter of Google's Deep Learning VM images (see docs/gcp.md).
DEFAULT_PYTHON = "/opt/conda/bin/python"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentBoot(AgentBootSettings):
    """How a GCE instance installs and starts the agent (checked by ``AgentBootSettings``)."""

    python: str = DEFAULT_PYTHON
    # The workers' gs:// checkpoint store needs the Google clients, an extra; the image brings torch.
    package: str = "spotrain[gcp]"

    def script(self) -> str:
        """The fixed startup script: it depends on operator settings only, never on the job."""
        q = shlex.quote
        return "\n".join(
            [
                "#!/bin/bash",
                "set -euo pipefail",
                "umask 077",
                f"install -d -m 0700 {q(CONFIG_PATH.rsplit('/', 1)[0])}",
                f"curl -sSf --retry 5 -H 'Metadata-Flavor: Google' -o {q(CONFIG_PATH + '.tmp')} "
                f"{q(METADATA_URL + CONFIG_KEY)}",
                f"mv -f {q(CONFIG_PATH + '.tmp')} {q(CONFIG_PATH)}",
                # Pinned to the controller's version, from the operator's source (``AgentInstall``).
                *(shlex.join(argv) for argv in self.install_commands()),
                # Startup scripts run on every boot: a unit left from the last one is replaced.
                f"systemctl stop {q(self.unit_name)} 2>/dev/null || true",
                f"systemd-run --unit={q(self.unit_name)} --property=Restart=on-failure "
                f"{q(self.python)} -m {q(self.agent_module)} --config {q(CONFIG_PATH)}",
                "",
            ]
        )


def render(config: Mapping[str, Any], boot: AgentBoot | None = None) -> dict[str, str]:
    """Metadata items (key -> value) that boot the agent with ``config``. ValueError if too big."""
    boot = boot or AgentBoot()
    payload = config_json(config)
    if len(payload.encode()) > MAX_CONFIG_BYTES:
        raise ValueError(f"agent config too large for instance metadata ({len(payload.encode())} > "
                         f"{MAX_CONFIG_BYTES} bytes)")
    return {SCRIPT_KEY: boot.script(), CONFIG_KEY: payload}


def decode(items: Mapping[str, str]) -> dict[str, Any]:
    """The agent config in metadata items rendered by ``render`` (ValueError if there is none)."""
    text = items.get(CONFIG_KEY)
    if text is None:
        raise ValueError("instance metadata has no spotrain agent config")
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"instance metadata is not a spotrain agent config: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError("instance metadata is not a spotrain agent config: not a JSON object")
    return config
