"""Allocation policies. ``get_policy(name)`` builds one by name (used by the controller and simulator)."""

from __future__ import annotations

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
    if name in ("default", "cheapest"):
        return CheapestPolicy()
    raise ValueError(f"unknown policy {name!r}")
