"""Pure cost and performance models (no I/O): goodput, scaling, preemption hazard, the objective."""
