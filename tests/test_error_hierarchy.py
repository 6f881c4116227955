"""One exception hierarchy per boundary (STYLE.md): every error type defined in our packages descends
from ``SpotrainError`` (controller and CLI), ``ProviderError`` (clouds) or ``RuntimeFailure`` (the
training runtime), and each errors module writes its tree out."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from autoscaler.errors import SpotrainError
from cloud_providers.errors import ProviderError
from runtime.errors import RuntimeFailure

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("autoscaler", "cloud_providers", "runtime", "cost_models")
ROOTS = (SpotrainError, ProviderError, RuntimeFailure)


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")]


def _error_types() -> list[type[BaseException]]:
    found = []
    for package in PACKAGES:
        for name in _modules(package):
            mod = importlib.import_module(name)
            for obj in vars(mod).values():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name:
                    found.append(obj)
    return found


def test_every_error_type_has_a_documented_root() -> None:
    errors = _error_types()
    assert len(errors) > 20, errors  # the walk found the packages' errors
    outside = [f"{e.__module__}.{e.__qualname__}" for e in errors if not issubclass(e, ROOTS)]
    assert not outside, f"error types outside SpotrainError / ProviderError / RuntimeFailure: {outside}"


def test_no_error_class_hides_inside_a_function() -> None:
    """The walk above sees module-level classes only; an exception class defined in a function
    would escape it, so there must be none."""
    bad = []
    for package in PACKAGES:
        for f in (REPO / package).rglob("*.py"):
            tree = ast.parse(f.read_text(), filename=str(f))
            for fn in ast.walk(tree):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in ast.walk(fn):
                        if isinstance(node, ast.ClassDef) and any(
                            isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception", "Failure"))) for b in node.bases
                        ):
                            bad.append(f"{f.relative_to(REPO)}: {node.name}")
    assert not bad, bad


@pytest.mark.parametrize("module", ["autoscaler.errors", "cloud_providers.errors", "runtime.errors"])
def test_each_errors_module_writes_its_tree_out(module: str) -> None:
    mod = importlib.import_module(module)
    doc = mod.__doc__ or ""
    root = next(r for r in ROOTS if r.__module__ == module)
    assert root.__name__ in doc
    for e in _error_types():
        if issubclass(e, root) and e is not root:
            assert e.__name__ in doc, f"{e.__module__}.{e.__name__} is missing from {module}'s tree"


def test_value_errors_stay_value_errors() -> None:
    """Callers catch ``ValueError`` for bad input files and messages; moving under a root kept it."""
    from autoscaler.simulator.omniscient import PlanTooLarge
    from autoscaler.simulator.workload import WorkloadError
    from cloud_providers.local.market import TraceError
    from cloud_providers.local.scenario import ScenarioError
    from cloud_providers.remote.wire import WireError

    for e in (PlanTooLarge, WorkloadError, TraceError, ScenarioError, WireError):
        assert issubclass(e, ValueError), e
