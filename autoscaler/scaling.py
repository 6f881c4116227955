"""The job's scaling model from its spec (``simulate.scaling``), for the policy and the simulator.

``linear`` and ``{serial_fraction: f}`` are closed forms; ``{profile: PATH}`` is a measured Pollux
profile (relative paths are resolved against the spec's folder when it is loaded). Profiles are read
once per file version, not on every controller tick.
"""

from __future__ import annotations

import functools
from pathlib import Path

from cost_models.scaling import AmdahlScaling, LinearScaling, ProfileScaling, Scaling, read_profile_csv

from .errors import SpecError
from .spec import JobSpec


@functools.lru_cache(maxsize=64)
def _profile(path: str, mtime_ns: int, batch: int) -> ProfileScaling:
    try:
        model = read_profile_csv(Path(path))
    except ValueError as exc:
        raise SpecError(f"spec error: simulate.scaling.profile: {exc}") from None
    return ProfileScaling(model, batch)


def spec_scaling(spec: JobSpec, spec_dir: Path | None = None) -> Scaling:
    """The job's scaling model from its ``simulate.scaling`` (profile paths relative to ``spec_dir``)."""
    s = spec.simulate.scaling
    if s == "linear":
        return LinearScaling()
    serial = getattr(s, "serial_fraction", None)
    if serial is not None:
        return AmdahlScaling(float(serial))
    path = Path(getattr(s, "profile"))
    if not path.is_absolute() and spec_dir is not None:
        path = spec_dir / path
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise SpecError(f"spec error: simulate.scaling.profile: cannot read {path} ({exc.strerror})") from None
    return _profile(str(path), mtime, spec.training.global_batch_size)


def measured_scaling(spec: JobSpec) -> Scaling | None:
    """The profile's model for a job whose spec names one (None otherwise, or when it cannot be read:
    the policy then falls back to its prior)."""
    if getattr(spec.simulate.scaling, "profile", None) is None:
        return None
    try:
        return spec_scaling(spec)
    except SpecError:
        return None
