"""Configuration of the runtime: keyword-only dataclasses, validated when built.

One top-level :class:`TrainerConfig` nests a config per component (training semantics, checkpoints,
notices). :meth:`TrainerConfig.from_env` reads the worker protocol's environment
(``runtime/protocol.py``); every value has a default so that the same script also runs under plain
``torchrun`` or as a single ``python train.py``. A bad value raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

from cost_models import batching
from cost_models.spot_notices import DEFAULT_AWS_IMDS_ENDPOINT, DEFAULT_GCE_METADATA_ENDPOINT, SOURCES

from . import protocol

log = logging.getLogger(__name__)

Determinism = Literal["bitwise", "fast"]
BatchPolicy = Literal["fixed", "adaptive"]
LrScaling = Literal["adascale", "sqrt", "linear", "none"]

ENV_NOTICE_SOURCES = "SPOTRAIN_NOTICE_SOURCES"
ENV_AWS_IMDS_ENDPOINT = "SPOTRAIN_AWS_IMDS_ENDPOINT"
ENV_GCE_METADATA_ENDPOINT = "SPOTRAIN_GCE_METADATA_ENDPOINT"
ENV_NUM_THREADS = "SPOTRAIN_NUM_THREADS"
ENV_NOTICE_POLL_S = "SPOTRAIN_NOTICE_POLL_S"
ENV_TIMELINE_FILE = "SPOTRAIN_TIMELINE_FILE"
TIMELINE_NAME = "timeline.jsonl"

# The sources and their link-local addresses are the notice client's (contacted only when
# SPOTRAIN_NOTICE_SOURCES names the source).
_KNOWN_SOURCES = SOURCES


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(choices)}")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """The job spec's ``training`` section: what must not change when the world size does."""

    logical_workers: int = 1
    global_batch_size: int = 32
    batch_policy: BatchPolicy = "fixed"
    lr_scaling: LrScaling = "none"
    max_batch_size: int | None = None
    max_local_batch_size: int | None = None  # per-GPU micro-batch limit (memory); None: none
    determinism: Determinism = "bitwise"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("logical_workers", "global_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"training.{name}: must be a positive integer, got {value!r}")
        if (problem := batching.check_layout(self.global_batch_size, self.logical_workers)) is not None:
            raise ValueError(f"training.{problem}")
        _check_choice("training.batch_policy", self.batch_policy, ("fixed", "adaptive"))
        _check_choice("training.lr_scaling", self.lr_scaling, ("adascale", "sqrt", "linear", "none"))
        _check_choice("training.determinism", self.determinism, ("bitwise", "fast"))
        if self.max_batch_size is not None and (
                problem := batching.check_layout(self.global_batch_size, self.logical_workers, self.max_batch_size)):
            raise ValueError(f"training.{problem}")
        if self.max_local_batch_size is not None and (
                not isinstance(self.max_local_batch_size, int) or isinstance(self.max_local_batch_size, bool)
                or self.max_local_batch_size < 1):
            raise ValueError(f"training.max_local_batch_size: must be a positive integer, got "
                             f"{self.max_local_batch_size!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"training.seed: must be an integer, got {self.seed!r}")

    @classmethod
    def from_json(cls, text: str, *, defaults: "TrainingConfig | None" = None) -> "TrainingConfig":
        """Overlay the JSON object ``text`` (the spec's training section) on ``defaults``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{protocol.ENV_TRAINING_JSON}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{protocol.ENV_TRAINING_JSON}: expected a JSON object")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            log.warning("ignoring unknown training fields: %s", ", ".join(unknown))
        base = defaults or cls()
        return replace(base, **{k: v for k, v in data.items() if k in known})

    @property
    def micro_batch_size(self) -> int:
        """Samples per logical worker per step."""
        return self.global_batch_size // self.logical_workers


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often checkpoints are written (``<uri>/checkpoints/<step>/``)."""

    uri: str
    interval_s: float = 600.0
    keep: int = 3
    # The job's checkpoint key, hex (``SPOTRAIN_CHECKPOINT_KEY``, issue 21 finding 9): manifests are
    # signed with it and unsigned or forged ones refused. A secret: kept out of repr (and so of logs).
    signing_key_hex: str | None = field(default=None, repr=False)

    @property
    def signing_key(self) -> bytes | None:
        return bytes.fromhex(self.signing_key_hex) if self.signing_key_hex else None

    def __post_init__(self) -> None:
        if self.signing_key_hex is not None:
            key = self.signing_key_hex
            if not isinstance(key, str) or len(key) < 32 or len(key) % 2 or any(c not in "0123456789abcdefABCDEF" for c in key):
                raise ValueError(f"{protocol.ENV_CHECKPOINT_KEY}: expected at least 32 hex digits (the key is not shown)")
        if not isinstance(self.uri, str) or "://" not in self.uri:
            raise ValueError(f"checkpoint.uri: expected file://, s3:// or gs:// URI, got {self.uri!r}")
        if not self.interval_s > 0:
            raise ValueError(f"checkpoint.interval_s: must be positive, got {self.interval_s!r}")
        if not isinstance(self.keep, int) or self.keep < 1:
            raise ValueError(f"checkpoint.keep: must be an integer >= 1, got {self.keep!r}")


@dataclass(frozen=True, kw_only=True)
class NoticeConfig:
    """Which notice sources to watch. The notice file and SIGTERM are always watched; metadata
    servers only when named, so that nothing ever contacts a link-local address by accident."""

    notice_file: str | None = None
    sources: tuple[str, ...] = ()
    aws_imds_endpoint: str = DEFAULT_AWS_IMDS_ENDPOINT
    gce_metadata_endpoint: str = DEFAULT_GCE_METADATA_ENDPOINT
    poll_interval_s: float = 1.0
    handle_sigterm: bool = True

    def __post_init__(self) -> None:
        for source in self.sources:
            _check_choice(ENV_NOTICE_SOURCES, source, _KNOWN_SOURCES)
        if not self.poll_interval_s > 0:
            raise ValueError(f"notices.poll_interval_s: must be positive, got {self.poll_interval_s!r}")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Everything :class:`runtime.ElasticTrainer` needs besides the model, optimizer and data.

    ``epochs`` or ``max_steps`` bounds training (``max_steps`` wins when both are given).
    ``num_threads`` pins intra-op threads; in bitwise mode it must not depend on the world size,
    because CPU kernels split reductions by thread. ``timeline_file`` receives rank 0's changeover
    timeline (``runtime/timeline.py``); by default it sits beside the progress file. The gradient
    noise statistics are measured on every ``noise_every_steps``-th step (two passes over the
    gradient, ~3% of a small model's step on CPU; a batch-size policy acts over minutes, not steps).
    ``batch_json`` is the controller's batch for this gang (``SPOTRAIN_BATCH_JSON``), followed with
    ``batch_policy: adaptive``. With ``adaptive``, ``epochs`` and ``max_steps`` count scale-invariant
    iterations (``runtime.adaptive``): iterations at the initial batch size.
    """

    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig
    notices: NoticeConfig = field(default_factory=NoticeConfig)
    epochs: int | None = None
    max_steps: int | None = None
    job_id: str = "local"
    attempt: int = 1
    progress_file: str | None = None
    timeline_file: str | None = None
    num_threads: int = 1
    max_grad_norm: float | None = None
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    progress_interval_s: float = 0.5
    log_every_steps: int = 0
    noise_every_steps: int = 8
    batch_json: str | None = None  # the controller's SPOTRAIN_BATCH_JSON directive for this gang
    rebatch_every_steps: int = 100  # adaptive without a directive: re-optimize this often (0: never)

    def __post_init__(self) -> None:
        if self.epochs is None and self.max_steps is None:
            raise ValueError("trainer: give epochs or max_steps")
        for name in ("epochs", "max_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"trainer.{name}: must be a positive integer, got {value!r}")
        if not isinstance(self.num_threads, int) or self.num_threads < 1:
            raise ValueError(f"trainer.num_threads: must be a positive integer, got {self.num_threads!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"trainer.max_grad_norm: must be positive, got {self.max_grad_norm!r}")
        _check_choice("trainer.backend", self.backend, ("auto", "gloo", "nccl"))
        if not isinstance(self.rebatch_every_steps, int) or self.rebatch_every_steps < 0:
            raise ValueError(f"trainer.rebatch_every_steps: must be an integer >= 0, got {self.rebatch_every_steps!r}")
        if not isinstance(self.noise_every_steps, int) or self.noise_every_steps < 1:
            raise ValueError(f"trainer.noise_every_steps: must be a positive integer, got {self.noise_every_steps!r}")

    @classmethod
    def from_env(
        cls,
        *,
        training: TrainingConfig | None = None,
        epochs: int | None = None,
        max_steps: int | None = None,
        default_checkpoint_dir: str = "spotrain_checkpoints",
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> "TrainerConfig":
        """Build from the worker-protocol environment; ``training`` gives the script's defaults,
        which the spec's ``SPOTRAIN_TRAINING_JSON`` overrides field by field."""
        env = os.environ if env is None else env
        job_id = env.get(protocol.ENV_JOB_ID, "local")
        training = training or TrainingConfig()
        if env.get(protocol.ENV_TRAINING_JSON):
            training = TrainingConfig.from_json(env[protocol.ENV_TRAINING_JSON], defaults=training)
        uri = env.get(protocol.ENV_CHECKPOINT_URI) or (
            "file://" + os.path.join(os.path.abspath(default_checkpoint_dir), job_id)
        )
        checkpoint = CheckpointConfig(
            uri=uri,
            interval_s=_env_float(env, protocol.ENV_CHECKPOINT_INTERVAL_S, 600.0),
            keep=int(_env_float(env, protocol.ENV_CHECKPOINT_KEEP, 3)),
            signing_key_hex=env.get(protocol.ENV_CHECKPOINT_KEY) or None,
        )
        sources = tuple(s.strip() for s in env.get(ENV_NOTICE_SOURCES, "").split(",") if s.strip())
        notices = NoticeConfig(
            notice_file=env.get(protocol.ENV_NOTICE_FILE) or None,
            sources=sources,
            aws_imds_endpoint=env.get(ENV_AWS_IMDS_ENDPOINT, DEFAULT_AWS_IMDS_ENDPOINT),
            gce_metadata_endpoint=env.get(ENV_GCE_METADATA_ENDPOINT, DEFAULT_GCE_METADATA_ENDPOINT),
            poll_interval_s=_env_float(env, ENV_NOTICE_POLL_S, 1.0),
        )
        progress_file = env.get(protocol.ENV_PROGRESS_FILE) or None
        timeline_file = env.get(ENV_TIMELINE_FILE) or (
            os.path.join(os.path.dirname(os.path.abspath(progress_file)), TIMELINE_NAME) if progress_file else None
        )
        return cls(
            training=training,
            checkpoint=checkpoint,
            notices=notices,
            epochs=epochs,
            max_steps=max_steps,
            job_id=job_id,
            attempt=int(_env_float(env, protocol.ENV_ATTEMPT, 1)),
            progress_file=progress_file,
            timeline_file=timeline_file,
            batch_json=env.get(protocol.ENV_BATCH_JSON) or None,
            num_threads=int(_env_float(env, ENV_NUM_THREADS, overrides.pop("num_threads", 1))),
            **overrides,
        )


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}: not a number: {raw!r}") from None
