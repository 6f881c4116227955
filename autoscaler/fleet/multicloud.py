"""One controller over several clouds: a provider made of providers (``controller start --cloud aws,gcp``).

The controller, its policy and its recovery know one provider; :class:`MultiCloudProvider` is that
provider for several clouds at once, in the SkyPilot manner of one narrow contract routed by provider
name. What it does beyond routing is what makes one decision over all clouds sound:

- ``offerings()`` is every cloud's offerings, so one policy decision ranks them all by goodput per
  dollar (``resources.clouds: [aws, gcp]`` then really chooses between them). A cloud whose catalog
  cannot be read this tick is offered from its last good answer, with a warning; with none, it is
  left out of the decision rather than stopping the other clouds (no catalog at all is an error).
- ``launch`` goes to the cloud named by the offering (an offering key begins with its cloud);
  ``billing`` and ``boot_config`` to the instance's cloud; ``terminate`` to the cloud that reported the
  instance, and when it has never been seen here (a new controller before recovery lists), to every
  cloud, each taking an id it does not know as already gone.
- ``list_instances`` is the union, and fails if any cloud cannot answer: recovery must never take the
  instances of an unreachable cloud for gone. ``poll`` fails the same way, but keeps what the clouds
  that did answer reported, and hands it over with the next poll, so no change is lost.
- ``min_billed_s`` is the largest of the clouds' minimum bills: the budget guard then never launches
  anywhere what the budget could not pay for (EC2 and Compute Engine both bill at least 60 s).

All clouds must share a clock (real clouds run on wall time). The local cloud cannot join: its market
trace names real clouds (``aws/...`` offerings that are not AWS's) and it runs time-compressed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from cloud_providers.base import MIN_BILLED_S_ATTR, Billing, Instance, LaunchRequest, Offering, Provider
from cloud_providers.errors import InstanceNotFound, InvalidRequest, ProviderError

log = logging.getLogger("spotrain.multicloud")


def check_clouds(names: Sequence[str]) -> None:
    """ValueError, in one line, unless ``names`` can share one controller (called before any is built)."""
    if len(names) < 2:
        raise ValueError(f"a multi-cloud provider needs at least two clouds, got {list(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"each cloud may appear once, got {','.join(names)}")
    if "local" in names:
        raise ValueError("the local cloud cannot share a controller with other clouds: it stands in for "
                         "aws and gcp under their names, on a compressed clock (use --cloud local alone)")


class MultiCloudProvider:
    """The providers of ``providers`` (distinct ``name`` each: ``aws``, ``gcp``) as one."""

    def __init__(self, providers: Sequence[Provider]) -> None:
        names = [p.name for p in providers]
        check_clouds(names)
        self.providers: dict[str, Provider] = {p.name: p for p in providers}
        self.name = ",".join(names)
        self.min_billed_s = max(float(getattr(p, MIN_BILLED_S_ATTR, 0.0) or 0.0) for p in providers)
        self._lock = threading.Lock()
        self._cloud_of: dict[str, str] = {}  # instance id -> cloud that reported it
        self._last_offerings: dict[str, list[Offering]] = {}
        self._unreported: dict[str, list[Instance]] = {}  # poll results kept over a failed poll

    # ----- routing helpers -----
    def _cloud(self, cloud: str, what: str) -> Provider:
        provider = self.providers.get(cloud)
        if provider is None:
            raise InvalidRequest(f"{what}: cloud {cloud!r} is not one of this controller's ({self.name})",
                                 cloud=cloud)
        return provider

    def _learn(self, cloud: str, instances: Sequence[Instance]) -> list[Instance]:
        with self._lock:
            for inst in instances:
                self._cloud_of[inst.instance_id] = cloud
        return list(instances)

    # ----- the provider contract -----
    def now_s(self) -> float:
        return next(iter(self.providers.values())).now_s()

    def offerings(self) -> Sequence[Offering]:
        out: list[Offering] = []
        failures: list[str] = []
        for cloud, provider in self.providers.items():
            try:
                found = list(provider.offerings())
            except ProviderError as exc:
                cached = self._last_offerings.get(cloud)
                failures.append(f"{cloud}: {exc}")
                log.warning("%s: cannot list offerings (%s); %s", cloud, exc,
                            "using its last catalog" if cached else "left out of this decision")
                out.extend(cached or [])
                continue
            self._last_offerings[cloud] = found
            out.extend(found)
        if not out and failures:
            raise ProviderError(f"no cloud could list its offerings ({'; '.join(failures)})")
        return out

    def launch(self, request: LaunchRequest) -> Instance:
        cloud = request.offering.cloud
        inst = self._cloud(cloud, f"launch {request.offering.key}").launch(request)
        self._learn(cloud, [inst])
        return inst

    def terminate(self, instance_id: str) -> None:
        with self._lock:
            cloud = self._cloud_of.get(instance_id)
        if cloud is not None:
            self.providers[cloud].terminate(instance_id)
            return
        for provider in self.providers.values():
            try:
                provider.terminate(instance_id)
            except (InstanceNotFound, InvalidRequest) as exc:  # not an id of that cloud
                log.debug("%s: terminate %s: %s", provider.name, instance_id, exc)

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        out: list[Instance] = []
        for cloud, provider in self.providers.items():
            out.extend(self._learn(cloud, provider.list_instances(tags)))
        return out

    def poll(self) -> Sequence[Instance]:
        failed: list[ProviderError] = []
        for cloud, provider in self.providers.items():
            try:
                changed = self._learn(cloud, provider.poll())
            except ProviderError as exc:
                failed.append(exc)
                continue
            with self._lock:
                self._unreported.setdefault(cloud, []).extend(changed)
        if failed:
            raise failed[0]
        with self._lock:
            out = [inst for changes in self._unreported.values() for inst in changes]
            self._unreported.clear()
        return out

    def billing(self, instance: Instance) -> Billing:
        return self._cloud(instance.cloud, f"billing of {instance.instance_id}").billing(instance)

    # ----- extras some providers have -----
    def boot_config(self, instance: Instance) -> Any:
        provider = self._cloud(instance.cloud, f"boot config of {instance.instance_id}")
        boot_config = getattr(provider, "boot_config", None)
        if boot_config is None:
            raise InvalidRequest(f"cloud {instance.cloud!r} keeps no boot config", cloud=instance.cloud)
        return boot_config(instance)
