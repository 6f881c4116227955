"""State without pickle: tensors in safetensors files, everything else in JSON.

A state dict (model, optimizer, scheduler, statistics...) is split by :func:`flatten` into a JSON
*skeleton*, where each tensor is replaced by ``{"__tensor__": key}``, and a flat ``{key: tensor}``
map. Only plain JSON values, tuples, lists, dicts with scalar keys and tensors are representable;
anything else raises :class:`StateError` rather than being pickled (DESIGN.md: nothing is unpickled).

:func:`write_safetensors` streams the standard safetensors layout (8-byte header length, JSON
header, raw little-endian data) and hashes while it writes, so that persisting a checkpoint is one
pass over the bytes. Files load with ``safetensors.torch.load``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np
import torch

from .errors import StateError

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_CHUNK_BYTES = 32 << 20


def flatten(obj: Any, prefix: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """(skeleton, tensors) of ``obj``; tensor keys are ``prefix/path/to/leaf``."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            if path in tensors:
                raise StateError(f"state key collision at {path!r}")
            tensors[path] = value
            return {"__tensor__": path}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (np.integer, np.floating, np.bool_)):
            return value.item()
        if isinstance(value, tuple):
            return {"__tuple__": [walk(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return {"__list__": [walk(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                if not (k is None or isinstance(k, (bool, int, float, str))):
                    raise StateError(f"state at {path!r}: dict key {k!r} is not a JSON scalar")
                items.append([k, walk(v, f"{path}/{k}")])
            return {"__dict__": items}
        raise StateError(
            f"state at {path!r}: {type(value).__name__} cannot be checkpointed without pickle; "
            "keep tensors, numbers, strings, lists, tuples and dicts in state_dict()"
        )

    return walk(obj, prefix), tensors


def unflatten(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten`."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            try:
                return tensors[skeleton["__tensor__"]]
            except KeyError:
                raise StateError(f"checkpoint lacks tensor {skeleton['__tensor__']!r}") from None
        if "__tuple__" in skeleton:
            return tuple(unflatten(v, tensors) for v in skeleton["__tuple__"])
        if "__list__" in skeleton:
            return [unflatten(v, tensors) for v in skeleton["__list__"]]
        if "__dict__" in skeleton:
            return {k: unflatten(v, tensors) for k, v in skeleton["__dict__"]}
        raise StateError(f"malformed state skeleton: {sorted(skeleton)}")
    return skeleton


def _raw_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def write_safetensors(
    out: BinaryIO, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> tuple[int, str]:
    """Write ``tensors`` (CPU, contiguous) to ``out`` in safetensors format; (bytes, sha256 hex)."""
    header: dict[str, Any] = {}
    offset = 0
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        if t.dtype not in _DTYPES:
            raise StateError(f"tensor {name!r}: dtype {t.dtype} is not supported in checkpoints")
        if t.device.type != "cpu" or not t.is_contiguous():
            raise StateError(f"tensor {name!r}: snapshot must be a contiguous CPU tensor")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    digest = hashlib.sha256()
    total = 0
    # hashlib and file writes both release the GIL: hash each chunk on a helper thread while the
    # same chunk is written, so persisting costs max(hash, write) rather than their sum.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotrain-sha256") as hasher:

        def emit(chunk: bytes | memoryview) -> None:
            nonlocal total
            pending = hasher.submit(digest.update, chunk)
            out.write(chunk)
            pending.result()
            total += len(chunk)

        emit(struct.pack("<Q", len(head)) + head)
        for name in names:
            raw = _raw_bytes(tensors[name])
            for start in range(0, len(raw), _CHUNK_BYTES):
                emit(raw[start : start + _CHUNK_BYTES])
    return total, digest.hexdigest()


def read_safetensors(data: bytes) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors blob (no pickle involved)."""
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as exc:  # safetensors raises its own untyped errors on malformed input
        raise StateError(f"not a valid safetensors file ({exc})") from exc
