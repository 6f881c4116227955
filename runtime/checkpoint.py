"""Checkpoints: snapshot at the step boundary, persist in the background, load with verification.

Training stalls only for :meth:`CheckpointManager.snapshot`, a copy of every state tensor into
CPU buffers that are allocated once and reused (pinned when the source is on a GPU), the approach of
CheckFreq (Mohan et al., FAST'21). A background thread then streams the copies into one safetensors
file, hashing as it writes, and writes ``manifest.json`` last:

    <uri>/checkpoints/<step>/state.safetensors
    <uri>/checkpoints/<step>/manifest.json   # step, epoch, layout, data position, RNG, sha256 of files
    <uri>/final/model.safetensors

Loading walks the checkpoints newest first, verifies size and sha256 of every file, and falls back
to the previous checkpoint when one is truncated or corrupt. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from .errors import CheckpointCorrupt, CheckpointError, StateError
from .serialization import flatten, read_safetensors, unflatten, write_safetensors
from .store import Store

log = logging.getLogger(__name__)

FORMAT = "spotrain-checkpoint/1"
STATE_FILE = "state.safetensors"
MANIFEST_FILE = "manifest.json"
FINAL_MODEL = "final/model.safetensors"


@dataclass
class Snapshot:
    step: int
    tensors: dict[str, torch.Tensor]
    manifest: dict[str, Any]
    stall_s: float


@dataclass
class LoadedCheckpoint:
    step: int
    manifest: dict[str, Any]
    state: dict[str, Any]


class CheckpointManager:
    """Writes (when ``writer``) and reads the checkpoints of one job in ``store``."""

    def __init__(self, store: Store, *, keep: int, writer: bool = True) -> None:
        if keep < 1:
            raise ValueError(f"checkpoint.keep: must be >= 1, got {keep}")
        self.store = store
        self.keep = keep
        self.writer = writer
        self._buffers: dict[str, torch.Tensor] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_durable_step: int | None = None
        self.last_persist_s: float | None = None

    # ----------------------------------------------------------------- writing
    def snapshot(self, step: int, state: dict[str, Any], manifest: dict[str, Any]) -> Snapshot:
        """Copy ``state`` (any tree of tensors and JSON values) to reusable CPU buffers."""
        t0 = time.perf_counter()
        self.wait()  # the buffers of an in-flight persist must not be overwritten
        skeleton, tensors = flatten(state, "state")
        copies: dict[str, torch.Tensor] = {}
        on_gpu = False
        for name, t in tensors.items():
            t = t.detach()
            buf = self._buffers.get(name)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
                self._buffers[name] = buf
            buf.copy_(t, non_blocking=t.is_cuda)
            on_gpu = on_gpu or t.is_cuda
            copies[name] = buf
        for stale in set(self._buffers) - set(tensors):
            del self._buffers[stale]
        if on_gpu:
            torch.cuda.synchronize()
        full = dict(manifest, format=FORMAT, step=step, state=skeleton)
        return Snapshot(step=step, tensors=copies, manifest=full, stall_s=time.perf_counter() - t0)

    def persist_async(self, snap: Snapshot) -> None:
        """Start writing ``snap``; :meth:`wait` returns once it is durable."""
        if not self.writer:
            return
        self.wait()
        self._thread = threading.Thread(target=self._persist_guarded, args=(snap,), name="spotrain-ckpt", daemon=True)
        self._thread.start()

    def persist(self, snap: Snapshot) -> None:
        self.persist_async(snap)
        self.wait()

    def wait(self) -> None:
        """Block until the in-flight persist (if any) is durable; re-raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"checkpoint persist failed: {err}") from err

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _persist_guarded(self, snap: Snapshot) -> None:
        try:
            self._persist(snap)
        except BaseException as exc:  # handed to the training thread by wait()
            self._error = exc

    def _persist(self, snap: Snapshot) -> None:
        t0 = time.perf_counter()
        base = f"checkpoints/{snap.step}"
        with self.store.writer(f"{base}/{STATE_FILE}") as f:
            nbytes, sha = write_safetensors(f, snap.tensors)
        manifest = dict(snap.manifest, files={STATE_FILE: {"bytes": nbytes, "sha256": sha}},
                        created_unix_s=time.time())
        with self.store.writer(f"{base}/{MANIFEST_FILE}") as f:
            f.write(json.dumps(manifest, indent=1).encode())
        self.last_durable_step = snap.step
        self.last_persist_s = time.perf_counter() - t0
        self.prune()

    def prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints; drop older and abandoned partial ones."""
        complete = [s for s in self.steps() if self.store.exists(f"checkpoints/{s}/{MANIFEST_FILE}")]
        if not complete:
            return
        kept = set(complete[-self.keep :])
        newest = complete[-1]
        for s in self.steps():
            if s not in kept and s < newest:
                self.store.delete_tree(f"checkpoints/{s}")

    def write_final(self, model_state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> str:
        """Write the final weights atomically; returns their URI."""
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in model_state.items()}
        with self.store.writer(FINAL_MODEL) as f:
            write_safetensors(f, tensors, metadata)
        return self.store.url(FINAL_MODEL)

    # ----------------------------------------------------------------- reading
    def steps(self) -> list[int]:
        return sorted(int(n) for n in self.store.list_dir("checkpoints") if n.isdigit())

    def load(self, step: int) -> LoadedCheckpoint:
        """Read and verify checkpoint ``step``; raises :class:`CheckpointCorrupt`."""
        base = f"checkpoints/{step}"
        try:
            manifest = json.loads(self.store.read_bytes(f"{base}/{MANIFEST_FILE}"))
        except FileNotFoundError:
            raise CheckpointCorrupt(f"checkpoint {step}: no manifest (incomplete)") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest is not valid JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("step") != step:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest has the wrong format or step")
        tensors: dict[str, torch.Tensor] = {}
        for name, info in manifest.get("files", {}).items():
            try:
                data = self.store.read_bytes(f"{base}/{name}")
            except FileNotFoundError:
                raise CheckpointCorrupt(f"checkpoint {step}: {name} is missing") from None
            if len(data) != info["bytes"]:
                raise CheckpointCorrupt(f"checkpoint {step}: {name} has {len(data)} bytes, manifest says {info['bytes']}")
            if hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise CheckpointCorrupt(f"checkpoint {step}: {name} fails its sha256 check")
            try:
                tensors.update(read_safetensors(data))
            except StateError as exc:
                raise CheckpointCorrupt(f"checkpoint {step}: {name}: {exc}") from None
        try:
            state = unflatten(manifest["state"], tensors)
        except (StateError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointCorrupt(f"checkpoint {step}: state does not match its manifest ({exc})") from None
        return LoadedCheckpoint(step=step, manifest=manifest, state=state)

    def load_latest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back past corrupt ones; None if there is none."""
        steps = self.steps()
        for step in reversed(steps):
            try:
                return self.load(step)
            except CheckpointCorrupt as exc:
                log.warning("skipping checkpoint: %s", exc)
                if self.writer:  # so that pruning and the next resume do not count it again
                    self.store.delete_tree(f"checkpoints/{step}")
        if steps:
            log.error("no checkpoint under %s verifies; starting from scratch", self.store.uri)
        return None
