"""What every real cloud's boot document shares: the operator's settings for installing and starting
the worker agent, and the agent config as one JSON document.

``aws/userdata.py`` (cloud-init user data) and ``gcp/userdata.py`` (a startup script and a metadata
key) differ in how they carry these to the instance, not in what they carry, so the settings, their
check and the config's serialisation live here once. The job's strings never enter these settings:
they are operator settings, each one line, and the job travels only inside the JSON document.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

AGENT_MODULE = "cloud_providers.remote.agent"
UNIT_NAME = "spotrain-agent"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentBootSettings:
    """How an instance installs and starts the agent. Operator settings, not job data. Each cloud's
    ``AgentBoot`` subclasses this with its image's interpreter and the package extra its store needs."""

    python: str
    package: str
    agent_module: str = AGENT_MODULE
    unit_name: str = UNIT_NAME

    def __post_init__(self) -> None:
        for field in ("python", "package", "agent_module", "unit_name"):
            value = getattr(self, field)
            if not value or any(c in value for c in "\n\r\0"):
                raise ValueError(f"agent boot setting {field}={value!r} must be a non-empty single line")


def config_json(config: Mapping[str, Any]) -> str:
    """The agent config as one canonical JSON document (ValueError if it is not JSON-serialisable)."""
    try:
        return json.dumps(dict(config), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"agent config is not JSON-serialisable: {exc}") from exc


__all__ = ["AGENT_MODULE", "UNIT_NAME", "AgentBootSettings", "config_json"]
