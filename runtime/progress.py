"""The progress file: rank 0's view of training, for the controller (worker protocol).

The file is rewritten atomically (temporary file + ``os.replace``) so that a reader never sees half a
JSON document. Writes are throttled to one per ``interval_s`` unless forced (checkpoint, metric,
final weights, exit), which keeps the cost per step to a clock read. What a throttled update left
unwritten is written when the trainer closes and at the interpreter's exit (``flush``): a script that
stops at step 10, 0.2 s after the write at step 1, must not leave "step 1" as its last word (issue 24).
Every field written is one of the worker protocol's progress record (``protocol.PROGRESS_FIELDS``): a field the contract does not
name is a bug here, refused at once rather than ignored by the controller.
"""

from __future__ import annotations

import atexit
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
        self._unwritten = False
        if path is not None:
            atexit.register(self._flush_at_exit)

    def flush(self) -> None:
        """Write the fields a throttled ``update`` kept back, if any."""
        if self._unwritten:
            self.update(force=True)

    def _flush_at_exit(self) -> None:
        try:
            self.flush()
        except OSError:
            pass  # the worker is exiting anyway; its exit code still tells the controller

    def update(self, *, force: bool = False, **fields: Any) -> None:
        unknown = sorted(set(fields) - protocol.PROGRESS_FIELDS.keys())
        if unknown:
            raise ValueError(f"progress fields not in the worker protocol: {', '.join(unknown)}")
        self.fields.update(fields)
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._last_write < self.interval_s:
            self._unwritten = True
            return
        self._last_write, self._unwritten = now, False
        body = dict(self.fields, updated_unix_s=time.time())
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, self.path)
