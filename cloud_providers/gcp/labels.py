"""Tags <-> GCP labels, faithfully both ways.

Compute Engine labels are what ``instances.list`` can filter on, so our tags (job, controller,
market, decision) travel as labels. Labels are stricter than tags: keys and values are at most 63
characters of ``[a-z0-9_-]`` (keys start with a lowercase letter), and a resource has at most 64.
The encoding:

* a character of ``[a-z0-9-]`` stands for itself; every other character is written as its UTF-8
  bytes, each ``_hh`` (two lowercase hex digits), so ``"Name"`` is ``"_4eame"`` and ``"_"`` is
  ``"_5f"``. Common values (decision UUIDs, job ids, ``spot``) stay readable and unchanged;
* an encoded key that does not start with a letter is prefixed ``k_g`` (``_g`` never occurs in an
  encoding, so the prefix cannot be confused with text);
* a value longer than 63 encoded characters continues in labels ``<key>_z1``, ``<key>_z2``, ...
  (``_z`` never occurs in an encoded key either).

Filters are built on the encoded labels (all of a value's parts), so ``list_instances(tags)`` asks the
API for exactly the instances whose tags include ``tags``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import InvalidRequest

MAX_LEN = 63
MAX_LABELS = 64
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_KEY_PREFIX = "k_g"
_PART = re.compile(r"^(?P<base>.+)_z(?P<n>[1-9][0-9]*)$")
_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def encode_text(text: str) -> str:
    out: list[str] = []
    for ch in text:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_text(text: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "_":
            raw.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(text[i].encode("ascii"))
            i += 1
    return raw.decode("utf-8")


def encode_key(key: str) -> str:
    encoded = encode_text(key)
    if not encoded or not ("a" <= encoded[0] <= "z"):
        encoded = _KEY_PREFIX + encoded
    return encoded


def decode_key(label: str) -> str:
    return decode_text(label[len(_KEY_PREFIX) :] if label.startswith(_KEY_PREFIX) else label)


def encode_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """Labels carrying ``tags`` (``InvalidRequest`` if they cannot)."""
    labels: dict[str, str] = {}
    for key, value in tags.items():
        lkey = encode_key(str(key))
        encoded = encode_text(str(value))
        parts = [encoded[i : i + MAX_LEN] for i in range(0, len(encoded), MAX_LEN)] or [""]
        last_key = lkey if len(parts) == 1 else f"{lkey}_z{len(parts) - 1}"
        if len(last_key) > MAX_LEN:
            raise InvalidRequest(f"tag key {key!r} is too long for a GCP label ({len(last_key)} > {MAX_LEN} "
                                 f"encoded)", cloud="gcp")
        labels[lkey] = parts[0]
        for n, part in enumerate(parts[1:], start=1):
            labels[f"{lkey}_z{n}"] = part
    if len(labels) > MAX_LABELS:
        raise InvalidRequest(f"tags need {len(labels)} GCP labels, more than the {MAX_LABELS} allowed", cloud="gcp")
    for k, v in labels.items():
        assert _LABEL.match(k) and _VALUE.match(v), (k, v)  # the encoding guarantees it
    return labels


def decode_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The tags ``encode_tags`` put in ``labels`` (labels set by others are decoded the same way)."""
    bases: dict[str, list[tuple[int, str]]] = {}
    for key, value in labels.items():
        match = _PART.match(key)
        if match and match.group("base") in labels:
            bases.setdefault(match.group("base"), []).append((int(match.group("n")), value))
        else:
            bases.setdefault(key, []).append((0, value))
    tags: dict[str, str] = {}
    for key, parts in bases.items():
        text = "".join(v for _, v in sorted(parts))
        try:
            tags[decode_key(key)] = decode_text(text)
        except (ValueError, IndexError):
            # Not one of ours (a label someone set by hand that merely looks escaped): keep it as is.
            tags[key] = text
    return tags


def label_filter(tags: Mapping[str, str]) -> str:
    """A Compute list filter matching instances whose labels carry all of ``tags``."""
    clauses = [f'(labels.{k} = "{v}")' for k, v in sorted(encode_tags(tags).items())]
    return " AND ".join(clauses)
