"""Combining the K logical-worker gradients into one global gradient.

Backward runs on ``loss / K``, and every logical worker's gradient lands in a flat row ``[grad (P) | float buffers (Q) | loss | |g_k|^2]``
(parameters' ``.grad`` are views into the row, so backward writes there directly). Two modes:

- ``bitwise``: rows are all-gathered and summed in logical-worker order 0..K-1 (in the parameters'
  dtype: a fixed order is what makes it reproducible; float64 accumulation cost 15x more per pass
  on CPU). The arithmetic is the same whatever the placement of logical workers on physical ones,
  so training is bitwise reproducible across world sizes and restarts. Cost: every rank receives
  K rows instead of one (all-gather, not all-reduce).
- ``fast``: each rank sums its own rows into one buffer, and a single flat all-reduce combines the
  ranks, like DDP with one bucket. Results agree with bitwise mode up to rounding.

Buffers (e.g. BatchNorm running statistics) follow the same path: each logical worker starts from the
step's buffers and the new float buffers are the mean over logical workers, so they too are
independent of placement. Two control slots per rank ride along in the same collective (stop and
checkpoint flags), so agreeing on a notice costs no extra round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dist import DistContext

CONTROL_SLOTS = 2  # [stop, checkpoint]


@dataclass
class ReduceResult:
    loss: float
    local_sqr: float
    total_sqr: float
    stop: bool
    checkpoint: bool


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
        else:
            self.send = torch.zeros(self.D + CONTROL_SLOTS, dtype=self.dtype, device=device)
            self.scratch = torch.zeros(self.P, dtype=self.dtype, device=device) if len(logical_ids) > 1 else None
            self.out = self.send[: self.P]
        self._out_views = self._views(self.out)
        self._start_buffers: list[torch.Tensor] = []

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for p in self.params:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def _row(self, j: int) -> torch.Tensor:
        if self.mode == "bitwise":
            return self.send[j * self.D : (j + 1) * self.D]
        return self.send[: self.D]

    def begin_step(self) -> None:
        if self.buffers:
            self._start_buffers = [b.detach().clone() for b in self.buffers]

    def begin_logical(self, j: int) -> None:
        """Point ``.grad`` at fresh zeros for the ``j``-th local logical worker."""
        if self.mode == "bitwise" or j == 0:
            row = self._row(j)
            row.zero_()
            target = row[: self.P]
        else:
            assert self.scratch is not None
            target = self.scratch
            target.zero_()
        for p, v in zip(self.params, self._views(target)):
            p.grad = v
        if j > 0 and self.buffers:
            with torch.no_grad():
                for b, start in zip(self.buffers, self._start_buffers):
                    b.copy_(start)

    def backward_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """What to call backward on: ``loss / K``, so that rows sum to the mean gradient directly
        (one pass over the parameters fewer than dividing afterwards)."""
        return loss / self.K

    def end_logical(self, j: int, loss: torch.Tensor) -> None:
        row = self._row(j)
        if self.mode == "bitwise" or j == 0:
            g = row[: self.P]
        else:
            assert self.scratch is not None
            g = self.scratch
            row[: self.P].add_(g)
        with torch.no_grad():
            if self.Q:
                offset = self.P
                for b in self.float_buffers:
                    row[offset : offset + b.numel()].add_(b.detach().reshape(-1).to(self.dtype))
                    offset += b.numel()
            row[self.P + self.Q].add_(loss.detach().to(self.dtype))
            row[self.P + self.Q + 1].add_(torch.dot(g, g) * (self.K * self.K))

    def reduce(self, *, stop: bool, checkpoint: bool) -> ReduceResult:
        """Combine the rows of every rank; leaves the mean gradient in ``.grad`` of every parameter."""
        control = self.send[-CONTROL_SLOTS:]
        control[0] = float(stop)
        control[1] = float(checkpoint)
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
            self.ctx.all_reduce_sum_(self.send)
            flags = self.send[-CONTROL_SLOTS:].clone()
            tail = self.send[self.P : self.D]
            tail.div_(self.K)
        stats = tail[self.Q :].tolist()
        buffers_mean = tail[: self.Q]
        for p, v in zip(self.params, self._out_views):
            p.grad = v
        if self.buffers:
            # integer buffers (e.g. num_batches_tracked) advance the same way in every logical
            # worker, so each rank already holds the placement-independent value
            with torch.no_grad():
                offset = 0
                for b in self.float_buffers:
                    b.copy_(buffers_mean[offset : offset + b.numel()].view_as(b))
                    offset += b.numel()
        total_sqr = float(torch.dot(self.out, self.out))
        f = flags.tolist()
        return ReduceResult(loss=stats[0], local_sqr=stats[1], total_sqr=total_sqr, stop=f[0] > 0, checkpoint=f[1] > 0)
