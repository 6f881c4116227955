"""Hostile files handed to every loader of a user's file (issue 21, findings 11 and 12): each is refused
in one line naming the file, at once, with no traceback, hang or unbounded read.

Loaders: the job spec, a local-cloud scenario, ``--policy-params`` (YAML and JSON), a market trace, a
``simulate --workload`` CSV, a scaling profile (through the spec) and the remote agent's ``--config``. Files: a FIFO, a link to
``/dev/zero``, a directory, a 300 MB sparse file, an alias bomb, a 4,000-digit integer, duplicate
keys, 100,000-deep nesting, a 200 KB CSV field, bytes that are not UTF-8. Before the fix the FIFO and
the alias bomb hung (> 60 s), ``/dev/zero`` read until memory ran out, and the integer, the CSV field
and the duplicate keys gave tracebacks or were silently accepted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autoscaler.errors import SpecError
from autoscaler.jobs.scaling import spec_scaling
from autoscaler.jobs.spec import load_spec, spec_from_dict
from autoscaler.policy.params import load_params_file
from autoscaler.simulator.workload import read_workload
from cloud_providers.local.market import MarketTrace
from cloud_providers.local.scenario import load_scenario
from cloud_providers.remote.config import AgentConfig

from .figures import record

pytestmark = pytest.mark.chaos

LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


def _make(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "300-MB-sparse":
        with open(path, "wb") as f:
            f.truncate(300 * 1024 * 1024)
    elif kind == "alias-bomb":
        path.write_text(LAUGHS)
    elif kind == "4000-digit-int":
        path.write_text(f"x: {'9' * 4000}\n" if path.suffix == ".yaml" else f'{{"x": {"9" * 4000}}}')
    elif kind == "duplicate-keys":
        path.write_text("x: 1\nx: 2\n" if path.suffix == ".yaml" else '{"x": 1, "x": 2}')
    elif kind == "deep-nesting":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "200-KB-CSV-field":
        path.write_text('a,b\n"' + "z" * 200_000 + '",1\n')
    elif kind == "not-UTF-8":
        path.write_bytes(b"\xff\xfe\x00bad\x80\x81\n")
    else:
        raise AssertionError(kind)


def _profile(path: Path) -> Any:
    return spec_scaling(spec_from_dict({"name": "p", "run": "python t.py", "resources": {"accelerators": ["V100:1"]},
                                        "simulate": {"scaling": {"profile": str(path)}}}), path.parent)


LOADERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "spec": (".yaml", load_spec),
    "scenario": (".yaml", load_scenario),
    "policy-params-yaml": (".yaml", load_params_file),
    "policy-params-json": (".json", load_params_file),
    "market-trace": (".csv", MarketTrace.load),
    "workload": (".csv", read_workload),
    "scaling-profile": (".csv", _profile),
    "remote-agent-config": (".json", AgentConfig.load),
}
KINDS = ["fifo", "dev-zero", "directory", "300-MB-sparse", "alias-bomb", "4000-digit-int", "duplicate-keys",
         "deep-nesting", "200-KB-CSV-field", "not-UTF-8"]


@pytest.mark.timeout(120)
def test_hostile_files_for_every_loader_are_one_line_refusals(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    worst_s, worst, failures = 0.0, "", []
    for loader, (suffix, load) in LOADERS.items():
        for kind in KINDS:
            path = tmp_path / loader / f"{kind}{suffix}"
            path.parent.mkdir(exist_ok=True)
            _make(kind, path)
            started = time.perf_counter()
            try:
                load(path)
                failures.append(f"{loader}/{kind}: accepted")
            except (SpecError, ValueError) as exc:
                message = str(exc)
                if "\n" in message.strip() or str(path) not in message or len(message) > 1000:
                    failures.append(f"{loader}/{kind}: {message[:300]!r}")
            except Exception as exc:  # noqa: BLE001 - what the check looks for: anything but a one-line refusal
                failures.append(f"{loader}/{kind}: {type(exc).__name__}: {str(exc)[:200]}")
            took_s = time.perf_counter() - started
            if took_s > worst_s:
                worst_s, worst = took_s, f"{loader}/{kind}"
    cases = len(LOADERS) * len(KINDS)
    record("hostile_loaders",
           tried=f"{len(KINDS)} kinds of hostile file ({', '.join(KINDS)}) for each of {len(LOADERS)} loaders of a "
                 f"user's files ({', '.join(LOADERS)}): {cases} cases",
           held=f"{cases - len(failures)} of {cases} refused in one line naming the file; slowest {worst_s * 1000:.0f} ms "
                f"({worst}); no hang, traceback or unbounded read (before the fix: the FIFO and the alias bomb hung, "
                "/dev/zero ran out of memory)",
           cases=cases, refused=cases - len(failures), slowest_s=round(worst_s, 3), total_s=round(time.perf_counter() - t0, 3))
    assert not failures, failures
    assert worst_s < 3.0, (worst, worst_s)
