"""Reading the files a user points the product at: bounded, regular files only, one-line errors.

Every YAML, JSON and CSV file the product reads on a user's say-so goes through here: job specs,
local-cloud scenarios, ``--policy-params``, market traces, simulator workloads and scaling profiles
(issue 21, findings 11 and 12). It lives in ``cloud_providers`` because the scenario and market-trace
readers are here and ``autoscaler`` may import this package (not the other way round).

What is refused, each with one :class:`FileRefused` line naming the file:

- anything but a regular file (a FIFO, ``/dev/zero``, a socket, a directory), found with ``fstat``
  on a descriptor opened ``O_NONBLOCK``, so that opening a FIFO never waits for a writer;
- more than the caller's byte limit (the file is read at most one byte past it);
- text that is not UTF-8;
- YAML beyond :class:`BoundedLoader`'s bounds: anchors and aliases (an alias bomb expands to gigabytes
  from a few hundred bytes), nesting deeper than ``MAX_DEPTH``, integers longer than
  ``MAX_INT_DIGITS`` digits (``int('9' * 4000)`` is slow and overflows every float conversion after it),
  duplicate keys (which YAML's own loader silently resolves to the last);
- JSON with the same bounds: duplicate keys, long integers, ``NaN``/``Infinity``, deep nesting.

The job spec (``autoscaler/jobs/spec.py``) builds its reader on :class:`BoundedLoader` too, so every YAML the
product reads has one set of bounds.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import FileRefused as FileRefused  # re-exported: its readers catch it from here

MAX_DEPTH = 32
MAX_INT_DIGITS = 20
# The default limit on a YAML/JSON document a user hands the product: specs, scenarios, parameters
# are a few kB.
MAX_DOCUMENT_BYTES = 1024 * 1024
_MAX_SHOWN = 200

# The ``context`` of the YAML errors BoundedLoader raises for valid YAML beyond its bounds (an alias,
# deep nesting, a huge integer, a duplicate key): they are not syntax errors.
REFUSED_CONTEXT = "document bounds"


def one_line(text: str) -> str:
    """``text`` on one line (newlines and other control characters escaped), at most 400 characters."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= 400 else out[:397] + "..."


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def read_regular_file(path: str | Path, *, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of ``path``, which must be a regular file (a link to one is fine) of at most
    ``max_bytes`` bytes. :class:`FileRefused` otherwise, e.g. ``market trace x.csv: is a FIFO, not a
    regular file``. Never blocks on a FIFO and never reads more than ``max_bytes + 1`` bytes."""
    name = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileRefused(one_line(f"{name}: no such file")) from None
    except OSError as exc:
        raise FileRefused(one_line(f"{name}: cannot open ({exc.strerror or exc.__class__.__name__})")) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(one_line(f"{name}: is {_kind(st.st_mode)}, not a regular file"))
        if st.st_size > max_bytes:
            raise FileRefused(one_line(f"{name}: {st.st_size} bytes, larger than the limit of {max_bytes} bytes"))
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:  # grew while read
            raise FileRefused(one_line(f"{name}: larger than the limit of {max_bytes} bytes"))
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(one_line(f"{name}: cannot read ({exc.strerror or exc.__class__.__name__})")) from None
    finally:
        os.close(fd)


def read_text_file(path: str | Path, *, max_bytes: int, what: str = "file") -> str:
    """:func:`read_regular_file`, decoded as UTF-8 (a leading byte-order mark is dropped)."""
    raw = read_regular_file(path, max_bytes=max_bytes, what=what)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileRefused(one_line(f"{what + ' ' if what else ''}{path}: not UTF-8 text (byte {exc.start})")) from None


# ----- YAML ----------------------------------------------------------------------------------------
def _refused(problem: str, mark: Any) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(context=REFUSED_CONTEXT, problem=problem, problem_mark=mark)


def show(value: Any) -> str:
    """A value for a message: its repr, at most ``_MAX_SHOWN`` characters."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the bounds of the module doc. Pure Python, so that the composer's hooks
    run (libyaml composes in C); the documents it reads are small enough for it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _refused("YAML anchors and aliases are not allowed", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise _refused(f"an integer of {digits} digits is too large (at most {MAX_INT_DIGITS})", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: the constructor refuses it in one line itself
            if first is not key_node:
                raise _refused(f"duplicate key {show(key)} (first at line {first.start_mark.line + 1})",
                               key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as ``problem at line L, column C``."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(problem)


def load_yaml_raw(text: str) -> Any:
    """``text`` read with :class:`BoundedLoader`; raises ``yaml.YAMLError`` (a refused bound has
    ``context == REFUSED_CONTEXT``)."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(text: str, *, source: str) -> Any:
    """``text`` read with :class:`BoundedLoader`; :class:`FileRefused` naming ``source`` otherwise."""
    try:
        return load_yaml_raw(text)
    except yaml.YAMLError as exc:
        refused = getattr(exc, "context", None) == REFUSED_CONTEXT
        raise FileRefused(one_line(f"{source}: {'' if refused else 'YAML syntax error: '}{yaml_problem(exc)}")) from None
    except RecursionError:
        raise FileRefused(one_line(f"{source}: nested too deep to parse")) from None


# ----- JSON ----------------------------------------------------------------------------------------
def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {show(key)}")
        out[key] = value
    return out


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits is too large (at most {MAX_INT_DIGITS})")
    return int(text)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number this file may hold")


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def parse_json(text: str, *, source: str) -> Any:
    """``text`` as JSON with the bounds of the module doc; :class:`FileRefused` naming ``source``."""
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_int=_int, parse_constant=_constant)
    except RecursionError:
        raise FileRefused(one_line(f"{source}: nested too deep to parse")) from None
    except ValueError as exc:
        raise FileRefused(one_line(f"{source}: not valid JSON ({(str(exc).splitlines() or [''])[0]})")) from None
    if _too_deep(value):
        raise FileRefused(one_line(f"{source}: nested deeper than {MAX_DEPTH} levels"))
    return value


def load_document(path: str | Path, *, what: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """A YAML (``.yaml``/``.yml``) or JSON (anything else) file, bounded; :class:`FileRefused` otherwise."""
    text = read_text_file(path, max_bytes=max_bytes, what=what)
    source = f"{what} {path}" if what else str(path)
    if Path(path).suffix.lower() in (".yaml", ".yml"):
        return parse_yaml(text, source=source)
    return parse_json(text, source=source)
