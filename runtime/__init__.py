"""spotrain's elastic PyTorch runtime: logical workers, deterministic reduction, fast checkpoints.

Public API (see docs/runtime.md):

- :class:`ElasticTrainer`, :class:`StepResult`, :func:`exit_worker`, :func:`prefetch_checkpoint` — the loop
- :class:`TrainerConfig`, :class:`TrainingConfig`, :class:`CheckpointConfig`, :class:`NoticeConfig`
- :class:`CheckpointManager`, :func:`make_store` — checkpoints outside the trainer (tools, tests)
- :func:`lr_factor` — learning-rate scaling rules; :mod:`runtime.protocol` — worker protocol names
"""

from __future__ import annotations

from . import protocol
from .checkpoint import CheckpointManager, LoadedCheckpoint
from .config import CheckpointConfig, NoticeConfig, TrainerConfig, TrainingConfig
from .errors import (
    CheckpointCorrupt,
    CheckpointError,
    ForeignCheckpoint,
    NoValidCheckpoint,
    ObjectUnreadable,
    RuntimeFailure,
    StateError,
    StoreError,
    UnsupportedStore,
)
from .lr_scaling import lr_factor
from .store import make_store
from .trainer import ElasticTrainer, StepResult, exit_worker, prefetch_checkpoint

__all__ = [
    "CheckpointConfig", "CheckpointCorrupt", "CheckpointError", "CheckpointManager", "ElasticTrainer",
    "ForeignCheckpoint", "LoadedCheckpoint", "NoValidCheckpoint", "NoticeConfig", "ObjectUnreadable", "RuntimeFailure",
    "StateError", "StepResult", "StoreError", "TrainerConfig", "TrainingConfig", "UnsupportedStore", "exit_worker",
    "lr_factor", "make_store", "prefetch_checkpoint", "protocol",
]
