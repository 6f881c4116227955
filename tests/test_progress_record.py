"""The progress record (worker protocol): one typed contract, every field the runtime writes named in
it, and checked where an executor reads it (issue 22: "the progress record is an untyped dict end to end")."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import pytest

import cloud_providers.protocol as contract
from cloud_providers.local.executor import LocalExecutor
from cloud_providers.protocol import PROGRESS_FIELDS, ProgressError, parse_progress
from cost_models.batching import Layout

REPO = Path(__file__).resolve().parents[1]


def fields_the_runtime_writes() -> set[str]:
    """The keyword names of every ``progress.update(...)`` call in ``runtime/`` plus the batch plan's
    ``to_json`` keys (spliced in with ``**``)."""
    names: set[str] = set()
    for f in (REPO / "runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "progress"):
                names.update(k.arg for k in node.keywords if k.arg is not None and k.arg != "force")
    assert "step" in names and "lr_factor" in names, names  # the scan found the trainer's writes
    return names | set(Layout(batch_size=8, chunks=2, local_bsz=4, accum_steps=1).to_json())


def test_every_field_the_runtime_writes_is_in_the_documented_contract() -> None:
    written = fields_the_runtime_writes()
    doc = contract.__doc__ or ""
    undocumented = sorted(n for n in written if n not in doc)
    assert not undocumented, f"progress fields the runtime writes but the protocol docstring does not name: {undocumented}"
    assert written <= set(PROGRESS_FIELDS), sorted(written - set(PROGRESS_FIELDS))
    assert set(PROGRESS_FIELDS) == set(contract.ProgressRecord.__annotations__)
    assert all(n in doc for n in PROGRESS_FIELDS)


@pytest.mark.parametrize(("body", "field"), [
    ({"step": "3"}, "step"), ({"step": True}, "step"), ({"completed": 1}, "completed"),
    ({"loss": "nan"}, "loss"), ({"profile": [1, 2]}, "profile"), ({"final_model": 7}, "final_model"),
])
def test_a_field_of_the_wrong_kind_is_refused_by_name(body: dict, field: str) -> None:
    with pytest.raises(ProgressError, match=f"progress field {field}: expected"):
        parse_progress(body)


def test_a_good_record_passes_whole_with_nulls_ints_for_floats_and_unknown_fields() -> None:
    body = {"step": 3, "loss": 2, "grad_sqr": None, "profile": [{"nodes": 1}], "completed": True, "newer_field": "x"}
    assert parse_progress(body) == body
    with pytest.raises(ProgressError, match="expected an object"):
        parse_progress([1])


def test_local_executor_ignores_an_invalid_record_with_one_log_line(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    executor = LocalExecutor(tmp_path / "cloud")
    path = Path(executor.progress_file("j1"))
    path.write_text(json.dumps({"step": 5, "world_size": 2}))
    assert executor.read_progress(["j1"]) == {"j1": {"step": 5, "world_size": 2}}
    path.write_text(json.dumps({"step": 6, "world_size": "two"}))
    with caplog.at_level(logging.WARNING):
        assert executor.read_progress(["j1"]) == {"j1": None}
        assert executor.progress("j1") is None
    lines = [r.getMessage() for r in caplog.records if "progress file ignored" in r.getMessage()]
    assert lines == ["job j1: progress file ignored: progress field world_size: expected int, got 'two'"]


def test_the_runtime_refuses_to_write_a_field_outside_the_contract(tmp_path: Path) -> None:
    from runtime.progress import ProgressWriter

    writer = ProgressWriter(str(tmp_path / "progress.json"))
    writer.update(force=True, step=1, lr_factor=1.0, progress_iterations=1.0, last_checkpoint_unix_s=2.0)
    assert parse_progress(json.loads((tmp_path / "progress.json").read_text()))["lr_factor"] == 1.0
    with pytest.raises(ValueError, match="not in the worker protocol: stepz"):
        writer.update(force=True, stepz=2)
