"""ElasticTrainer: the training loop with logical workers, checkpoints and notices built in.

A plain PyTorch loop becomes::

    trainer = runtime.ElasticTrainer(model, optimizer, train_set, loss_fn=loss_fn,
                                     config=runtime.TrainerConfig.from_env(epochs=10))
    for step in trainer:                  # one optimizer step per iteration
        if step.epoch_end:
            trainer.report(metric=evaluate(model), metric_name="accuracy")
    runtime.exit_worker(trainer.finish()) # 0 with final weights written, or 85 after a notice

``loss_fn(model, batch) -> loss`` is called once per logical worker per step, on that worker's
micro-batch, after seeding every generator from (seed, step, logical rank). The iterator resumes
from the newest valid checkpoint, checkpoints every ``interval_s`` (snapshot at the boundary,
persisted in the background) and, on a stop notice seen by any rank, checkpoints at the same
boundary on every rank and ends; :meth:`finish` then returns ``EXIT_RESCHEDULE``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any, Callable, Iterator

import numpy as np
import torch

from . import protocol
from .adaptive import BatchPlan, Profile, ScaleInvariantProgress, nodes_of
from .batch_control import make_batch_control
from .checkpoint import CheckpointManager, directory_owner, prefetch_latest
from .components import BatchState, Stateful, StepResult, clone_tensors, configure_determinism, to_device
from .config import TrainerConfig
from .data import DataOrder, DataPosition, fetch, logical_workers_of
from .dist import DistContext
from .errors import StateError
from .lr_scaling import adascale_gain, is_adaptive_optimizer, lr_factor
from .notices import NoticeWatcher
from .progress import ProgressWriter
from .reducer import GradientReducer, ReduceResult
from .seeding import capture_rng_state, restore_rng_state, seed_between_steps, seed_logical_worker
from .stats import ConsecutiveSteps, GradientNoiseStats, estimate
from .store import make_store
from .timeline import Timeline, process_start_unix_s

__all__ = ["ElasticTrainer", "StepResult", "configure_determinism", "exit_worker", "prefetch_checkpoint"]


class ElasticTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: torch.utils.data.Dataset[Any],
        *,
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        config: TrainerConfig,
        lr_scheduler: Any = None,
        grad_scaler: Any = None,
        dist_context: DistContext | None = None,
    ) -> None:
        init_unix_s = time.time()
        configure_determinism(config)
        self.config = config
        self.training = config.training
        self.ctx = dist_context or DistContext.from_env(config.backend)
        self.model = model.to(self.ctx.device)
        self.optimizer = optimizer
        self.dataset = dataset
        self.loss_fn = loss_fn
        self.lr_scheduler = lr_scheduler
        self.grad_scaler = grad_scaler
        self.is_rank0 = self.ctx.rank == 0
        self.logical_ids = logical_workers_of(self.ctx.rank, self.ctx.world_size, self.training.logical_workers)
        self.order = DataOrder(num_samples=len(dataset), seed=self.training.seed)  # type: ignore[arg-type]
        self.position = DataPosition()
        self.timeline = Timeline(config.timeline_file if self.is_rank0 else None, attempt=config.attempt)
        self.noise = GradientNoiseStats()
        # Issue 11: per-configuration step/sync times, scale-invariant progress, the batch and its plan.
        self.profile = Profile()
        nodes = nodes_of(self.ctx.world_size, int(os.environ.get("LOCAL_WORLD_SIZE", self.ctx.world_size)))
        self.batches = make_batch_control(config=config, ctx=self.ctx, nodes=nodes, order=self.order,
                                          position=self.position, profile=self.profile, noise=self.noise,
                                          timeline=self.timeline, say=self._say)
        self.iterations = ScaleInvariantProgress()
        self.consecutive = ConsecutiveSteps() if self.training.logical_workers == 1 else None
        self.adaptive = self.training.batch_policy == "adaptive"
        self.adaptive_optimizer = is_adaptive_optimizer(optimizer)
        if self.adaptive_optimizer and self.training.lr_scaling == "adascale" and self.adaptive:
            self._say("note: lr_scaling adascale with an Adam-family optimizer scales the learning rate by the "
                      "square root of the AdaScale gain (AdaptDL's AdamScale); progress still counts the gain")
        self.metric: float | None = None
        self.metric_name: str | None = None
        self._extra: dict[str, Stateful] = {}
        # Checkpoints of another job are refused (issue 14, finding 2); the directory's own job is the
        # URI's (``<store>/<job_id>``), which a job started by ``spotrain resume`` continues.
        self.checkpoints = CheckpointManager(make_store(config.checkpoint.uri), keep=config.checkpoint.keep,
                                             writer=self.is_rank0, job_id=directory_owner(config.checkpoint.uri),
                                             also_accept=(config.job_id,), signing_key=config.checkpoint.signing_key)
        self.progress = ProgressWriter(config.progress_file if self.is_rank0 else None,
                                       interval_s=config.progress_interval_s)
        self.watcher = NoticeWatcher(config.notices).start()
        started = process_start_unix_s()
        if started is not None:
            self.timeline.mark("process_start", t_unix_s=started)
        self.timeline.mark("trainer_init", t_unix_s=init_unix_s, world_size=self.ctx.world_size)
        self.stopped = False
        self.stall_s_total = 0.0
        self._started = False
        self._ended_early = False  # end_early(): the script's own stop rule (a target metric) held
        self._last_ckpt_time = time.monotonic()
        self._step_time_ema: float | None = None
        self._pending: ReduceResult | None = None
        self.resumed_from: int | None = None
        self.reducer = GradientReducer(self.model, self.ctx, logical_ids=self.logical_ids,
                                       logical_workers=self.training.logical_workers,
                                       mode=self.training.determinism)

    # ------------------------------------------------------------------ state
    def register_state(self, name: str, obj: Stateful) -> None:
        """Checkpoint ``obj`` (anything with state_dict/load_state_dict) with the trainer."""
        if self._started:
            raise ValueError("register_state must be called before training starts")
        self._extra[name] = obj

    def state_dict(self) -> dict[str, Any]:
        rng_tensors, _ = capture_rng_state()
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "grad_scaler": self.grad_scaler.state_dict() if self.grad_scaler is not None else None,
            "extra": {k: v.state_dict() for k, v in self._extra.items()},
            "noise": self.noise.state_dict(),
            "batch": self.batches.state_dict(),
            "position": self.position.state_dict(),
            "trainer": {"metric": self.metric, "metric_name": self.metric_name},
            "adaptive": {"iterations": self.iterations.state_dict(), "profile": self.profile.state_dict()},
            "rng": rng_tensors,
        }

    def load_state_dict(self, state: dict[str, Any], rng_meta: dict[str, Any] | None = None) -> None:
        self.model.load_state_dict(state["model"])
        # A loaded checkpoint's tensors are views into its read buffers; the model copies its part,
        # the rest is cloned so that nothing keeps a whole buffer alive.
        state = {k: v if k == "model" else clone_tensors(v) for k, v in state.items()}
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if self.grad_scaler is not None and state.get("grad_scaler") is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        for name, obj in self._extra.items():
            if name in state.get("extra", {}):
                obj.load_state_dict(state["extra"][name])
        self.noise.load_state_dict(state["noise"])
        self.position.load_state_dict(state["position"])
        self.batches.load_state_dict(state["batch"])
        self.metric = state["trainer"].get("metric")
        self.metric_name = state["trainer"].get("metric_name")
        adaptive = state.get("adaptive")  # absent in checkpoints written before issue 11
        if adaptive is not None:
            self.iterations.load_state_dict(adaptive.get("iterations", {}))
            self.profile.load_state_dict(adaptive.get("profile", {}))
        else:
            self.iterations = ScaleInvariantProgress(float(self.position.step), self.position.step)
        if rng_meta is not None:
            restore_rng_state(state["rng"], rng_meta)

    def _resume(self) -> None:
        t0 = time.perf_counter()
        chosen = torch.tensor([-1], dtype=torch.int64)
        loaded = None
        if self.is_rank0:
            loaded = self.checkpoints.load_latest()
            if loaded is not None:
                chosen[0] = loaded.step
        if self.ctx.distributed:
            chosen = self.ctx.broadcast_(chosen.to(self.ctx.device)).cpu()
        step = int(chosen[0])
        if step >= 0:
            if loaded is None:
                loaded = self.checkpoints.load(step)
            self._check_compatible(loaded.manifest, step)
            self.load_state_dict(loaded.state, loaded.manifest.get("rng"))
            self.resumed_from = step
            self.checkpoints.last_durable_step = step
            self.timeline.mark("restore_done", step=step, restore_s=time.perf_counter() - t0,
                               read_s=self.checkpoints.last_load_s, prefetched=self.checkpoints.last_load_prefetched)
            self._say(f"resumed from checkpoint {step} (epoch {self.position.epoch}) "
                      f"with {self.ctx.world_size} worker(s)")
        elif self.ctx.distributed:
            with torch.no_grad():
                for t in list(self.model.parameters()) + list(self.model.buffers()):
                    self.ctx.broadcast_(t.data)
        self.batches.start()

    @property
    def batch(self) -> BatchState:
        """The batch this gang trains at (checkpointed; ``batch_policy: adaptive`` may change it)."""
        return self.batches.state

    @property
    def plan(self) -> BatchPlan:
        """How the batch is laid out: micro-batches per logical worker, chunks, accumulation."""
        return self.batches.plan

    @property
    def batch_source(self) -> str:
        """Who chooses the batch: ``controller`` (a directive is present) or ``runtime``."""
        return self.batches.source

    def _check_compatible(self, manifest: dict[str, Any], step: int) -> None:
        """The checkpoint must come from the same logical layout, seed and determinism mode: with
        another, the data order and the per-logical-worker randomness change, and a bitwise job would
        silently stop being bitwise. Those are refused in bitwise mode and warned about otherwise."""
        ours = {"logical_workers": self.training.logical_workers, "seed": self.training.seed,
                "determinism": self.training.determinism}
        differ = {k: (manifest[k], v) for k, v in ours.items() if k in manifest and manifest[k] != v}
        if not differ:
            return
        what = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in differ.items())
        if self.training.determinism == "bitwise" or manifest.get("determinism") == "bitwise":
            raise StateError(f"checkpoint {step} was written with other training settings ({what}); resuming would "
                             "break the bitwise guarantee: restore them, or start a new job")
        self._say(f"warning: checkpoint {step} was written with other training settings ({what}); resuming anyway")

    # ------------------------------------------------------------------ loop
    @property
    def total_iterations(self) -> float:
        """Scale-invariant iterations (at the initial batch) the job trains for (adaptive mode)."""
        per_epoch = self.order.steps_in_epoch(self.batch.init_batch_size)
        by_epochs = self.config.epochs * per_epoch if self.config.epochs is not None else None
        limits = [x for x in (by_epochs, self.config.max_steps) if x is not None]
        return float(min(limits))

    @property
    def total_steps(self) -> int:
        if self.adaptive:  # steps done, plus the iterations left at the current step's worth
            left = max(self.total_iterations - self.iterations.iterations, 0.0)
            gain = adascale_gain(batch_size=self.batch.global_batch_size, init_batch_size=self.batch.init_batch_size,
                                 grad_sqr=self.noise.grad_sqr, grad_var=self.noise.grad_var)
            return self.position.step + math.ceil(left / gain - 1e-9)
        per_epoch = self.order.steps_in_epoch(self.batch.global_batch_size)
        by_epochs = self.config.epochs * per_epoch if self.config.epochs is not None else None
        if self.config.max_steps is not None:
            return self.config.max_steps if by_epochs is None else min(by_epochs, self.config.max_steps)
        assert by_epochs is not None
        return by_epochs

    @property
    def done(self) -> bool:
        if self._ended_early:
            return True
        if self.adaptive:
            return self.iterations.iterations >= self.total_iterations - 1e-9
        if self.config.max_steps is not None and self.position.step >= self.config.max_steps:
            return True
        return self.config.epochs is not None and self.position.epoch >= self.config.epochs

    def __iter__(self) -> Iterator[StepResult]:
        if not self._started:
            self._started = True
            self._resume()
        while True:
            if self.done:
                return
            if self._pending is not None and (self._pending.stop or self._pending.checkpoint):
                stop = self._pending.stop
                self._pending = None
                if stop:
                    self.timeline.mark("boundary", step=self.position.step)
                self.checkpoint(wait=stop)
                if stop:
                    self.stopped = True
                    # Recorded for the controller: workers that then exit 0 (a script that drops
                    # finish()'s 85) are named as that, not as a crash (issue 13).
                    self.progress.update(force=True, stopped_at_notice=True)
                    self._say(f"stop notice: checkpoint {self.position.step} is durable; exiting "
                              f"{protocol.EXIT_RESCHEDULE}")
                    return
            result = self._train_step()
            self.batches.maybe_rebatch(done=self.done)
            if "first_step" not in self.timeline.seen:
                self.timeline.mark("first_step", step=result.step, step_time_s=result.step_time_s)
                if self.is_rank0:  # the optimizer's state exists now: the state has its final shapes
                    self.checkpoints.prepare_async(self.state_dict())
            yield result

    def _train_step(self) -> StepResult:
        t0 = time.perf_counter()
        B, K = self.batch.global_batch_size, self.training.logical_workers
        step, epoch = self.position.step, self.position.epoch
        self.model.train()

        def flags() -> tuple[bool, bool]:
            """Asked once per step, as late as the collective allows (fast mode: just before the
            last gradient bucket leaves, near the end of the last backward pass)."""
            stop_notice, ckpt_notice = self.watcher.poll()
            if stop_notice is not None:
                self.timeline.mark("notice_seen", once=True, step=step, reason=stop_notice.reason,
                                   source=stop_notice.source)
            periodic = self.is_rank0 and time.monotonic() - self._last_ckpt_time >= self.config.checkpoint.interval_s
            return stop_notice is not None, periodic or ckpt_notice is not None

        self.reducer.begin_step(measure_noise=K >= 2 and step % self.config.noise_every_steps == 0, flags=flags)
        chunks = self.plan.chunks
        for j, k in enumerate(self.logical_ids):
            seed_logical_worker(self.training.seed, step, k)
            idx = self.order.logical_indices(self.position, global_batch_size=B, logical_workers=K, logical_rank=k)
            self.reducer.begin_logical(j)
            parts = [idx] if chunks == 1 else np.array_split(idx, chunks)
            for i, part in enumerate(parts):
                batch = to_device(fetch(self.dataset, part), self.ctx.device)
                loss = self.loss_fn(self.model, batch)
                weight = 1.0 if chunks == 1 else len(part) / len(idx)
                scaled = self.reducer.backward_loss(loss, weight=weight, last=i == len(parts) - 1)
                (self.grad_scaler.scale(scaled) if self.grad_scaler is not None else scaled).backward()
            self.reducer.end_logical(j, self.reducer.logical_loss)
        # On CUDA the end of the backward pass is only known after waiting for the compute stream (not
        # the all-reduces': they have their own), which costs a little overlap: every noise_every_steps.
        measure = step >= self.batches.measure_after and (self.ctx.device.type != "cuda"
                                                   or step % self.config.noise_every_steps == 0)
        if measure and self.ctx.device.type == "cuda":
            torch.cuda.current_stream(self.ctx.device).synchronize()
        t_sync = time.perf_counter()
        result = self.reducer.reduce()
        sync_s = time.perf_counter() - t_sync
        self._apply_update(result)
        seed_between_steps(self.training.seed, step)
        data_epoch_end = self.order.advance(self.position, B)
        gain = adascale_gain(batch_size=B, init_batch_size=self.batch.init_batch_size,
                             grad_sqr=self.noise.grad_sqr, grad_var=self.noise.grad_var)
        before = self.iterations.iterations
        due = self.iterations.advance(gain)
        if self.lr_scheduler is not None:  # in scale-invariant iterations (adaptive; fixed: once per step)
            for _ in range(due if self.adaptive else 1):
                self.lr_scheduler.step()
        if self.adaptive:
            per_epoch = self.order.steps_in_epoch(self.batch.init_batch_size)
            epoch = int(math.floor(before / per_epoch + 1e-9))
            epoch_end = int(math.floor(self.iterations.iterations / per_epoch + 1e-9)) > epoch
        else:
            epoch_end = data_epoch_end
        self._pending = result
        dt = time.perf_counter() - t0
        if measure:
            p = self.plan
            self.profile.add((self.batches.nodes, self.ctx.world_size, p.local_bsz, p.accum_steps), dt, sync_s)
        self._step_time_ema = dt if self._step_time_ema is None else 0.9 * self._step_time_ema + 0.1 * dt
        layout: dict[str, Any] = self.plan.to_json()  # its keys name layout fields, never ``force``
        self.progress.update(
            step=self.position.step, total_steps=self.total_steps, epoch=self.position.epoch, loss=result.loss,
            step_time_s=self._step_time_ema, samples_per_s=B / self._step_time_ema,
            world_size=self.ctx.world_size, grad_sqr=self.noise.grad_sqr, grad_var=self.noise.grad_var,
            last_checkpoint_step=self.checkpoints.last_durable_step, stall_s=self.stall_s_total,
            last_checkpoint_unix_s=self.checkpoints.last_durable_unix_s,
            checkpoint_size_gb=self.checkpoints.last_durable_size_gb,
            progress_iterations=self.iterations.iterations, lr_factor=self.lr_factor(),
            profile=self.profile.rows(), batch_source=self.batches.source, **layout,
        )
        return StepResult(step=self.position.step, total_steps=self.total_steps, epoch=epoch,
                          epoch_end=epoch_end, loss=result.loss, step_time_s=dt, batch_size=B)

    def lr_factor(self) -> float:
        """The factor the learning rate is multiplied by at the current batch (``runtime.lr_scaling``)."""
        return lr_factor(self.training.lr_scaling, batch_size=self.batch.global_batch_size,
                         init_batch_size=self.batch.init_batch_size, grad_sqr=self.noise.grad_sqr,
                         grad_var=self.noise.grad_var, adaptive_optimizer=self.adaptive_optimizer)

    def _apply_update(self, result: ReduceResult) -> None:
        B = self.batch.global_batch_size
        if result.measured:
            scale2 = float(self.grad_scaler.get_scale()) ** 2 if self.grad_scaler is not None else 1.0
            est = estimate(local_sqr=result.local_sqr / scale2, total_sqr=result.total_sqr / scale2,
                           logical_workers=self.training.logical_workers, global_batch_size=B,
                           init_batch_size=self.batch.init_batch_size)
            if est is not None:  # one sample stands for noise_every_steps steps of the EMA
                self.noise.update(*est, batch_scale=B / self.batch.init_batch_size * self.config.noise_every_steps)
        elif self.consecutive is not None:
            self._consecutive_noise(B)
        if self.config.max_grad_norm is not None:
            if self.grad_scaler is not None:
                self.grad_scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.reducer.params, self.config.max_grad_norm)
        factor = self.lr_factor()
        self.stall_s_total += self.checkpoints.wait_copied()  # a pipelined snapshot reads the weights
        saved = [g["lr"] for g in self.optimizer.param_groups]
        if factor != 1.0:
            for g in self.optimizer.param_groups:
                g["lr"] = g["lr"] * factor
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()
        if factor != 1.0:
            for g, lr in zip(self.optimizer.param_groups, saved):
                g["lr"] = lr

    def _consecutive_noise(self, B: int) -> None:
        """One logical worker: the statistics from a pair of consecutive steps every
        ``noise_every_steps`` (``runtime.stats.ConsecutiveSteps``), on the unscaled mean gradient."""
        assert self.consecutive is not None
        every, step = self.config.noise_every_steps, self.position.step
        phase = step % every
        if every > 1 and phase not in (every - 1, 0):
            return
        if every > 1 and phase == every - 1:
            self.consecutive.reset()
        inv = 1.0 / float(self.grad_scaler.get_scale()) if self.grad_scaler is not None else 1.0
        grads = [p.grad if inv == 1.0 else p.grad * inv for p in self.reducer.params if p.grad is not None]
        est = self.consecutive.update(grads, batch_size=B, init_batch_size=self.batch.init_batch_size)
        if est is not None:
            self.noise.update(*est, batch_scale=B / self.batch.init_batch_size * every)

    # ------------------------------------------------------------------ checkpoints and reporting
    def checkpoint(self, *, wait: bool = False) -> None:
        """Checkpoint at this boundary on rank 0 (the state is identical on every rank)."""
        self._last_ckpt_time = time.monotonic()
        if not self.is_rank0:
            if wait:
                self.ctx.barrier()
            return
        _, rng_meta = capture_rng_state()
        manifest = {
            "epoch": self.position.epoch,
            "job_id": self.config.job_id,
            "attempt": self.config.attempt,
            "world_size": self.ctx.world_size,
            "logical_workers": self.training.logical_workers,
            "layout": {str(r): list(logical_workers_of(r, self.ctx.world_size, self.training.logical_workers))
                       for r in range(self.ctx.world_size)},
            "data_position": self.position.state_dict(),
            "batch": self.batches.state_dict(),
            "progress_iterations": self.iterations.iterations,
            "profile": self.profile.rows(),
            "determinism": self.training.determinism,
            "seed": self.training.seed,
            "rng": rng_meta,
        }
        # Parameters and optimizer state change only in the next optimizer step, which first waits for
        # their copy (``_apply_update``): outside a stop, that copy overlaps the next forward/backward.
        defer = set() if wait else self._deferrable_storages()
        snap = self.checkpoints.snapshot(self.position.step, self.state_dict(), manifest, defer=defer)
        self.stall_s_total += snap.stall_s
        self.checkpoints.persist_async(snap, urgent=wait)
        if wait:
            self.timeline.mark("snapshot_done", step=snap.step, stall_s=snap.stall_s)
            self.checkpoints.wait()
            self.timeline.mark("durable", t_unix_s=self.checkpoints.last_durable_unix_s, step=snap.step,
                               persist_s=self.checkpoints.last_persist_s)
            self.progress.update(force=True, last_checkpoint_step=self.checkpoints.last_durable_step,
                                 last_checkpoint_unix_s=self.checkpoints.last_durable_unix_s,
                                 checkpoint_size_gb=self.checkpoints.last_durable_size_gb,
                                 stall_s=self.stall_s_total)
            self.ctx.barrier()

    def _deferrable_storages(self) -> set[int]:
        tensors = [p.detach() for p in self.model.parameters()]
        for per_param in self.optimizer.state.values():
            tensors.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
        buffers = {b.untyped_storage().data_ptr() for b in self.model.buffers()}
        return {t.untyped_storage().data_ptr() for t in tensors if not t.is_cuda} - buffers

    def end_early(self) -> None:
        """End training at this step boundary, as if the schedule had run out: the loop stops before
        the next step and ``finish()`` writes the final weights. For a stop rule of the script's own,
        such as a target metric reached (Pollux's jobs train to a target, not a step count). Call it on
        every rank at the same step, from state every rank shares (the replicas' weights are
        identical, so each rank can evaluate the metric itself): a rank that trained on would wait
        in a collective for peers that have left."""
        self._ended_early = True

    def report(self, *, metric: float, metric_name: str) -> None:
        """Record the user's evaluation metric (checkpointed, and written to the progress file)."""
        self.metric, self.metric_name = float(metric), metric_name
        self.progress.update(force=True, metric=self.metric, metric_name=metric_name)

    def finish(self) -> int:
        """Wrap up: the worker-protocol exit code (0 with final weights written, 85 after a notice)."""
        code: int | None = None
        try:
            if self.stopped:
                code = protocol.EXIT_RESCHEDULE
                return code
            if not self.done:
                raise ValueError("finish() called before training ended (iterate the trainer to the end first)")
            if self.is_rank0:
                self.checkpoints.wait()
                url = self.checkpoints.write_final(self.model.state_dict(),
                                                   {"job_id": self.config.job_id, "step": str(self.position.step)})
                self.progress.update(force=True, final_model=url, step=self.position.step, completed=True)
                self._say(f"finished at step {self.position.step}; final weights: {url}")
            self.ctx.barrier()
            code = protocol.EXIT_DONE
            return code
        finally:
            self.close()
            self.timeline.mark("exiting", code=code)

    def close(self) -> None:
        self.watcher.close()
        self.progress.flush()  # the last step reached, not the last one a throttled write caught
        try:
            if self.is_rank0:
                self.checkpoints.wait()
        finally:
            self.ctx.close()  # the process group goes even when the last persist failed

    def __enter__(self) -> "ElasticTrainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _say(self, message: str) -> None:
        if self.is_rank0:
            print(f"[spotrain] {message}", file=sys.stderr, flush=True)


def prefetch_checkpoint(config: TrainerConfig) -> None:
    """Start reading and verifying the job's newest checkpoint now, in the background, so that the
    trainer's resume finds it in memory. Call it right after ``TrainerConfig.from_env``, before
    building the model: on a replacement worker the read then overlaps the script's own start."""
    prefetch_latest(make_store(config.checkpoint.uri))


def exit_worker(code: int) -> None:
    """End the worker process with ``code``: ``sys.exit(code)``, except after a stop notice.

    For ``EXIT_RESCHEDULE`` the process ends with ``os._exit`` once stdio and logging are flushed:
    the checkpoint is durable and the process group is gone, and the replacement workers wait for
    this exit, while the interpreter's teardown with torch loaded takes 0.5-2 s on this machine
    (benchmarks/changeover.py). Call it last, as ``runtime.exit_worker(trainer.finish())``: atexit
    handlers do not run on that path."""
    if code == protocol.EXIT_RESCHEDULE:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        logging.shutdown()
        os._exit(code)
    sys.exit(code)
