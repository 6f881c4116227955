"""Builds the provider and executor a controller runs with (``--cloud``, ``--executor``).

Cloud SDKs are imported only when their cloud is chosen, so the CLI stays fast and the local cloud
needs no cloud account.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cloud_providers.base import Provider
from cloud_providers.executor import Executor
from cloud_providers.local.executor import LocalExecutor
from cloud_providers.local.market import MarketTrace
from cloud_providers.local.provider import DEFAULT_TIME_SCALE, LocalProvider
from cloud_providers.local.scenario import Scenario

from .home import localcloud_dir


@dataclasses.dataclass
class CloudSetup:
    provider: Provider
    executor: Executor
    # Provider-clock seconds per wall second (the local cloud's time compression).
    clock_rate: float


def local_cloud(
    cloud_id: str, *, scenario: Scenario | None = None, trace_path: Path | None = None,
    time_scale: float | None = None,
) -> CloudSetup:
    root = localcloud_dir(cloud_id)
    executor = LocalExecutor(root / "executor")
    scenario = scenario or Scenario()
    trace_file = trace_path or scenario.market
    trace = MarketTrace.load(trace_file) if trace_file else MarketTrace.bundled()
    scale = time_scale or scenario.time_scale or DEFAULT_TIME_SCALE

    def progress_of(job_id: str) -> int | None:
        p = executor.progress(job_id)
        step = p.get("step") if p else None
        return int(step) if isinstance(step, (int, float)) else None

    provider = LocalProvider(
        root=root / "cloud", trace=trace, time_scale=scale, scenario=scenario,
        on_terminate=executor.stop, progress_of=progress_of,
    )
    return CloudSetup(provider, executor, provider.time_scale)


def make_cloud(cloud: str, *, cloud_id: str, executor: str = "local") -> CloudSetup:
    if executor != "local":
        raise ValueError(f"unknown executor {executor!r} (only 'local' runs workers on this machine)")
    if cloud == "local":
        return local_cloud(cloud_id)
    if cloud == "aws":
        from cloud_providers.aws import make_provider  # lazily: boto3 is only needed for AWS

        root = localcloud_dir(cloud_id)
        return CloudSetup(make_provider(controller_id=cloud_id), LocalExecutor(root / "executor"), 1.0)
    raise ValueError(f"cloud {cloud!r} is not available yet (choose local or aws)")
