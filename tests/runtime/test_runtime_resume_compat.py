"""A checkpoint from other training settings (logical workers, seed, determinism) is not resumed
silently: refused in bitwise mode, warned about otherwise."""

from __future__ import annotations

import types

import pytest

from runtime.errors import StateError
from runtime.trainer import ElasticTrainer


def _trainer(determinism: str, logical_workers: int = 4, seed: int = 0) -> tuple[types.SimpleNamespace, list[str]]:
    said: list[str] = []
    stub = types.SimpleNamespace(training=types.SimpleNamespace(logical_workers=logical_workers, seed=seed,
                                                                determinism=determinism),
                                 _say=said.append)
    return stub, said


def test_bitwise_refuses_a_checkpoint_from_another_layout_or_seed() -> None:
    stub, _ = _trainer("bitwise")
    ElasticTrainer._check_compatible(stub, {"logical_workers": 4, "seed": 0, "determinism": "bitwise"}, 7)  # type: ignore[arg-type]
    ElasticTrainer._check_compatible(stub, {"logical_workers": 4}, 7)  # type: ignore[arg-type]  # older manifest: no seed
    with pytest.raises(StateError, match="logical_workers 8 -> 4"):
        ElasticTrainer._check_compatible(stub, {"logical_workers": 8, "seed": 0, "determinism": "bitwise"}, 7)  # type: ignore[arg-type]
    with pytest.raises(StateError, match="seed 1 -> 0"):
        ElasticTrainer._check_compatible(stub, {"logical_workers": 4, "seed": 1, "determinism": "bitwise"}, 7)  # type: ignore[arg-type]


def test_fast_mode_warns_and_resumes() -> None:
    stub, said = _trainer("fast")
    ElasticTrainer._check_compatible(stub, {"logical_workers": 2, "seed": 0, "determinism": "fast"}, 3)  # type: ignore[arg-type]
    assert said and "logical_workers 2 -> 4" in said[0]
