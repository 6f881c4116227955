"""State without pickle: tensors in safetensors files, everything else in JSON.

A state dict (model, optimizer, scheduler, statistics...) is split by :func:`flatten` into a JSON
*skeleton*, where each tensor is replaced by ``{"__tensor__": key}``, and a flat ``{key: tensor}``
map. Only plain JSON values, tuples, lists, dicts with scalar keys and tensors are representable;
anything else raises :class:`StateError` rather than being pickled (DESIGN.md: nothing is unpickled).

Checkpoints use the standard safetensors layout (8-byte header length, JSON header, raw
little-endian data; files load with ``safetensors.torch.load``), planned once per state shape by
:func:`plan_layout`: tensors are ordered by element size, largest first, so that every tensor's
offset is aligned for its dtype, and split at tensor boundaries into up to ``MAX_SHARDS`` files of
similar size. Each file's data is then one contiguous range of a single snapshot buffer, written
with large sequential writes, and the files are written and hashed in parallel: sha256 runs at
about 1 GB/s on one core, as fast as a local disk, so one hash stream alone would halve the
persist bandwidth. :func:`parse_safetensors` reads a file back as views into one buffer (no copy).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

import numpy as np
import torch

from .errors import StateError

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_FROM_TAG = {tag: dtype for dtype, tag in _DTYPES.items()}
_CHUNK_BYTES = 64 << 20
MAX_SHARDS = 4
MIN_SHARD_BYTES = 64 << 20
STATE_FILE = "state.safetensors"


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



@dataclass(frozen=True)
class Shard:
    """One checkpoint file: its header and its data range ``[base, base + nbytes)`` in the buffer."""

    file: str
    names: tuple[str, ...]
    header: bytes  # 8-byte length + JSON header, padded to a multiple of 8
    base: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """Where every tensor of a state lives in the snapshot buffer, and which file holds it."""

    key: tuple[tuple[str, str, tuple[int, ...]], ...]
    shards: tuple[Shard, ...]
    offsets: dict[str, int]  # byte offset of each tensor in the buffer
    total_bytes: int


def layout_key(tensors: dict[str, torch.Tensor]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    return tuple((n, str(t.dtype), tuple(t.shape)) for n, t in sorted(tensors.items()))


def plan_layout(tensors: dict[str, torch.Tensor], *, metadata: dict[str, str] | None = None,
                max_shards: int | None = None, min_shard_bytes: int | None = None) -> Layout:
    """Files and buffer offsets for ``tensors`` (see the module docstring)."""
    max_shards = MAX_SHARDS if max_shards is None else max_shards
    min_shard_bytes = MIN_SHARD_BYTES if min_shard_bytes is None else min_shard_bytes
    sizes: dict[str, int] = {}
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise StateError(f"tensor {name!r}: dtype {t.dtype} is not supported in checkpoints")
        sizes[name] = t.numel() * t.element_size()
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    total = sum(sizes.values())
    target = max(min_shard_bytes, math.ceil(total / max(1, max_shards)))
    buckets: dict[int, list[str]] = {}
    done = 0
    for name in order:  # a tensor goes to the shard where its middle byte falls
        index = min(max(1, max_shards) - 1, int((done + sizes[name] / 2) // target))
        buckets.setdefault(index, []).append(name)
        done += sizes[name]
    groups = [buckets[i] for i in sorted(buckets)] or [[]]
    shards, offsets, base = [], {}, 0
    for i, names in enumerate(groups):
        header: dict[str, Any] = {}
        offset = 0
        for name in names:
            t = tensors[name]
            header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                            "data_offsets": [offset, offset + sizes[name]]}
            offsets[name] = base + offset
            offset += sizes[name]
        if metadata:
            header["__metadata__"] = metadata
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        file = STATE_FILE if len(groups) == 1 else f"state-{i:05d}-of-{len(groups):05d}.safetensors"
        shards.append(Shard(file=file, names=tuple(names), header=struct.pack("<Q", len(head)) + head,
                            base=base, nbytes=offset))
        base += offset + (-offset % 8)  # keep every shard's data 8-byte aligned in the buffer
    return Layout(key=layout_key(tensors), shards=tuple(shards), offsets=offsets, total_bytes=base)


def buffer_views(layout: Layout, buffer: torch.Tensor, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Typed views of ``buffer`` (flat uint8) where each tensor of ``layout`` lives."""
    views = {}
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        start = layout.offsets[name]
        views[name] = buffer[start : start + n].view(t.dtype).view(t.shape)
    return views


