"""The gang's batch: what it trains at, how that is split, and who may change it (issue 11, wave 3).

:class:`BatchControl` owns the checkpointed :class:`~runtime.components.BatchState`, the layout it
implies (``runtime.adaptive.plan_batch``) and the first step worth measuring after a change. With
``batch_policy: adaptive`` the batch comes from the controller's directive (``SPOTRAIN_BATCH_JSON``:
the policy is then the only decider), else from the goodput optimizer on this gang's own profile,
re-optimized every ``rebatch_every_steps`` (more than 5 % predicted goodput, as Pollux). Rank 0
decides and broadcasts, so every rank trains at the same batch. Built by :func:`make_batch_control`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from cost_models import batching

from .adaptive import BatchPlan, Profile, choose_batch, parse_batch_json, plan_batch, round_batch
from .components import BatchState
from .config import TrainerConfig
from .data import DataOrder, DataPosition
from .dist import DistContext
from .stats import GradientNoiseStats
from .timeline import Timeline

# A gang without a controller changes its own batch only for more than this share of goodput (the
# policy's default threshold: one rule, ``cost_models.batching``).
REBATCH_GAIN = batching.DEFAULT_REBATCH.min_gain
# Who chose the batch a gang trains at (the ``source`` of ``batch`` and ``lr`` events, DESIGN.md wave 3).
SOURCE_CONTROLLER = "controller"
SOURCE_RUNTIME = "runtime"


class BatchControl:
    """The batch a gang trains at and its plan; ``state_dict()`` is the checkpoint's ``batch`` entry."""

    def __init__(self, *, config: TrainerConfig, ctx: DistContext, nodes: int, order: DataOrder,
                 position: DataPosition, profile: Profile, noise: GradientNoiseStats, timeline: Timeline,
                 say: Callable[[str], None]) -> None:
        self.config = config
        self.training = config.training
        self.ctx = ctx
        self.nodes = nodes
        self.order = order
        self.position = position  # shared with the trainer (updated in place, never replaced)
        self.profile = profile
        self.noise = noise
        self.timeline = timeline
        self.say = say
        self.adaptive = self.training.batch_policy == "adaptive"
        self.state = BatchState(global_batch_size=self.training.global_batch_size,
                                init_batch_size=self.training.global_batch_size)
        if order.steps_in_epoch(self.state.global_batch_size) < 1:
            raise ValueError(f"training.global_batch_size ({self.state.global_batch_size}) exceeds the dataset "
                             f"({order.num_samples} samples)")
        self.plan = self._plan(self.state.global_batch_size)
        self.measure_after = 0  # the first step whose time goes into the profile

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, int]:
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """An adaptive gang continues at the checkpoint's batch; a fixed one keeps its configured
        batch (and says so when the checkpoint's differs)."""
        saved = BatchState(global_batch_size=0, init_batch_size=0)
        saved.load_state_dict(state)
        if self.adaptive:
            self.state = saved
        elif saved.global_batch_size != self.state.global_batch_size:
            self.say(f"warning: checkpoint used global batch {saved.global_batch_size}, "
                     f"continuing with the configured {self.state.global_batch_size}")

    # ------------------------------------------------------------------ queries
    @property
    def max_batch_size(self) -> int:
        """The adaptive cap (``cost_models.batching.batch_cap``): ``training.max_batch_size``, else M0 x
        logical workers, within the dataset."""
        return batching.batch_cap(self.state.init_batch_size, self.training.logical_workers,
                                  self.training.max_batch_size, self.order.num_samples)

    @property
    def source(self) -> str:
        """``controller`` when a controller runs the gang (its directive ``SPOTRAIN_BATCH_JSON`` is
        present: the policy is then the only decider of the batch), else ``runtime``."""
        return SOURCE_CONTROLLER if self.config.batch_json is not None else SOURCE_RUNTIME

    def _plan(self, batch_size: int) -> BatchPlan:
        return plan_batch(batch_size, world_size=self.ctx.world_size, logical_workers=self.training.logical_workers,
                          max_local_bsz=self.training.max_local_batch_size)

    def _optimized(self, *, current: int | None = None) -> int | None:
        return choose_batch(self.profile, grad_sqr=self.noise.grad_sqr, grad_var=self.noise.grad_var,
                            nodes=self.nodes, replicas=self.ctx.world_size,
                            logical_workers=self.training.logical_workers, init_batch_size=self.state.init_batch_size,
                            max_batch_size=self.max_batch_size, max_local_bsz=self.training.max_local_batch_size,
                            current=current, min_gain=REBATCH_GAIN if current is not None else 0.0)

    # ------------------------------------------------------------------ changes
    def _set(self, decide: Callable[[], int | None], source: str) -> None:
        """Rank 0 decides (``decide() -> batch or None``) and broadcasts, so every rank trains with the
        same batch; the plan follows, and its first step is not measured."""
        chosen = torch.tensor([self.state.global_batch_size], dtype=torch.int64)
        if self.ctx.rank == 0:
            target = decide()
            if target is not None:
                chosen[0] = target
        if self.ctx.distributed:
            chosen = self.ctx.broadcast_(chosen.to(self.ctx.device)).cpu()
        if int(chosen[0]) != self.state.global_batch_size:
            self.say(f"batch {self.state.global_batch_size} -> {int(chosen[0])} on {self.ctx.world_size} "
                     f"worker(s) at step {self.position.step}, from {source} (source={self.source})")
            self.timeline.mark("batch", step=self.position.step, batch_size=int(chosen[0]),
                               was=self.state.global_batch_size, source=self.source)
            self.state.global_batch_size = int(chosen[0])
            if not self.order.has_batch(self.position, self.state.global_batch_size):
                # What is left of this epoch holds no batch of the new size: the next epoch starts
                # now, as ``DataOrder.advance`` does when a step leaves less than a batch.
                self.position.epoch += 1
                self.position.samples_in_epoch = 0
        self.plan = self._plan(self.state.global_batch_size)
        self.measure_after = self.position.step + 1

    def start(self) -> None:
        """This gang's batch (``batch_policy: adaptive``; ``runtime.adaptive``): the controller's
        directive, else the optimizer on the checkpointed profile, else the batch as it was."""
        if not self.adaptive:
            self.plan = self._plan(self.state.global_batch_size)
            self.measure_after = self.position.step + 1  # the gang's first step is not measured
            return
        if self.config.batch_json is not None:
            directive = parse_batch_json(self.config.batch_json)
            # A malformed directive keeps the batch as it was: the controller still decides.
            self._set(lambda: None if directive is None else round_batch(
                directive, logical_workers=self.training.logical_workers, init_batch_size=self.state.init_batch_size,
                max_batch_size=self.max_batch_size), "the controller's directive")
        else:
            if self.config.rebatch_every_steps:
                self.say(f"no controller runs this job: the runtime chooses its own batch (the goodput optimizer, "
                         f"re-optimized every {self.config.rebatch_every_steps} steps; source={SOURCE_RUNTIME})")
            self._set(self._optimized, "the goodput optimizer")

    def maybe_rebatch(self, *, done: bool) -> None:
        """Only without a controller (no directive: ``python train.py``, ``torchrun``) the runtime
        re-optimizes every ``rebatch_every_steps`` (more than 5 % predicted goodput, as Pollux). With a
        directive the policy is the only decider: it changes the batch by restarting the gang."""
        every = self.config.rebatch_every_steps
        if (not self.adaptive or not every or self.config.batch_json is not None
                or self.position.step % every or done):
            return
        self._set(lambda: self._optimized(current=self.state.global_batch_size),
                  "the goodput optimizer (more than 5 % goodput)")


def make_batch_control(*, config: TrainerConfig, ctx: DistContext, nodes: int, order: DataOrder,
                       position: DataPosition, profile: Profile, noise: GradientNoiseStats, timeline: Timeline,
                       say: Callable[[str], None]) -> BatchControl:
    """The trainer's batch component (an explicit factory: what it depends on is in its signature)."""
    return BatchControl(config=config, ctx=ctx, nodes=nodes, order=order, position=position, profile=profile,
                        noise=noise, timeline=timeline, say=say)
