"""Errors of the runtime boundary (what a training script can see).

    RuntimeFailure
    ├── CheckpointError            (a checkpoint could not be written or read)
    │   ├── CheckpointCorrupt      (a file is missing, truncated or its sha256 differs from the manifest)
    │   ├── NoValidCheckpoint      (checkpoints exist but none of them verifies)
    │   ├── ForeignCheckpoint      (the manifest names another job: never resumed, marked or written over)
    │   └── StoreError             (the store under a URI failed: I/O, S3 client error)
    │       ├── UnsupportedStore   (a store whose client library is not installed: gs:// without spotrain[gcp])
    │       └── ObjectUnreadable   (what is at an object's path cannot be read as that object: a
    │                               directory, FIFO, device or symbolic link, an I/O error, over a size
    │                               limit; the checkpoint loader takes it as a corrupt checkpoint)
    ├── StateError                 (a state dict cannot be represented without pickle, or does not fit)
    └── NoticeSourceError          (notices.py: a cloud's metadata service could not be read; polled again)

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


class ForeignCheckpoint(CheckpointError):
    pass


class StoreError(CheckpointError):
    pass


class ObjectUnreadable(StoreError):
    pass


class UnsupportedStore(StoreError):
    pass


class StateError(RuntimeFailure):
    pass


class NoticeSourceError(RuntimeFailure):
    pass
