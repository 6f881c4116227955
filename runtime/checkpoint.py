"""Checkpoints: snapshot at the step boundary, persist in the background, load with verification.

Training stalls only for :meth:`CheckpointManager.snapshot`, a copy of every state tensor into one
contiguous CPU buffer that is allocated once and reused while the state keeps its shape (pinned when
the source is on a GPU), the approach of CheckFreq (Mohan et al., FAST'21). Large copies are split
over two threads. The buffer is laid out exactly as the data sections of the checkpoint's files
(``serialization.plan_layout``), so a background thread persists it with large sequential writes
straight from the buffer: the files (one per ~quarter of the state, at most four) are written and
hashed in parallel, each fsynced, and ``manifest.json`` is written last:

    <uri>/checkpoints/<step>/state.safetensors       # or state-0000i-of-0000n.safetensors
    <uri>/checkpoints/<step>/manifest.json   # step, epoch, layout, data position, RNG, sha256 of files
    <uri>/final/model.safetensors

Loading walks the checkpoints newest first, verifies size and sha256 of every file (read and hashed
in one pass, files in parallel), and falls back to the previous checkpoint when one is truncated or
corrupt. The loaded tensors are views into the read buffers: no copy beyond the read. Nothing is
unpickled.

What a store holds is not trusted (issue 14, findings 2, 3 and 10). A manifest must carry its own
``manifest_sha256``, fit in ``MANIFEST_MAX_BYTES`` and nest no deeper than ``MANIFEST_MAX_DEPTH``
(the writer refuses a state that would break either), and anything else at a file's path (a
directory, FIFO, symbolic link, an I/O error) makes the checkpoint corrupt: it is set aside with a
``CORRUPT`` marker and the load falls back. A manager given a ``job_id`` stamps it into what it
writes and refuses (:class:`ForeignCheckpoint`) a manifest naming another job, writing nothing: two
jobs that share a directory must fail, not resume from or prune each other's checkpoints (the id is
the directory's, :func:`directory_owner`, so that a job resumed on an ended job's URI continues it). A newer
complete checkpoint of a step set aside replaces it, and pruning drops set-aside and abandoned
directories and the temporary files of writers killed mid-write, under ``keep``.

Integrity is not authenticity (issue 21, finding 9): code that can write a job's store could write a
checkpoint with the job's id and matching hashes. A manager given a ``signing_key`` (the controller
issues one per job, ``SPOTRAIN_CHECKPOINT_KEY``) signs each manifest: ``manifest_hmac_sha256`` is
HMAC-SHA256 under the key of ``spotrain-manifest/1:`` and the manifest's own sha256 (which covers every
other field, the files' hashes included). Loading with a key refuses a manifest whose signature is
missing or wrong as corrupt: it is set aside and the load falls back, as for a bad hash. Unsigned
checkpoints are refused too: a forger could simply leave the signature out, and nothing in a manifest
(its ``created_unix_s`` included) can tell a checkpoint written before keys from a forged one; a job
submitted before its controller issued keys has no key and stays unsigned (docs/formats.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import torch

from .errors import CheckpointCorrupt, CheckpointError, ForeignCheckpoint, ObjectUnreadable, StateError, StoreError
from .serialization import (
    Layout,
    Shard,
    buffer_views,
    flatten,
    layout_key,
    parse_safetensors,
    plan_layout,
    unflatten,
    write_safetensors,
    write_shard,
)
from .store import Store

log = logging.getLogger(__name__)
# Written into a checkpoint directory that failed verification: it is skipped from then on.
CORRUPT_MARKER = "CORRUPT"
MANIFEST_HASH_KEY = "manifest_sha256"
MANIFEST_SIGNATURE_KEY = "manifest_hmac_sha256"
_SIGNATURE_CONTEXT = b"spotrain-manifest/1:"
# A manifest is a few kB to a few MB (the state's skeleton); larger or deeper is not one of ours.
# Depth counts JSON containers: each level of a state's dicts takes three ({"__dict__": [[k, v]]}).
MANIFEST_MAX_BYTES = 64 << 20
MANIFEST_MAX_DEPTH = 100

FORMAT = "spotrain-checkpoint/1"
STATE_FILE = "state.safetensors"
PARALLEL_COPY_BYTES = 64 << 20  # below this, a second copy thread costs more than it saves

# Checkpoints read ahead by prefetch_latest(), by store URI: (reader thread, [result]).
_prefetches: dict[str, tuple[threading.Thread, list[tuple[float | None, LoadedCheckpoint | None]]]] = {}
_prefetch_lock = threading.Lock()
MANIFEST_FILE = "manifest.json"
FINAL_MODEL = "final/model.safetensors"


@dataclass
class Snapshot:
    step: int
    tensors: dict[str, torch.Tensor]  # views into ``buffer``
    manifest: dict[str, Any]
    stall_s: float
    layout: Layout | None = None
    buffer: torch.Tensor | None = None
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # deferred copies
    copied: threading.Event = field(default_factory=threading.Event)


@dataclass
class LoadedCheckpoint:
    step: int
    manifest: dict[str, Any]
    state: dict[str, Any]


class CheckpointManager:
    """Writes (when ``writer``) and reads the checkpoints of one job in ``store``.

    ``job_id``: the job whose checkpoint directory this is (``<store>/<job_id>``, see
    :func:`directory_owner`), written into every manifest; a manifest naming another job, or none, is
    refused with :class:`ForeignCheckpoint`. ``also_accept``: other job ids whose manifests belong
    here too (the trainer's own id, which is not the directory's in a job that ``spotrain resume``
    started on an ended job's checkpoints). ``job_id=None`` (tools, tests) reads any job's.
    ``signing_key``: the job's key (bytes, at least 16): manifests are signed with it, and one whose
    signature is missing or does not verify is corrupt (see the module doc); None: unsigned."""

    def __init__(self, store: Store, *, keep: int, writer: bool = True, job_id: str | None = None,
                 also_accept: Collection[str] = (), signing_key: bytes | None = None) -> None:
        if keep < 1:
            raise ValueError(f"checkpoint.keep: must be >= 1, got {keep}")
        if signing_key is not None and len(signing_key) < 16:
            raise ValueError("checkpoint signing key: at least 16 bytes")
        self._signing_key = signing_key
        self.store = store
        self.keep = keep
        self.writer = writer
        self.job_id = job_id
        self._accepted = frozenset({job_id, *also_accept}) if job_id is not None else frozenset()
        self._layout: Layout | None = None
        self._buffer: torch.Tensor | None = None
        self._copying: Snapshot | None = None
        self._unstarted: Snapshot | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_durable_step: int | None = None
        self.last_persist_s: float | None = None
        self.last_durable_unix_s: float | None = None
        # The newest durable checkpoint's size in GB (its files and manifest): what a move of the job
        # to another region or cloud carries (issue 23; reported as ``checkpoint_size_gb``).
        self.last_durable_size_gb: float | None = None
        self.last_load_s: float | None = None
        self.last_load_prefetched = False  # the last load was read ahead by prefetch_latest()

    # ----------------------------------------------------------------- writing
    def snapshot(self, step: int, state: dict[str, Any], manifest: dict[str, Any], *,
                 defer: Collection[int] = ()) -> Snapshot:
        """Copy ``state`` (any tree of tensors and JSON values) into the reusable CPU buffer.

        ``defer`` holds storage addresses (``t.untyped_storage().data_ptr()``) of CPU tensors that the
        caller will not modify until :meth:`wait_copied` returns (the trainer: parameters and optimizer
        state, until its next optimizer step). Their copy runs first thing in the persist thread, while
        the next forward and backward pass run: CheckFreq's pipelined snapshot, which leaves only the
        other tensors' copy as a stall."""
        t0 = time.perf_counter()
        # The buffer of an in-flight persist must not be overwritten. If that earlier persist failed,
        # this checkpoint supersedes it: say so, and write this one (it may be the notice's, which
        # must not be lost to a stale periodic failure).
        try:
            self.wait()
        except CheckpointError as exc:
            log.warning("an earlier checkpoint was not written (%s); writing step %d instead", exc, step)
        skeleton, tensors = flatten(state, "state")
        tensors = {name: t.detach() for name, t in tensors.items()}
        if self._layout is None or self._layout.key != layout_key(tensors):
            self._layout = plan_layout(tensors)
            on_gpu = any(t.is_cuda for t in tensors.values())
            self._buffer = torch.empty(self._layout.total_bytes, dtype=torch.uint8, pin_memory=on_gpu)
        assert self._buffer is not None
        views = buffer_views(self._layout, self._buffer, tensors)
        now: list[tuple[torch.Tensor, torch.Tensor]] = []
        later: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, t in tensors.items():
            deferred = defer and self.writer and not t.is_cuda and t.untyped_storage().data_ptr() in defer
            (later if deferred else now).append((views[name], t))
        _copy_all(now, threads=2)
        full = dict(manifest, format=FORMAT, step=step, state=skeleton)
        if self.job_id is not None:
            if full.get("job_id") not in (None, self.job_id):  # a resumed job, in the ended job's directory
                full["written_by_job_id"] = full["job_id"]
            full["job_id"] = self.job_id
        snap = Snapshot(step=step, tensors=views, manifest=full, stall_s=time.perf_counter() - t0,
                        layout=self._layout, buffer=self._buffer, pending=later)
        if not later:
            snap.copied.set()
        self._unstarted = snap if later else None
        self._copying = snap
        return snap

    def wait_copied(self) -> float:
        """Block until the last snapshot's deferred copies are done; the seconds spent blocked."""
        snap = self._copying
        if snap is None or snap.copied.is_set():
            return 0.0
        t0 = time.perf_counter()
        if self._unstarted is snap:  # never handed to persist_async: copy here
            self._unstarted = None
            self._finish_copies(snap)
        snap.copied.wait()
        return time.perf_counter() - t0

    @staticmethod
    def _finish_copies(snap: Snapshot) -> None:
        try:
            _copy_all(snap.pending, threads=1)
            snap.pending = []
        finally:
            snap.copied.set()

    def prepare_async(self, state: dict[str, Any]) -> None:
        """Allocate and touch the snapshot buffer for ``state``'s shapes in the background, so that the
        first snapshot (often the one a preemption notice asks for) pays no page faults or pinning:
        for 1 GB that is most of a cold snapshot's stall."""
        if not self.writer:
            return
        self.wait()
        _, tensors = flatten(state, "state")
        key = layout_key(tensors)
        if self._layout is not None and self._layout.key == key:
            return
        metas = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in tensors.items()}
        on_gpu = any(t.is_cuda for t in tensors.values())

        def allocate() -> None:
            layout = plan_layout(metas)
            buffer = torch.empty(layout.total_bytes, dtype=torch.uint8, pin_memory=on_gpu)
            buffer.zero_()
            self._layout, self._buffer = layout, buffer

        self._thread = threading.Thread(target=self._guarded, args=(allocate,), name="spotrain-ckpt-prepare",
                                        daemon=True)
        self._thread.start()

    def persist_async(self, snap: Snapshot, *, urgent: bool = True) -> None:
        """Start writing ``snap``; :meth:`wait` returns once it is durable. ``urgent`` writes its files
        in parallel, as fast as the machine allows (a notice is running out); otherwise one file at a
        time, so that a periodic checkpoint takes less CPU from training that goes on beside it."""
        if not self.writer:
            return
        self.wait()
        if self._unstarted is snap:
            self._unstarted = None
        self._thread = threading.Thread(target=self._guarded, args=(lambda: self._persist(snap, urgent),),
                                        name="spotrain-ckpt", daemon=True)
        self._thread.start()

    def persist(self, snap: Snapshot, *, urgent: bool = True) -> None:
        self.persist_async(snap, urgent=urgent)
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

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # handed to the training thread by wait()
            self._error = exc

    def _persist(self, snap: Snapshot, urgent: bool = True) -> None:
        if not snap.copied.is_set():
            self._finish_copies(snap)
        t0 = time.perf_counter()
        base = f"checkpoints/{snap.step}"
        assert snap.layout is not None and snap.buffer is not None
        buffer = snap.buffer
        if _nesting_exceeds(snap.manifest, MANIFEST_MAX_DEPTH):  # never write what a load would refuse
            raise StateError(f"checkpoint {snap.step}: the state nests deeper than a manifest may "
                             f"({MANIFEST_MAX_DEPTH} JSON levels); a load would refuse it")
        if self.store.exists(f"{base}/{CORRUPT_MARKER}"):
            # This step was set aside (a corrupt or incomplete attempt, or a marker left by a crash):
            # the checkpoint written now replaces it. Removed first, so that a crash midway leaves an
            # incomplete directory, never the marker over a good checkpoint (issue 14, finding 3).
            self.store.delete_tree(base)

        def write(shard: Shard) -> tuple[str, dict[str, Any]]:
            # the manifest's writer fsyncs the directory, which makes these renames durable too
            with self.store.writer(f"{base}/{shard.file}", sync_dir=False) as f:
                nbytes, sha = write_shard(f, shard, buffer)
            return shard.file, {"bytes": nbytes, "sha256": sha}

        shards = snap.layout.shards
        if len(shards) == 1 or not urgent:
            files = dict(write(shard) for shard in shards)
        else:
            with ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="spotrain-shard") as pool:
                files = dict(pool.map(write, shards))
        manifest = dict(snap.manifest, files=files, created_unix_s=time.time())
        manifest[MANIFEST_HASH_KEY] = _manifest_sha256(manifest)
        if self._signing_key is not None:
            manifest[MANIFEST_SIGNATURE_KEY] = _signature(self._signing_key, manifest[MANIFEST_HASH_KEY])
        body = json.dumps(manifest, indent=1).encode()
        if len(body) > MANIFEST_MAX_BYTES:
            raise StateError(f"checkpoint {snap.step}: the manifest would be {len(body)} bytes, over the "
                             f"{MANIFEST_MAX_BYTES}-byte limit a load enforces (keep large values in tensors)")
        with self.store.writer(f"{base}/{MANIFEST_FILE}") as f:
            f.write(body)
        self.last_durable_step = snap.step
        self.last_durable_unix_s = time.time()
        self.last_durable_size_gb = (sum(int(v["bytes"]) for v in files.values()) + len(body)) / 1e9
        self.last_persist_s = time.perf_counter() - t0
        # Best effort, after the durable point: a failed list or delete must not fail a checkpoint
        # that is already complete (the next one prunes again).
        try:
            self.prune()
        except Exception as exc:  # noqa: BLE001 - any store error; logged, retried next time
            log.warning("pruning old checkpoints failed (kept them): %s", exc)

    def prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints; drop older ones, abandoned partial ones and
        those set aside as corrupt, and the temporary files of writers killed mid-write."""
        found = self._listed_steps()
        usable = [s for s in found if not self.store.exists(f"checkpoints/{s}/{CORRUPT_MARKER}")]
        complete = [s for s in usable if self.store.exists(f"checkpoints/{s}/{MANIFEST_FILE}")]
        if not complete:
            return
        kept = set(complete[-self.keep :])
        newest = complete[-1]
        for s in found:
            if s not in kept and s < newest:
                self.store.delete_tree(f"checkpoints/{s}")
            else:
                self.store.remove_partial_writes(f"checkpoints/{s}")

    def write_final(self, model_state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> str:
        """Write the final weights atomically; returns their URI."""
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in model_state.items()}
        with self.store.writer(FINAL_MODEL) as f:
            write_safetensors(f, tensors, metadata)
        try:
            self.store.remove_partial_writes(os.path.dirname(FINAL_MODEL))
        except StoreError as exc:  # the weights are written; leftovers wait for the next time
            log.warning("removing leftover temporary files failed: %s", exc)
        return self.store.url(FINAL_MODEL)

    # ----------------------------------------------------------------- reading
    def _listed_steps(self) -> list[int]:
        return sorted(int(n) for n in self.store.list_dir("checkpoints") if n.isdigit() and n.isascii())

    def steps(self) -> list[int]:
        """Checkpoint steps present, except those set aside as corrupt."""
        return [s for s in self._listed_steps() if not self.store.exists(f"checkpoints/{s}/{CORRUPT_MARKER}")]

    def load(self, step: int) -> LoadedCheckpoint:
        """Read and verify checkpoint ``step``; raises :class:`CheckpointCorrupt`, or
        :class:`ForeignCheckpoint` for another job's."""
        early = _take_prefetched(self.store.uri, step)
        if early is not None:
            self._check_job(early[1].manifest, step)
            self._check_signature(early[1].manifest, step)  # the read ahead had no key
            self.last_load_s, loaded = early
            self.last_load_prefetched = True
            return loaded
        manifest = self._read_manifest(step)
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest lists no files")
        t0 = time.perf_counter()
        workers = min(len(files), os.cpu_count() or 1, 4)
        if workers > 1:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spotrain-load") as pool:
                parts = list(pool.map(lambda item: self._read_file(step, *item), files.items()))
        else:
            parts = [self._read_file(step, name, info) for name, info in files.items()]
        tensors: dict[str, torch.Tensor] = {}
        for part in parts:
            tensors.update(part)
        self.last_load_s = time.perf_counter() - t0
        self.last_load_prefetched = False
        try:
            state = unflatten(manifest["state"], tensors)
        except (StateError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointCorrupt(f"checkpoint {step}: state does not match its manifest ({exc})") from None
        return LoadedCheckpoint(step=step, manifest=manifest, state=state)

    def _read_manifest(self, step: int) -> dict[str, Any]:
        """The manifest of ``step``, checked in an order where nothing recursive meets untrusted
        depth: size, JSON, depth, owner, format, then its own sha256."""
        path = f"checkpoints/{step}/{MANIFEST_FILE}"
        try:
            raw = self.store.read_bytes(path, max_bytes=MANIFEST_MAX_BYTES)
        except FileNotFoundError:
            raise CheckpointCorrupt(f"checkpoint {step}: no manifest (incomplete)") from None
        except ObjectUnreadable as exc:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest: {exc}") from None
        if len(raw) > MANIFEST_MAX_BYTES:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest is larger than {MANIFEST_MAX_BYTES} bytes")
        try:
            manifest = json.loads(raw)
        except RecursionError:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest nests too deep to parse") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest is not valid JSON ({exc})") from None
        if _nesting_exceeds(manifest, MANIFEST_MAX_DEPTH):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest nests deeper than {MANIFEST_MAX_DEPTH} levels")
        if not isinstance(manifest, dict):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest is not a JSON object")
        # Before anything is written about it: a checkpoint of another job is neither resumed nor
        # marked (finding 2: two jobs whose URIs named one directory).
        self._check_job(manifest, step)
        if manifest.get("format") != FORMAT or manifest.get("step") != step:
            raise CheckpointCorrupt(f"checkpoint {step}: manifest has the wrong format or step")
        # The manifest carries the state's skeleton (data position, hyperparameters, RNG states): it is
        # hashed too, over its canonical JSON without the hash itself. Required: without it, an edited
        # manifest whose hash was deleted would load (finding 10).
        if not isinstance(manifest.get(MANIFEST_HASH_KEY), str):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest has no {MANIFEST_HASH_KEY}")
        if manifest[MANIFEST_HASH_KEY] != _manifest_sha256(manifest):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest fails its sha256 check")
        self._check_signature(manifest, step)
        return manifest

    def _check_signature(self, manifest: dict[str, Any], step: int) -> None:
        """With a key: the manifest's signature must verify (a forged or unsigned one is corrupt)."""
        if self._signing_key is None:
            return
        signature = manifest.get(MANIFEST_SIGNATURE_KEY)
        if not isinstance(signature, str):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest is not signed, and this job's checkpoints "
                                    "must be (a checkpoint not written by this job's workers)")
        digest = manifest.get(MANIFEST_HASH_KEY)
        expected = _signature(self._signing_key, digest if isinstance(digest, str) else "")
        if not hmac.compare_digest(signature.encode("utf-8", "replace"), expected.encode()):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest signature does not verify with this job's key "
                                    "(a checkpoint not written by this job's workers)")

    def _check_job(self, manifest: dict[str, Any], step: int) -> None:
        if self.job_id is None or manifest.get("job_id") in self._accepted:
            return
        owner = manifest.get("job_id")
        whose = f"job {owner!r}" if isinstance(owner, str) else "no job id"
        raise ForeignCheckpoint(
            f"checkpoint {step} under {self.store.uri} was written by {whose}, not by job {self.job_id!r}: "
            "refusing to resume from it or to write there (two jobs must never share a checkpoint directory)"
        )

    def _read_file(self, step: int, name: str, info: Any) -> dict[str, torch.Tensor]:
        base = f"checkpoints/{step}"
        if not isinstance(info, dict) or not isinstance(info.get("bytes"), int) or not isinstance(info.get("sha256"), str):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest entry for {name} is malformed")
        if "/" in name or name.startswith("."):
            raise CheckpointCorrupt(f"checkpoint {step}: manifest names a file outside the checkpoint: {name!r}")
        try:
            buffer, sha = self.store.read_hashed(f"{base}/{name}")
        except FileNotFoundError:
            raise CheckpointCorrupt(f"checkpoint {step}: {name} is missing") from None
        except ObjectUnreadable as exc:
            raise CheckpointCorrupt(f"checkpoint {step}: {name}: {exc}") from None
        if buffer.numel() != info["bytes"]:
            raise CheckpointCorrupt(f"checkpoint {step}: {name} has {buffer.numel()} bytes, manifest says {info['bytes']}")
        if sha != info["sha256"]:
            raise CheckpointCorrupt(f"checkpoint {step}: {name} fails its sha256 check")
        try:
            return parse_safetensors(buffer)
        except StateError as exc:
            raise CheckpointCorrupt(f"checkpoint {step}: {name}: {exc}") from None

    def load_latest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back past corrupt ones; None if there is none."""
        steps = self.steps()
        for step in reversed(steps):
            try:
                return self.load(step)
            except CheckpointCorrupt as exc:
                log.warning("skipping checkpoint: %s", exc)
                if self.writer:
                    # Set aside, not deleted (a format change or a store fault should leave evidence
                    # and a way back); the next resume no longer counts it, pruning drops it under
                    # ``keep``, and a newer complete checkpoint of the same step replaces it.
                    try:
                        with self.store.writer(f"checkpoints/{step}/{CORRUPT_MARKER}") as f:
                            f.write(str(exc).encode())
                    except StoreError as marker_exc:  # e.g. the step is a symbolic link: never written through
                        log.warning("could not mark checkpoint %d as corrupt: %s", step, marker_exc)
        if steps:
            log.error("no checkpoint under %s verifies; starting from scratch", self.store.uri)
        return None


def directory_owner(uri: str) -> str:
    """The job a checkpoint URI belongs to: its last path segment (the controller gives each job
    ``<store>/<job_id>``; a resumed job continues the ended job's URI, and so its directory)."""
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests containers more than ``limit`` deep (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _manifest_sha256(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k not in (MANIFEST_HASH_KEY, MANIFEST_SIGNATURE_KEY)}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _signature(key: bytes, manifest_sha256: str) -> str:
    return hmac.new(key, _SIGNATURE_CONTEXT + manifest_sha256.encode(), hashlib.sha256).hexdigest()


def _copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]], *, threads: int) -> None:
    """``dst.copy_(src)`` for every pair. With ``threads=2``, a large CPU state is split in two halves
    by bytes, copied by two threads (torch releases the GIL while copying): ~20% shorter here."""
    on_gpu = any(src.is_cuda for _, src in pairs)
    total_bytes = sum(src.numel() * src.element_size() for _, src in pairs)
    if on_gpu or threads < 2 or total_bytes < PARALLEL_COPY_BYTES or (os.cpu_count() or 1) < 2:
        for dst, src in pairs:
            dst.copy_(src, non_blocking=src.is_cuda)
        if on_gpu:
            torch.cuda.synchronize()
        return
    halves: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[], []]
    half, done = total_bytes // 2, 0
    for dst, src in pairs:
        n = src.numel() * src.element_size()
        if done < half < done + n and src.is_contiguous() and src.dim() > 0:
            cut = (half - done) // src.element_size()
            d, s_ = dst.reshape(-1), src.reshape(-1)
            halves[0].append((d[:cut], s_[:cut]))
            halves[1].append((d[cut:], s_[cut:]))
        else:
            halves[0 if done + n / 2 < half else 1].append((dst, src))
        done += n

    def run(part: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for dst, src in part:
            dst.copy_(src)

    helper = threading.Thread(target=run, args=(halves[1],), name="spotrain-snapshot")
    helper.start()
    run(halves[0])
    helper.join()


def prefetch_latest(store: Store) -> None:
    """Start reading and verifying ``store``'s newest checkpoint in a background thread.

    A replacement worker spends seconds between its start and the trainer's resume (interpreter,
    imports, building the model and optimizer); reading the checkpoint meanwhile takes the read off
    the changeover (``benchmarks/changeover.py``). The next :meth:`CheckpointManager.load` of that
    step takes the result; any other step is read as usual. Nothing is deleted by the prefetch."""
    with _prefetch_lock:
        if store.uri in _prefetches:
            return
        result: list[tuple[float | None, LoadedCheckpoint | None]] = []

        def read() -> None:
            try:
                reader = CheckpointManager(store, keep=1, writer=False)
                loaded = reader.load_latest()
                result.append((reader.last_load_s, loaded))
            except Exception as exc:  # a failed read ahead just means reading at resume time
                log.debug("checkpoint prefetch from %s failed: %s", store.uri, exc)

        thread = threading.Thread(target=read, name="spotrain-prefetch", daemon=True)
        _prefetches[store.uri] = (thread, result)
        thread.start()


def _take_prefetched(uri: str, step: int) -> tuple[float | None, LoadedCheckpoint] | None:
    """(read seconds, checkpoint) read ahead for ``step``, or None."""
    with _prefetch_lock:
        entry = _prefetches.get(uri)
        if entry is None or entry[0] is threading.current_thread():  # the prefetch's own reads
            return None
        del _prefetches[uri]
    thread, result = entry
    thread.join()
    if not result or result[0][1] is None or result[0][1].step != step:
        return None
    read_s, loaded = result[0]
    assert loaded is not None
    return read_s, loaded
