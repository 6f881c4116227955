"""The runtime's side of the worker protocol (see ``cloud_providers/protocol.py`` for the contract).

Duplicated here on purpose: ``runtime`` may import only ``cost_models``. ``tests/test_layout.py``
checks that both copies agree.
"""

from __future__ import annotations

EXIT_DONE = 0
EXIT_RESCHEDULE = 85

ENV_JOB_ID = "SPOTRAIN_JOB_ID"
ENV_ATTEMPT = "SPOTRAIN_ATTEMPT"
ENV_CHECKPOINT_URI = "SPOTRAIN_CHECKPOINT_URI"
ENV_CHECKPOINT_INTERVAL_S = "SPOTRAIN_CHECKPOINT_INTERVAL_S"
ENV_CHECKPOINT_KEEP = "SPOTRAIN_CHECKPOINT_KEEP"
ENV_TRAINING_JSON = "SPOTRAIN_TRAINING_JSON"
ENV_NOTICE_FILE = "SPOTRAIN_NOTICE_FILE"
ENV_PROGRESS_FILE = "SPOTRAIN_PROGRESS_FILE"
ENV_BATCH_JSON = "SPOTRAIN_BATCH_JSON"
ENV_CHECKPOINT_KEY = "SPOTRAIN_CHECKPOINT_KEY"

NOTICE_PREEMPTION = "preemption"
NOTICE_REBALANCE = "rebalance"
NOTICE_RESCALE = "rescale"
NOTICE_CANCEL = "cancel"
