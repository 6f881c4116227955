"""A training worker for the kill -9 test (``test_kill_during_checkpoint.py``), run in its own process.

``attempt`` trains a small model with the real ``ElasticTrainer`` and a checkpoint at every step
(the runtime's periodic path: snapshot at the boundary, persisted in a background thread) to
``root``'s ``file://`` store, and appends what it does to ``log``: ``resumed <step|none>`` once it
resumed, ``durable <step>`` whenever a checkpoint became durable, ``done`` at the end.

With ``kill_at = n > 0`` it sends itself SIGKILL at the n-th filesystem event of checkpoint writing:
a temporary file or directory created, each 16 KiB piece of a file written, an ``fsync`` (the data
is written, not yet renamed into place), a rename into place, an unlink or rmdir (pruning, and
removing a marker or a killed writer's temporary). The event is logged first (``kill <n> <event>``).
The hooks are this process's own (it runs nothing else), and the log is written with the real
functions, so it is never an event itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any, BinaryIO

PIECE_BYTES = 16 * 1024
MAX_STEPS = 40
JOB = "rel-kill"

_real = {name: getattr(os, name) for name in ("open", "fsync", "replace", "unlink", "rmdir", "mkdir", "write")}


class _Log:
    def __init__(self, path: str) -> None:
        self.fd = _real["open"](path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def line(self, text: str) -> None:
        _real["write"](self.fd, (text + "\n").encode())


class _Events:
    """Counts checkpoint-writing events; SIGKILLs this process at number ``kill_at``."""

    def __init__(self, log: _Log, kill_at: int) -> None:
        self.log, self.kill_at, self.count = log, kill_at, 0

    def __call__(self, what: str) -> None:
        self.count += 1
        if self.count == self.kill_at:
            self.log.line(f"kill {self.count} {what}")
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        def created(path: Any, flags: int, *a: Any, **k: Any) -> int:
            fd: int = _real["open"](path, flags, *a, **k)
            if flags & os.O_CREAT:
                self(f"created {os.fsdecode(path)}")
            return fd

        def after(name: str) -> Any:
            def hooked(*a: Any, **k: Any) -> Any:
                out = _real[name](*a, **k)
                self(f"{name} {os.fsdecode(a[-1] if name == 'replace' else a[0])}")
                return out
            return hooked

        def fsync(fd: int) -> None:
            self("fsync (written, not yet renamed)")
            _real["fsync"](fd)

        os.open = created  # type: ignore[assignment]
        os.fsync = fsync
        for name in ("replace", "unlink", "rmdir", "mkdir"):
            setattr(os, name, after(name))


class _PieceFile:
    """The store's file, written in PIECE_BYTES pieces with an event after each."""

    def __init__(self, f: BinaryIO, events: _Events, relpath: str) -> None:
        self.f, self.events, self.relpath = f, events, relpath

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE_BYTES):
            piece = view[start:start + PIECE_BYTES]
            while piece:
                n = self.f.write(piece)
                piece = piece[n if n is not None else len(piece):]
            self.events(f"wrote {min(start + PIECE_BYTES, len(view))}/{len(view)} bytes of {self.relpath}")
        return len(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


class _PieceStore:
    def __init__(self, inner: Any, events: _Events) -> None:
        self.inner, self.events = inner, events

    @contextlib.contextmanager
    def writer(self, relpath: str, *, sync_dir: bool = True) -> Iterator[Any]:
        with self.inner.writer(relpath, sync_dir=sync_dir) as f:
            yield _PieceFile(f, self.events, relpath)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def build(root: str, attempt_no: int) -> Any:
    import torch
    import torch.nn.functional as F

    from runtime import CheckpointConfig, ElasticTrainer, NoticeConfig, TrainerConfig, TrainingConfig

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(128, 32, generator=g)
    y = x @ torch.randn(32, 4, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4))  # ~37k params
    config = TrainerConfig(
        training=TrainingConfig(logical_workers=2, global_batch_size=16, determinism="bitwise"),
        checkpoint=CheckpointConfig(uri=f"file://{root}/{JOB}", interval_s=1e-9, keep=3),
        notices=NoticeConfig(handle_sigterm=False), max_steps=MAX_STEPS, job_id=JOB, attempt=attempt_no,
        progress_interval_s=1e9)
    return ElasticTrainer(model, torch.optim.Adam(model.parameters(), lr=1e-3), torch.utils.data.TensorDataset(x, y),
                          config=config, loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]))


def attempt(root: str, log_path: str, kill_at: int, attempt_no: int) -> None:
    """One worker's life (see the module doc); exits 0 when training finished."""
    log = _Log(log_path)
    events = _Events(log, kill_at)
    trainer = build(root, attempt_no)
    trainer.checkpoints.store = _PieceStore(trainer.checkpoints.store, events)
    events.install()  # kill_at 0: counted, never killed
    durable, first = None, True
    for _ in trainer:
        if first:  # the resume happened as the iteration began
            log.line(f"resumed {trainer.resumed_from if trainer.resumed_from is not None else 'none'}")
            first = False
        if trainer.checkpoints.last_durable_step != durable:
            durable = trainer.checkpoints.last_durable_step
            log.line(f"durable {durable}")
    if first:  # resumed with nothing left to train
        log.line(f"resumed {trainer.resumed_from if trainer.resumed_from is not None else 'none'}")
    code = trainer.finish()
    log.line(f"durable {trainer.checkpoints.last_durable_step}")
    log.line(f"events {events.count}")
    log.line(f"done {code}")
