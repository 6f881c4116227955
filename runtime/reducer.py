"""Combining the K logical-worker gradients into one global gradient.

Backward runs on ``loss / K``, and every logical worker's gradient lands in a flat row
``[grad (P) | float buffers (Q) | loss | |g_k|^2]``. Two modes:

- ``bitwise``: each local logical worker has its own row, zeroed before its backward, and the
  parameters' ``.grad`` are views into it, so backward accumulates there directly. Rows are
  all-gathered and summed in logical-worker order 0..K-1 (in the parameters' dtype: a fixed order
  is what makes it reproducible; float64 accumulation cost 15x more per pass on CPU). The arithmetic
  is the same whatever the placement of logical workers on physical ones, so training is bitwise
  reproducible across world sizes and restarts. Cost: every rank receives K rows instead of one
  (all-gather, not all-reduce).
- ``fast``: one row per rank. Backward produces each gradient as usual and a post-accumulate-grad
  hook copies it into the row (adds, for the rank's further logical workers) and drops it: two
  passes over the gradient instead of zeroing the row and accumulating into it (four). The ranks
  combine their rows with all-reduces that overlap the backward pass of the rank's last logical
  worker, as DDP does (Li et al., "PyTorch Distributed", VLDB'20): parameters are grouped, in
  reverse order, into buckets (1 MB first, then 25 MB) that are contiguous ranges of the row, and a
  bucket's asynchronous all-reduce starts once every gradient in it is in, in bucket order on every
  rank. The row's small tail (buffers, loss, |g_k|^2, flags) sits just before the gradient, so
  it travels in the last bucket: a separate small collective cost a whole round trip (~1 ms, 7% of
  a step here). Results agree with bitwise mode up to rounding.

Buffers (e.g. BatchNorm running statistics) follow the same path: each logical worker starts from the
step's buffers and the new float buffers are the mean over logical workers, so they too are
independent of placement. Two control slots per rank ride along in the same collective (stop and
checkpoint flags), so agreeing on a notice costs no extra round trip. The flags are asked for
(``flags`` of :meth:`GradientReducer.begin_step`) as late as possible: just before the last bucket
leaves, or in :meth:`GradientReducer.reduce`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from .dist import DistContext

CONTROL_SLOTS = 2  # [stop, checkpoint]
FIRST_BUCKET_BYTES = 1 << 20  # DDP's defaults: a small first bucket starts communication early
BUCKET_BYTES = 25 << 20


@dataclass
class ReduceResult:
    loss: float
    local_sqr: float
    total_sqr: float
    stop: bool
    checkpoint: bool
    measured: bool = True  # local_sqr and total_sqr were computed this step


class GradientReducer:
    def __init__(self, model: torch.nn.Module, ctx: DistContext, *, logical_ids: range,
                 logical_workers: int, mode: str) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no trainable parameters")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise ValueError(f"trainable parameters must share one floating dtype, got {sorted(map(str, dtypes))}")
        self.dtype = next(iter(dtypes))
        self.buffers = [b for b in model.buffers()]
        self.float_buffers = [b for b in self.buffers if b.is_floating_point()]
        self.ctx = ctx
        self.mode = mode
        self.K = logical_workers
        self.logical_ids = logical_ids
        self.P = sum(p.numel() for p in self.params)
        self.Q = sum(b.numel() for b in self.float_buffers)
        self.D = self.P + self.Q + 2
        device = self.params[0].device
        world = ctx.world_size
        self.rows_per_rank = -(-logical_workers // world)
        if mode == "bitwise":
            self.send = torch.zeros(self.rows_per_rank * self.D + CONTROL_SLOTS, dtype=self.dtype, device=device)
            self.total = torch.zeros(self.D, dtype=self.dtype, device=device)
            self.out = self.total[: self.P]
            # where logical worker k's row sits in the gathered tensor
            from .data import logical_workers_of

            self.row_of: list[tuple[int, int]] = []
            for r in range(world):
                for j, _k in enumerate(logical_workers_of(r, world, logical_workers)):
                    self.row_of.append((r, j))
            # .grad views per local logical worker, built once (assigning .grad costs microseconds
            # per parameter, so it happens only when the target changes)
            self._row_views = [self._views(self._row(j)[: self.P]) for j in range(len(logical_ids))]
        else:  # [float buffers (Q) | loss | |g_k|^2 | flags | grad (P)]
            self.T = self.Q + 2 + CONTROL_SLOTS
            self.send = torch.zeros(self.T + self.P, dtype=self.dtype, device=device)
            self.out = self.send[self.T :]
        self._out_views = self._views(self.out)
        self._grads_on: list[torch.Tensor] | None = None
        self._start_buffers: list[torch.Tensor] = []
        self.measure_noise = True
        self._sqr = torch.zeros((), dtype=self.dtype, device=device)  # |g_k|^2 of the current logical worker
        self._flags: Callable[[], tuple[bool, bool]] = lambda: (False, False)
        self._loss: torch.Tensor | None = None
        self._last_chunk = True
        self._first_chunk = True
        self._tail_done = False
        self._j = 0
        self._seen = bytearray(len(self.params))
        self._fired = 0
        self.overlap = mode == "fast" and ctx.distributed
        self._armed = False
        self._handles: list[Any] = []
        self._missing: list[int] = []
        self._next = 0
        if mode == "fast":
            self._plan_buckets()
            for i, p in enumerate(self.params):
                # torch leaves this Tensor method unannotated (2.13): strict mypy calls it untyped.
                p.register_post_accumulate_grad_hook(self._hook(i))  # type: ignore[no-untyped-call]

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for p in self.params:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def _row(self, j: int) -> torch.Tensor:
        """Bitwise mode: logical worker ``j``'s row ``[grad | buffers | loss | |g_k|^2]``."""
        return self.send[j * self.D : (j + 1) * self.D]

    def _tail_slots(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(buffers, loss, |g_k|^2, flags) slots of the local row."""
        if self.mode == "bitwise":
            return (self.send[self.P : self.P + self.Q], self.send[self.P + self.Q], self.send[self.P + self.Q + 1],
                    self.send[-CONTROL_SLOTS:])
        return self.send[: self.Q], self.send[self.Q], self.send[self.Q + 1], self.send[self.Q + 2 : self.T]

    def _add_tail(self, j: int, loss: torch.Tensor) -> None:
        """Add logical worker ``j``'s buffers, loss and |g_k|^2 to its row's tail."""
        if self.mode == "bitwise":
            row = self._row(j)
            buffers, loss_slot, sqr_slot = row[self.P : self.P + self.Q], row[self.P + self.Q], row[self.P + self.Q + 1]
        else:
            buffers, loss_slot, sqr_slot, _ = self._tail_slots()
        with torch.no_grad():
            if self.Q:
                offset = 0
                for b in self.float_buffers:
                    buffers[offset : offset + b.numel()].add_(b.detach().reshape(-1).to(self.dtype))
                    offset += b.numel()
            loss_slot.add_(loss.detach().to(self.dtype))
            if self.measure_noise:
                sqr_slot.add_(self._sqr * (self.K * self.K))

    def _set_flags(self, flags: torch.Tensor) -> None:
        stop, checkpoint = self._flags()
        flags[0] = float(stop)
        flags[1] = float(checkpoint)

    def _point_grads(self, views: list[torch.Tensor] | None) -> None:
        first = self.params[0].grad
        if self._grads_on is views and (first is None if views is None else first is views[0]):
            return
        for i, p in enumerate(self.params):
            p.grad = None if views is None else views[i]
        self._grads_on = views

    # ------------------------------------------------------------------ fast: hooks and buckets
    def _plan_buckets(self) -> None:
        offsets, offset = [], 0
        for p in self.params:
            offsets.append(offset)
            offset += p.numel()
        element = self.params[0].element_size()
        self._buckets: list[tuple[int, int]] = []  # [start, end) in the flat row, in launch order
        self._bucket_of: list[int] = [0] * len(self.params)
        self._bucket_size: list[int] = []
        end, count, limit = self.P, 0, FIRST_BUCKET_BYTES
        for i in reversed(range(len(self.params))):
            self._bucket_of[i] = len(self._buckets)
            count += 1
            if (end - offsets[i]) * element >= limit or i == 0:
                self._buckets.append((offsets[i], end))
                self._bucket_size.append(count)
                end, count, limit = offsets[i], 0, BUCKET_BYTES
        # in ``send`` coordinates; the last bucket to leave also carries the tail
        self._buckets = [(start + self.T, end + self.T) for start, end in self._buckets]
        self._buckets[-1] = (0, self._buckets[-1][1])

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        view = self._out_views[i]

        def on_grad(param: torch.Tensor) -> None:
            g = param.grad
            if g is None or not self._last_chunk:  # a logical worker's earlier chunks accumulate in .grad
                return
            with torch.no_grad():
                if self._j == 0:
                    view.copy_(g)
                else:
                    view.add_(g)
                if self.measure_noise:
                    flat = g.reshape(-1)
                    self._sqr += torch.dot(flat, flat)
            param.grad = None
            if not self._seen[i]:
                self._seen[i] = 1
                self._fired += 1
            if self._armed:
                b = self._bucket_of[i]
                self._missing[b] -= 1
                if self._missing[b] == 0:
                    self._launch_ready()

        return on_grad

    def _launch_ready(self) -> None:
        """Launch, in order, every bucket from the next one on whose gradients are all in."""
        while self._next < len(self._buckets) and self._missing[self._next] == 0:
            start, end = self._buckets[self._next]
            if self._next == len(self._buckets) - 1:  # the tail leaves with the last bucket
                assert self._loss is not None
                self._add_tail(self._j, self._loss)
                self._set_flags(self._tail_slots()[3])
                self._tail_done = True
            self._handles.append(dist.all_reduce(self.send[start:end], op=dist.ReduceOp.SUM, async_op=True))
            self._next += 1

    # ------------------------------------------------------------------ per step
    def begin_step(self, *, measure_noise: bool = True,
                   flags: Callable[[], tuple[bool, bool]] = lambda: (False, False)) -> None:
        """``measure_noise``: compute this step's |g_k|^2 and |g|^2 (passes over the gradient).
        ``flags() -> (stop, checkpoint)`` is called once, as late as the collective allows."""
        self.measure_noise = measure_noise
        self._flags = flags
        self._tail_done = False
        if self.buffers:
            self._start_buffers = [b.detach().clone() for b in self.buffers]

    def begin_logical(self, j: int) -> None:
        """Prepare the ``j``-th local logical worker's backward."""
        self._j = j
        self._first_chunk, self._last_chunk = True, True
        self._sqr.zero_()
        if self.mode == "bitwise":
            self._row(j).zero_()
            self._point_grads(self._row_views[j])
        else:
            if j == 0:
                self.send[: self.T].zero_()
            self._point_grads(None)
            self._seen = bytearray(len(self.params))
            self._fired = 0
            if self.overlap and j == len(self.logical_ids) - 1:
                self._armed = True
                self._missing = list(self._bucket_size)
                self._next = 0
        if j > 0 and self.buffers:
            with torch.no_grad():
                for b, start in zip(self.buffers, self._start_buffers):
                    b.copy_(start)

    def backward_loss(self, loss: torch.Tensor, *, weight: float = 1.0, last: bool = True) -> torch.Tensor:
        """What to call backward on: ``loss / K``, so that rows sum to the mean gradient directly
        (one pass over the parameters fewer than dividing afterwards).

        A logical worker's micro-batch may run in chunks (a per-GPU memory limit): call this once per
        chunk with ``weight`` = its share of the micro-batch and ``last`` on the final one; the chunks'
        gradients accumulate and the logical worker's loss is their weighted sum."""
        if weight == 1.0 and last and self._first_chunk:
            self._loss = loss
        elif self._first_chunk:
            self._loss = loss.detach() * weight
        else:
            assert self._loss is not None
            self._loss = self._loss + loss.detach() * weight
        self._first_chunk, self._last_chunk = False, last
        return loss / self.K if weight == 1.0 else loss * (weight / self.K)

    @property
    def logical_loss(self) -> torch.Tensor:
        """The current logical worker's loss so far (the weighted sum of its chunks)."""
        assert self._loss is not None
        return self._loss

    def end_logical(self, j: int, loss: torch.Tensor) -> None:
        with torch.no_grad():
            if self.mode == "bitwise":
                if self.measure_noise:
                    g = self._row(j)[: self.P]
                    self._sqr += torch.dot(g, g)
            else:
                if self._fired < len(self.params) and j == 0:  # parameters without a gradient
                    for i, seen in enumerate(self._seen):
                        if not seen:
                            self._out_views[i].zero_()
                if self._armed:
                    self._armed = False
                    self._missing = [0] * len(self._buckets)
                    self._loss = loss
                    self._launch_ready()
        if not self._tail_done:
            self._add_tail(j, loss)

    def reduce(self) -> ReduceResult:
        """Combine the rows of every rank; leaves the mean gradient in ``.grad`` of every parameter."""
        if not self._tail_done:
            self._set_flags(self._tail_slots()[3])
        if self.mode == "bitwise":
            gathered = self.ctx.all_gather(self.send)
            flags = gathered[:, -CONTROL_SLOTS:].sum(dim=0)
            rows = [gathered[r, j * self.D : (j + 1) * self.D] for r, j in self.row_of]
            total = self.total
            total.copy_(rows[0])
            for row in rows[1:]:  # fixed order 0..K-1, whatever the placement
                total.add_(row)
            total[self.P :].div_(self.K)
            tail = total[self.P :]
        else:
            for handle in self._handles:  # the buckets, the last one with the tail (none when W = 1)
                handle.wait()
            self._handles = []
            flags = self.send[self.Q + 2 : self.T].clone()
            tail = self.send[: self.Q + 2]
            tail.div_(self.K)
        stats = tail[self.Q :].tolist()
        buffers_mean = tail[: self.Q]
        self._point_grads(self._out_views)
        if self.buffers:
            # integer buffers (e.g. num_batches_tracked) advance the same way in every logical
            # worker, so each rank already holds the placement-independent value
            with torch.no_grad():
                offset = 0
                for b in self.float_buffers:
                    b.copy_(buffers_mean[offset : offset + b.numel()].view_as(b))
                    offset += b.numel()
        total_sqr = float(torch.dot(self.out, self.out)) if self.measure_noise else 0.0
        f = flags.tolist()
        return ReduceResult(loss=stats[0], local_sqr=stats[1], total_sqr=total_sqr, stop=f[0] > 0,
                            checkpoint=f[1] > 0, measured=self.measure_noise)
