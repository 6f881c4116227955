"""Option types shared by the CLI commands: numbers that must be finite (``nan`` and ``inf`` parse as
floats, and would otherwise reach the simulator as a hang or a traceback), and ``--policy-params FILE``
(what ``spotrain tune --out`` writes; ``simulate``, ``estimate``, ``run`` and ``controller start`` read it).
Imports only click at load: every command module imports this one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    _FloatParamType = click.ParamType[float]
else:  # generic in recent click (8.4) only; at run time 8.1-8.2 (supported) cannot subscript it
    _FloatParamType = click.ParamType


class FiniteFloat(_FloatParamType):
    """A finite float, optionally at least ``min``."""

    name = "number"

    def __init__(self, min: float | None = None) -> None:  # noqa: A002 - click's own spelling
        self.min = min

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.min is not None and x < self.min:
            self.fail(f"{value!r} is below {self.min:g}", param, ctx)
        return x


NON_NEGATIVE = FiniteFloat(min=0.0)
SEED = click.IntRange(min=0, max=2**32 - 1)
# Start times per command: enough for any estimate, bounded so a typo cannot run for hours.
STARTS = click.IntRange(min=1, max=10000)


def read_policy_params(path: str | None) -> Any:
    """``--policy-params FILE`` as a ``PolicyParams`` (None without one); a bad file is one line."""
    if path is None:
        return None
    from ..errors import SpecError
    from ..policy.params import load_params_file

    try:
        return load_params_file(path)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def policy_params_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--policy-params FILE`` option (passed to the command as ``policy_params``: a path)."""
    return click.option("--policy-params", "policy_params", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                        help="The spotrain policy's parameters from a JSON/YAML file (what spotrain tune --out writes); "
                             "names left out keep their defaults.")(f)
