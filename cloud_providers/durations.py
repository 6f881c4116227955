"""The one duration grammar of spotrain's inputs: the job spec, scenarios and the CLI's ``--set``.

A duration is one or more ``<number><unit>`` parts, largest unit first, with optional spaces:
``36h``, ``90m``, ``30s``, ``2d``, ``1h30m``, ``1.5h``, ``250ms``. Units: ``d``, ``h``, ``m``, ``s``,
``ms``. A duration needs a unit (DESIGN.md, "Job spec v1"): a bare number such as ``deadline: 36``
is an error rather than 36 seconds, so a user who meant hours is told at once.

It lives here, not in ``autoscaler/``, because ``cloud_providers`` may import nothing else of ours
and the local cloud's scenarios use it too; the job spec (``autoscaler/jobs/spec.py``) imports it.
Errors are ``ValueError`` with a one-line message that does not name the field: callers prefix the
field (pydantic does so for the spec, ``scenario.py`` for scenario events).
"""

from __future__ import annotations

import math
import re

_NUMBER = r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001))
_DURATION_RE = re.compile(
    r"^\s*" + "".join(rf"(?:{_NUMBER}\s*{unit}\s*)?" for unit, _ in _UNITS) + r"$"
)
_BARE_NUMBER_RE = re.compile(r"^\s*[+-]?" + _NUMBER + r"\s*$")
EXAMPLES = "e.g. 36h, 90m, 30s or 2d"


def parse_duration_s(value: object, *, allow_zero: bool = False) -> float:
    """Seconds in ``value``, a string such as ``36h`` or ``1h30m``; ValueError (one line) otherwise.

    Zero (``0s``) is accepted only with ``allow_zero`` (a scenario event at the start); a spec's
    deadline or checkpoint interval must be positive.
    """
    bare_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if bare_number or (isinstance(value, str) and _BARE_NUMBER_RE.match(value)):
        raise ValueError(f"{value!r} has no unit: write {EXAMPLES}")
    if not isinstance(value, str):
        raise ValueError(f"not a duration: {value!r} (write {EXAMPLES})")
    m = _DURATION_RE.match(value)
    if m is None or not any(m.groups()):
        raise ValueError(f"not a duration: {value!r} (write {EXAMPLES})")
    seconds = sum(float(g) * scale for g, (_, scale) in zip(m.groups(), _UNITS) if g)
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {value!r} (too large)")
    if seconds == 0 and not allow_zero:
        raise ValueError(f"must be positive, got {value!r}")
    return seconds


def format_duration_s(seconds: float) -> str:
    """``seconds`` written so that :func:`parse_duration_s` reads back exactly the same float."""
    return f"{float(seconds)!r}s"
