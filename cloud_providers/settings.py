"""Reading a cloud provider's settings for ``make_provider`` (the controller's and the environment's).

The settings a provider accepts are its constructor's keyword arguments, so the list cannot drift from
the constructor; what each cloud reads from its environment stays in its ``__init__.py``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any


def accepted_settings(constructor: Callable[..., Any]) -> frozenset[str]:
    """The keyword-only parameters of a provider's constructor."""
    params = inspect.signature(constructor).parameters.values()
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def check_settings(cloud: str, settings: Mapping[str, Any], constructor: Callable[..., Any]) -> None:
    """ValueError naming a setting ``constructor`` does not take, or a missing ``controller_id``."""
    unknown = sorted(set(settings) - accepted_settings(constructor))
    if unknown:
        raise ValueError(f"unknown {cloud} provider setting(s): {', '.join(unknown)}")
    if "controller_id" not in settings:
        raise ValueError(f"{cloud} provider setting controller_id is required")


def split_list(value: Any) -> Any:
    """Accept "a,b" from a command line or environment as well as a list."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def spot_prices_from_env(env: Mapping[str, str], var: str, example: str) -> dict[str, float] | None:
    """The spot price overrides in environment variable ``var`` (a JSON object of prices), if set."""
    if not env.get(var):
        return None
    try:
        prices = json.loads(env[var])
        return {str(k): float(v) for k, v in prices.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"{var} must be a JSON object of prices, e.g. {example}") from exc


__all__ = ["accepted_settings", "check_settings", "split_list", "spot_prices_from_env"]
