"""Hypothesis over job specs: 10,000 inputs, none escapes as anything but a one-line ``SpecError``.

Three ways a spec arrives, each fed what hypothesis generates (seeded: ``derandomize``, no example
database, so every run tries the same inputs):

- a dict, as the API hands one to ``spec_from_dict``: every field of the spec, each drawn either from
  values near the valid ones (names, accelerators, durations, URIs, small numbers, the enums and
  their misspellings) or from arbitrary JSON-like junk (None, huge integers, NaN and infinities,
  control characters, nested lists and mappings), with unknown fields sprinkled in;
- YAML text, as ``spotrain run SPEC`` reads one: such a dict dumped, then cut or spliced with YAML's
  own punctuation, plus ``--set key.path=value`` overrides;
- raw text from YAML's alphabet (indentation, flow and block markers, anchors, tags, quotes).

Every input must give a ``JobSpec`` (which then round-trips through ``to_dict``, as the controller
stores it) or a ``SpecError`` whose message is one line starting ``spec error: ``; anything else
raised is an uncaught error and fails the test (hypothesis then shrinks it to a minimal input).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.errors import SpecError
from autoscaler.jobs.spec import JobSpec, parse_spec_text, spec_from_dict

from .figures import ENV_SPEC_CASES, env_int, record

pytestmark = pytest.mark.chaos

CASES = env_int(ENV_SPEC_CASES, 10_000)
# The three ways a spec arrives share the cases: dicts (the API) 40 %, YAML 40 %, raw text 20 %.
SHARES = {"dict": 0.4, "yaml": 0.4, "text": 0.2}
MAX_MESSAGE = 400  # autoscaler.jobs.spec's bound on a message


def _settings(cases: int) -> settings:
    return settings(max_examples=cases, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# ----- strategies ----------------------------------------------------------------------------------
# Drawn with sampled_from (one choice each, cheap) so that 10,000 cases take seconds: values every
# field may take (valid, then invalid), plus arbitrary junk of every JSON type.
def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


JUNK_VALUES: list[Any] = [None, True, False, 0, -1, 2**63, 2**64, -(2**80), 10**30, 0.5, -0.0, 1e308, float("nan"),
                          float("inf"), float("-inf"), "", " ", "\n", "\x00", "\x1b[31m", "é", "1e400", "NaN", "~",
                          "null", "x" * 500, [], [None], [[1, 2]], {}, {"a": 1}, {"": {"b": []}}, {1: 2},
                          _deep(40), {"\n": "x"}, b"bytes", ("t",)]
FIELDS: dict[str, tuple[list[Any], list[Any]]] = {
    "name": (["digits-cnn", "a", "a-b", "x" * 63, "9"], ["x" * 64, "-a", "a-", "A", "a_b", "a.b", "job\n"]),
    "workdir": ([".", "/tmp", "sub/dir"], []),
    "setup": ([None, "pip install -r requirements.txt"], ["x" * 70_000]),
    "run": (["python train.py", "bash -c 'exit 0'"], ["", "  ", "x" * 70_000]),
    "envs": ([{}, {"EPOCHS": 3}, {"A": True, "B": 1.5}], [{"SPOTRAIN_X": "1"}, {"RANK": 1}, {"1A": "x"}, {"A": [1]},
                                                          {"A": None}, {"A": "x" * 40_000}]),
    "resources.accelerators": ([["T4:1"], ["V100:1", "A10G:1"], ["a100:8"], [{"name": "T4", "count": 1}], ["H100"]],
                               [["T4:0"], ["T4:-1"], ["T4:x"], ["X1:1"], ["T4:1:1"], [":1"], "T4:1",
                                ["T4:99999999999999999999999"], [{"name": "T4"}], [{"count": 2}]]),
    "resources.instance_types": ([[], ["g4dn.xlarge"], ["p3.2xlarge", "n1-standard-8"]], [["m5.large"], [""]]),
    "resources.clouds": ([["aws"], ["aws", "gcp"], ["local"]], [[], ["azure"], ["AWS"], "aws"]),
    "resources.regions": ([[], ["us-east-1"], ["us-central1", "us-west-2"]], [[""]]),
    "resources.spot": (["auto", "always", "never"], ["sometimes", "Auto"]),
    "workers.min": ([1, 2], [0, -1, 2**63, 1.5, "2", 5]),
    "workers.max": ([2, 4], [0, 1, 3.0, 2**64, 16]),
    "training.logical_workers": ([4, 8], [0, 1, 2, -4, 2**70]),
    "training.global_batch_size": ([32, 64, 256], [7, 0, -32, 2**70]),
    "training.batch_policy": (["fixed", "adaptive"], ["Fixed"]),
    "training.lr_scaling": (["adascale", "sqrt", "linear", "none"], ["cubic"]),
    "training.max_batch_size": ([None, 4096], [16, 0]),
    "training.max_local_batch_size": ([None, 8], [0]),
    "training.determinism": (["bitwise", "fast"], ["exact"]),
    "training.seed": ([0, 7, -1, 2**63 - 1], [2**63, 2**64]),
    "objective.deadline": ([None, "36h", "10m", "90s", "1h30m", "2d", "1.5h"],
                           ["0s", "-1h", "h", "1x", "10", 10, 1e308, "9" * 30 + "h", "1e400s", "nan", "inf s",
                            "1h 30m", "1h1h"]),
    "objective.budget_usd": ([None, 50, 0.01, 1], [0, -1, 1e-300, 1e308, "50", "$50"]),
    "checkpoint.store": ([None, "file:///tmp/ckpt", "s3://bucket/prefix", "gs://bkt/p", "file:///tmp/ckpt/"],
                         ["s3://", "file://rel", "http://x", "file:///", "s3://b//p", "/tmp/ckpt", ""]),
    "checkpoint.interval": (["10m", "30s", "1h"], ["0s", "-10m", "10"]),
    "checkpoint.keep": ([1, 3], [0, -1]),
    "retries.max_restarts_on_errors": ([0, 2], [-1]),
    "simulate.work_gpu_hours": ([48, 0.5], [0, -1]),
    "simulate.scaling": (["linear", {"serial_fraction": 0.05}, {"profile": "p.csv"}],
                         ["quadratic", {"serial_fraction": 1.0}, {"serial_fraction": -0.1}, {"profile": 3}, {},
                          {"serial_fraction": 0.1, "profile": "p"}]),
}
REQUIRED = ("name", "run", "resources.accelerators")
UNKNOWN_KEYS = ["x", "Name", "run ", "workers.min", "\n", "", "0", "budget_usd", "deadline_s", "interval_s",
                "accelerator", "worker"]


_OMIT = object()  # the field is left out


def _choices(path: str, values: list[Any]) -> st.SearchStrategy[Any]:
    """One draw: a value, or (a required field rarely, another often) the field left out."""
    if path in REQUIRED:
        return st.sampled_from(values * 9 + [_OMIT])
    return st.sampled_from(values + [_OMIT] * max(1, len(values) // 2))


# Built once: a strategy per field and mode (building them per draw costs more than drawing).
_VALID = {p: _choices(p, v) for p, (v, _) in FIELDS.items()}
_SPOILED = {p: st.sampled_from(bad + JUNK_VALUES) for p, (_, bad) in FIELDS.items()}
_ANY = {p: _choices(p, v + bad + JUNK_VALUES) for p, (v, bad) in FIELDS.items()}
_MODES = st.integers(0, 2)
_FIELD_NAMES = st.sampled_from(sorted(FIELDS))
_EXTRA = st.tuples(st.integers(0, 9), st.sampled_from([None, "resources", "workers", "training", "objective", "checkpoint"]),
                   st.sampled_from(UNKNOWN_KEYS), st.sampled_from(JUNK_VALUES))
_SECTION_JUNK = st.tuples(st.integers(0, 19), st.sampled_from(["resources", "workers", "training", "objective", "simulate"]),
                          st.sampled_from(JUNK_VALUES))


@st.composite
def spec_dicts(draw: Callable[[st.SearchStrategy[Any]], Any]) -> Any:
    """A spec dict: in a third of the cases every field valid, in a third one field invalid or
    junk, otherwise any field may be; fields are left out at random (the required ones rarely),
    and now and then an unknown field or a whole section of junk is added."""
    mode = draw(_MODES)
    spoiled = draw(_FIELD_NAMES) if mode == 1 else None
    d: dict[str, Any] = {}
    for path in FIELDS:
        value = draw(_SPOILED[path] if path == spoiled else _VALID[path] if mode < 2 else _ANY[path])
        if value is _OMIT:
            continue
        node = d
        *parents, key = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[key] = value
    odds, where, key, junk = draw(_EXTRA)
    if odds == 0:
        node = d if where is None or not isinstance(d.get(where), dict) else d[where]
        node[key] = junk
    odds, section, junk = draw(_SECTION_JUNK)
    if odds == 0:
        d[section] = junk
    return d


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: dumping is not what is tested
YAML_PUNCTUATION = ["\n", ": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "!!python/object ", "!!binary ", "'",
                    '"', "#", "|", ">", "? ", "---\n", "...\n", "\t", "  ", "%YAML 1.1\n", "<<: ", "\\", "\x00", "\ufeff"]


_OVERRIDE_KEYS = ["name", "workers.min", "workers.max", "training.seed", "objective.budget_usd", "objective.deadline",
                  "resources.accelerators", "checkpoint.store", "a..b", "", "run.x", "envs.A", "simulate.scaling.serial_fraction"]
_OVERRIDE_VALUES = ["", "3", "-1", "[T4:1]", "{", "'", "1h", "nan", "9" * 30, "[[[[", "&a x", "null", "x: y", "2"]
_OVERRIDES = st.lists(st.one_of(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(_OVERRIDE_KEYS),
                                          st.sampled_from(_OVERRIDE_VALUES)), st.text(max_size=12)), max_size=3)
_STYLE = st.tuples(st.booleans(), st.sampled_from([None, True, False]))
_EDIT = st.tuples(st.floats(0, 1), st.integers(0, 2), st.sampled_from(YAML_PUNCTUATION), st.integers(1, 20))
_EDITS = st.lists(_EDIT, max_size=3)


@st.composite
def yaml_texts(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[str, list[str]]:
    """A spec dict as YAML (libyaml's dumper, a style drawn), then up to three edits (YAML
    punctuation spliced in, the text cut short, a piece removed), and ``--set`` overrides."""
    d = draw(spec_dicts())
    unicode, flow = draw(_STYLE)
    try:
        text = yaml.dump(d, Dumper=_DUMPER, allow_unicode=unicode, default_flow_style=flow)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        text = repr(d)
    for where, how, piece, length in draw(_EDITS):
        at = round(where * len(text))
        if how == 0:
            text = text[:at] + piece + text[at:]
        elif how == 1:
            text = text[:at]
        else:
            text = text[:at] + text[at + length:]
    return text, draw(_OVERRIDES)


TEXTS = st.text(alphabet=st.sampled_from(list("abnrsu019-_.:/ \n\t'\"#&*!|>[]{},?%@`~\\") + ["\x00", "é", "\ufeff"]),
                max_size=200)


# ----- the property --------------------------------------------------------------------------------
class Tally:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.longest_message = 0
        self.examples: list[str] = []

    def check(self, way: str, parse: Callable[[], JobSpec]) -> None:
        """Count one input; a SpecError must be one line, a spec must round-trip; anything else
        propagates (an uncaught error: the test fails)."""
        self.counts[f"{way}_tried"] += 1
        try:
            spec = parse()
        except SpecError as exc:
            message = str(exc)
            assert message.startswith("spec error: "), message[:500]
            assert "\n" not in message and "\r" not in message, message[:500]
            assert "Traceback" not in message and len(message) <= MAX_MESSAGE, message[:500]
            self.counts[f"{way}_refused"] += 1
            self.longest_message = max(self.longest_message, len(message))
            if len(self.examples) < 5 and way == "dict" and self.counts[f"{way}_refused"] % 997 == 1:
                self.examples.append(message)
            return
        assert isinstance(spec, JobSpec)
        stored = spec.to_dict()
        assert spec_from_dict(json.loads(json.dumps(stored))) == spec  # as the controller stores it
        self.counts[f"{way}_accepted"] += 1


def test_10000_spec_inputs_are_specs_or_one_line_errors() -> None:
    tally = Tally()
    cases = {way: max(1, round(CASES * share)) for way, share in SHARES.items()}
    cases["text"] = max(1, CASES - cases["dict"] - cases["yaml"])
    t0 = time.perf_counter()

    @_settings(cases["dict"])
    @given(spec_dicts())
    def from_dicts(d: Any) -> None:
        tally.check("dict", lambda: spec_from_dict(d))

    @_settings(cases["yaml"])
    @given(yaml_texts())
    def from_yaml(case: tuple[str, list[str]]) -> None:
        text, overrides = case
        tally.check("yaml", lambda: parse_spec_text(text, overrides=overrides))

    @_settings(cases["text"])
    @given(TEXTS)
    def from_text(text: str) -> None:
        tally.check("text", lambda: parse_spec_text(text))

    from_dicts()
    from_yaml()
    from_text()
    elapsed = time.perf_counter() - t0
    c = tally.counts
    tried = sum(c[f"{w}_tried"] for w in SHARES)
    accepted = sum(c[f"{w}_accepted"] for w in SHARES)
    refused = sum(c[f"{w}_refused"] for w in SHARES)
    # Every input was either; and both happened in each way that can produce a spec (a property that
    # only ever sees refusals would test the error path alone).
    assert accepted + refused == tried
    assert c["dict_accepted"] > 0 and c["dict_refused"] > 0 and c["yaml_accepted"] > 0 and c["yaml_refused"] > 0
    assert tried >= sum(cases.values()) * 0.9, (tried, cases)  # hypothesis ran (nearly) the cases asked for
    record("spec_fuzz", tried=f"{tried:,} generated specs (hypothesis, seeded): dicts, YAML with --set, raw text",
           held=f"0 uncaught; {refused:,} refused, each one line (longest {tally.longest_message} chars); "
                f"{accepted:,} accepted, each round-trips",
           cases_asked=sum(cases.values()), cases_tried=tried, accepted=accepted, refused=refused, uncaught=0,
           longest_message_chars=tally.longest_message, by_way=dict(c), elapsed_s=round(elapsed, 2),
           sample_messages=tally.examples)
