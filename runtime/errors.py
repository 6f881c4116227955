"""Errors of the runtime boundary (what a training script can see).

    RuntimeFailure
    ├── CheckpointError            (a checkpoint could not be written or read)
    │   ├── CheckpointCorrupt      (a file is missing, truncated or its sha256 differs from the manifest)
    │   ├── NoValidCheckpoint      (checkpoints exist but none of them verifies)
    │   └── StoreError             (the store under a URI failed: I/O, S3 client error)
    │       └── UnsupportedStore   (a store whose client library is not installed: gs:// without spotrain[gcp])
    └── StateError                 (a state dict cannot be represented without pickle, or does not fit)

User errors in configuration are ``ValueError`` raised when a config dataclass is built, so that a
script fails at once with one line naming the field. The other boundaries have their own roots:
``autoscaler.errors.SpotrainError`` (controller and CLI) and ``cloud_providers.errors.ProviderError``;
``tests/test_error_hierarchy.py`` checks that every error type of the packages descends from one.
"""

from __future__ import annotations


class RuntimeFailure(Exception):
    """Base of every error the runtime raises on purpose."""


class CheckpointError(RuntimeFailure):
    pass


class CheckpointCorrupt(CheckpointError):
    pass


class NoValidCheckpoint(CheckpointError):
    pass


class StoreError(CheckpointError):
    pass


class UnsupportedStore(StoreError):
    pass


class StateError(RuntimeFailure):
    pass
