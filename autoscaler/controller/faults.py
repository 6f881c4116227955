"""Fault injection for crash-recovery tests (docs/aws.md).

``SPOTRAIN_FAULT_CRASH_AFTER_LAUNCH`` is the probability, 0..1, that the controller dies as if
SIGKILLed right after the cloud accepted a launch and before the result is recorded. That window is
the hardest one for recovery (an instance exists that only its tags know about), and a random SIGKILL
almost never lands in it. Unset (the default) means never.
"""

from __future__ import annotations

import logging
import os
import random

log = logging.getLogger("spotrain.controller")

FAULT_CRASH_AFTER_LAUNCH_ENV = "SPOTRAIN_FAULT_CRASH_AFTER_LAUNCH"
FAULT_EXIT_CODE = 137  # what a shell reports for SIGKILL


def maybe_crash_after_launch() -> None:
    raw = os.environ.get(FAULT_CRASH_AFTER_LAUNCH_ENV, "")
    if not raw:
        return
    try:
        probability = float(raw)
    except ValueError:
        raise ValueError(f"{FAULT_CRASH_AFTER_LAUNCH_ENV}={raw!r} must be a probability between 0 and 1") from None
    if random.random() < probability:
        log.warning("fault injection: exiting right after a launch, before recording it")
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)
