"""The progress file: rank 0's view of training, for the controller (worker protocol).

The file is rewritten atomically (temporary file + ``os.replace``) so that a reader never sees half a
JSON document. Writes are throttled to one per ``interval_s`` unless forced (checkpoint, metric,
final weights, exit), which keeps the cost per step to a clock read. Every field written is one of
the worker protocol's progress record (``protocol.PROGRESS_FIELDS``): a field the contract does not
name is a bug here, refused at once rather than ignored by the controller.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from . import protocol


class ProgressWriter:
    def __init__(self, path: str | None, *, interval_s: float = 0.5) -> None:
        self.path = path
        self.interval_s = interval_s
        self.fields: dict[str, Any] = {}
        self._last_write = 0.0

    def update(self, *, force: bool = False, **fields: Any) -> None:
        unknown = sorted(set(fields) - protocol.PROGRESS_FIELDS.keys())
        if unknown:
            raise ValueError(f"progress fields not in the worker protocol: {', '.join(unknown)}")
        self.fields.update(fields)
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._last_write < self.interval_s:
            return
        self._last_write = now
        body = dict(self.fields, updated_unix_s=time.time())
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, self.path)
