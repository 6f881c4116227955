"""What moving a job's state to another region or cloud costs, and whether a move pays (issue 23).

A job that changes region (or cloud) carries its checkpoint with it: the bytes leave the old region
(egress, billed per GB by the cloud the data leaves), take time to cross (the new gang waits for
them), and the gang restarts. Against that stands the saving of the new placement over the time the
policy expects to stay there. Pure functions over plain numbers; units are in the names.

- ``egress_usd``: size x the cloud's $/GB between the two places (``cloud_providers.catalog`` lists
  them).
- ``transfer_s``: size / bandwidth (a new gang restores its checkpoint across regions at about
  ``DEFAULT_TRANSFER_GB_PER_S``; within a region the store is local and costs nothing extra).
- ``move_cost``: egress plus the downtime (the restart and the transfer) valued at the job's cost of
  time (what an hour of the job's gang costs, or what an hour of its slack is worth).
- ``move_pays``: the move's expected saving over the stay beats its cost by a margin that grows with
  the moves already made (hysteresis: a job that has flapped between zones needs a clearer saving to
  move again).
"""

from __future__ import annotations

import dataclasses
import math

# Cross-region restore throughput of a checkpoint from object storage, GB per second (about 8 Gbit/s:
# parallel ranged reads of S3/GCS from a GPU instance; a cross-cloud copy is slower).
DEFAULT_TRANSFER_GB_PER_S = 1.0
CROSS_CLOUD_TRANSFER_GB_PER_S = 0.5


@dataclasses.dataclass(frozen=True)
class MoveCost:
    """One move's price: the egress bill and the downtime, in seconds and valued in USD."""

    egress_usd: float
    transfer_s: float
    restart_s: float
    downtime_usd: float

    @property
    def downtime_s(self) -> float:
        return self.restart_s + self.transfer_s

    @property
    def total_usd(self) -> float:
        return self.egress_usd + self.downtime_usd


def egress_usd(size_gb: float, usd_per_gb: float) -> float:
    """The egress bill of carrying ``size_gb`` at ``usd_per_gb``."""
    _check_non_negative(size_gb=size_gb, usd_per_gb=usd_per_gb)
    return size_gb * usd_per_gb


def transfer_s(size_gb: float, bandwidth_gb_per_s: float) -> float:
    """Seconds to carry ``size_gb`` at ``bandwidth_gb_per_s`` (0 for nothing to carry)."""
    _check_non_negative(size_gb=size_gb)
    if size_gb == 0:
        return 0.0
    if not bandwidth_gb_per_s > 0:
        raise ValueError(f"bandwidth_gb_per_s must be > 0, got {bandwidth_gb_per_s!r}")
    return size_gb / bandwidth_gb_per_s


def move_cost(*, size_gb: float, egress_usd_per_gb: float, restart_s: float, time_usd_per_hour: float,
              bandwidth_gb_per_s: float = DEFAULT_TRANSFER_GB_PER_S) -> MoveCost:
    """A move of ``size_gb`` of state at ``egress_usd_per_gb`` (0 within a region: then nothing
    crosses and only the restart is paid), with the downtime (restart + transfer) valued at
    ``time_usd_per_hour``."""
    _check_non_negative(restart_s=restart_s, time_usd_per_hour=time_usd_per_hour)
    carried = size_gb if egress_usd_per_gb > 0 else 0.0
    t_s = transfer_s(carried, bandwidth_gb_per_s)
    return MoveCost(egress_usd=egress_usd(carried, egress_usd_per_gb), transfer_s=t_s, restart_s=restart_s,
                    downtime_usd=(restart_s + t_s) / 3600.0 * time_usd_per_hour)


def hysteresis_factor(moves_made: int, *, per_move: float) -> float:
    """How much more than its cost a move must save after ``moves_made`` moves: 1 + per_move x moves."""
    if moves_made < 0 or per_move < 0:
        raise ValueError("moves_made and per_move must be >= 0")
    return 1.0 + per_move * moves_made


def move_pays(*, saving_usd_per_hour: float, stay_hours: float, cost: MoveCost, margin: float = 1.0) -> bool:
    """Whether the saving over the expected stay beats ``margin`` times the move's cost."""
    if not (math.isfinite(stay_hours) and stay_hours >= 0):
        raise ValueError(f"stay_hours must be finite and >= 0, got {stay_hours!r}")
    return saving_usd_per_hour * stay_hours > margin * cost.total_usd


def _check_non_negative(**values: float) -> None:
    for name, v in values.items():
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
