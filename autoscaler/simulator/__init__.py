"""The simulator: the controller's policy against a market trace, in virtual time (DESIGN.md)."""

from .engine import GRID_S, SimJob, SimResult, Simulation, simulate
from .jobs import POLICIES, make_sim_job, run_named

__all__ = ["GRID_S", "POLICIES", "SimJob", "SimResult", "Simulation", "make_sim_job", "run_named", "simulate"]