def _bytes_of(buffer: torch.Tensor, start: int, nbytes: int) -> memoryview:
    if nbytes == 0:
        return memoryview(b"")
    return buffer[start : start + nbytes].numpy().data


def write_shard(out: BinaryIO, shard: Shard, buffer: torch.Tensor) -> tuple[int, str]:
    """Write ``shard`` (header, then its range of ``buffer``) to ``out``; (bytes, sha256 hex).

    hashlib and file writes both release the GIL: a helper thread hashes each chunk while the same
    chunk is written, so a file costs max(hash, write) rather than their sum."""
    digest = hashlib.sha256()
    total = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotrain-sha256") as hasher:

        def emit(chunk: bytes | memoryview) -> None:
            nonlocal total
            pending = hasher.submit(digest.update, chunk)
            view = memoryview(chunk)
            while view:
                written = out.write(view)
                view = view[written if written is not None else len(view):]
            pending.result()
            total += len(chunk)

        emit(shard.header)
        data = _bytes_of(buffer, shard.base, shard.nbytes)
        for start in range(0, len(data), _CHUNK_BYTES):
            emit(data[start : start + _CHUNK_BYTES])
    return total, digest.hexdigest()


def write_safetensors(
    out: BinaryIO, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> tuple[int, str]:
    """Write ``tensors`` to ``out`` as one safetensors file; (bytes, sha256 hex)."""
    for name, t in tensors.items():
        if t.dtype in _DTYPES and t.device.type != "cpu":
            raise StateError(f"tensor {name!r}: expected a CPU tensor")
    layout = plan_layout(tensors, metadata=metadata, max_shards=1)
    buffer = torch.empty(layout.total_bytes, dtype=torch.uint8)
    for name, view in buffer_views(layout, buffer, tensors).items():
        view.copy_(tensors[name])
    return write_shard(out, layout.shards[0], buffer)


def read_into(read: Callable[[memoryview], int | None], nbytes: int) -> tuple[torch.Tensor, str]:
    """Read ``nbytes`` with ``read`` (a ``readinto``) into a new uint8 buffer, hashing each chunk on a
    helper thread while the next one is read; (buffer, sha256 hex). Short input raises EOFError."""
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    view = buffer.numpy().data if nbytes else memoryview(bytearray())
    digest = hashlib.sha256()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotrain-sha256") as hasher:
        pending = None
        for start in range(0, nbytes, _CHUNK_BYTES):
            chunk = view[start : start + _CHUNK_BYTES]
            got = 0
            while got < len(chunk):
                n = read(chunk[got:])
                if not n:
                    raise EOFError(f"file ended after {start + got} of {nbytes} bytes")
                got += n
            if pending is not None:
                pending.result()
            pending = hasher.submit(digest.update, chunk)
        if pending is not None:
            pending.result()
    return buffer, digest.hexdigest()


def parse_safetensors(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file held in ``buffer`` (flat uint8), as views into it where the
    offset is aligned for the dtype (copies otherwise). Malformed input raises StateError."""
    size = buffer.numel()
    if size < 8:
        raise StateError("not a valid safetensors file (shorter than its header length)")
    (head_len,) = struct.unpack("<Q", bytes(buffer[:8].numpy()))
    if head_len > size - 8:
        raise StateError(f"not a valid safetensors file (header of {head_len} bytes in a {size}-byte file)")
    try:
        header = json.loads(bytes(buffer[8 : 8 + head_len].numpy()))
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"not a valid safetensors file (header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise StateError("not a valid safetensors file (header is not an object)")
    data_start = 8 + head_len
    data_len = size - data_start
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _FROM_TAG[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise StateError(f"not a valid safetensors file (bad entry for {name!r})") from None
        elsize = torch.empty(0, dtype=dtype).element_size()
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_len or end - begin != math.prod(shape) * elsize:
            raise StateError(f"not a valid safetensors file (entry {name!r} does not fit the data)")
        raw = buffer[data_start + begin : data_start + end]
        if (data_start + begin) % elsize:
            raw = raw.clone()
        out[name] = raw.view(dtype).view(shape)
    return out


def read_safetensors(data: bytes) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors blob (no pickle involved)."""
    return parse_safetensors(torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8))
