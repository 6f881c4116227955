"""The controller: job lifecycle and the reconcile loop, as a package of small parts.

- ``service``: the ``Controller`` (API operations, the loop's schedule);
- ``reconcile``: one tick (budget first, poll, sweep, observe, decide, apply);
- ``gangs``: starting, observing and ending a job's gang of workers;
- ``allocate``: making the instances match the policy's allocation;
- ``launches``: write-ahead launches and releases; ``recovery``: agreeing with the cloud after a crash;
- ``budget``: the hard budget guard and the minimum-bill check;
- ``views``: the one ``JobView`` builder and the job summary;
- ``context``: what the parts share (collaborators, clock, in-memory state); ``faults``: fault injection.
"""

from __future__ import annotations

from .context import Context, Hooks, Timings, gpus_of
from .faults import FAULT_CRASH_AFTER_LAUNCH_ENV, FAULT_EXIT_CODE
from .service import Controller
from .views import job_summary

__all__ = ["Controller", "Context", "Hooks", "Timings", "gpus_of", "job_summary", "FAULT_CRASH_AFTER_LAUNCH_ENV",
           "FAULT_EXIT_CODE"]
