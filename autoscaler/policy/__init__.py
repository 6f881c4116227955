"""Allocation policies. ``get_policy(name)`` builds one by name (used by the controller and simulator)."""

from __future__ import annotations

from collections.abc import Callable

from .base import Allocation, Held, JobView, MarketHistory, Placement, Policy, PolicyInput, eligible_offerings
from .simple import CheapestPolicy

__all__ = [
    "Allocation",
    "CheapestPolicy",
    "Held",
    "JobView",
    "MarketHistory",
    "Placement",
    "Policy",
    "PolicyInput",
    "eligible_offerings",
    "get_policy",
]


def get_policy(name: str = "default") -> Policy:
    """A policy by name: ``default`` (= ``spotrain``), ``cheapest``, and the
    simulator's baselines ``on-demand``, ``greedy-spot``, ``uniform-progress``."""
    from .baselines import GreedySpotPolicy, OnDemandPolicy, UniformProgressPolicy
    from .spotrain import SpotrainPolicy

    factories: dict[str, Callable[[], Policy]] = {
        "default": SpotrainPolicy,
        "spotrain": SpotrainPolicy,
        "cheapest": CheapestPolicy,
        "on-demand": OnDemandPolicy,
        "greedy-spot": GreedySpotPolicy,
        "uniform-progress": UniformProgressPolicy,
    }
    if name not in factories:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(sorted(factories))})")
    return factories[name]()
