"""Architecture rules the product owner fixed, enforced: dependency directions and shared contracts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = {"autoscaler", "cloud_providers", "runtime", "cost_models"}
ALLOWED = {
    "autoscaler": {"autoscaler", "cost_models", "cloud_providers"},
    "runtime": {"runtime", "cost_models"},
    "cloud_providers": {"cloud_providers"},
    "cost_models": {"cost_models"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependencies_point_one_way(package: str) -> None:
    bad = []
    for f in (REPO / package).rglob("*.py"):
        for mod in imports_of(f) & OURS:
            if mod not in ALLOWED[package]:
                bad.append(f"{f.relative_to(REPO)} imports {mod}")
    assert not bad, bad


def test_controller_side_never_imports_torch() -> None:
    bad = []
    for package in ("autoscaler", "cloud_providers", "cost_models"):
        for f in (REPO / package).rglob("*.py"):
            if "torch" in imports_of(f):
                bad.append(str(f.relative_to(REPO)))
    assert not bad, bad


def test_worker_protocol_copies_agree() -> None:
    import cloud_providers.protocol as a
    import runtime.protocol as b

    names = {n for n in dir(a) if n.isupper()}
    assert names <= {n for n in dir(b) if n.isupper()}
    assert {n: getattr(a, n) for n in names} == {n: getattr(b, n) for n in names}


def test_cloud_sdks_are_imported_only_by_their_adaptor_modules() -> None:
    """The controller side reaches boto3/botocore only through ``cloud_providers/aws/_boto.py`` (an extra;
    it imports them lazily), and no controller-side module imports the runtime's packages."""
    adaptors = {"boto3": {"cloud_providers/aws/_boto.py"}, "botocore": {"cloud_providers/aws/_boto.py"}}
    runtime_only = {"torch", "safetensors", "sklearn"}
    bad = []
    for package in ("autoscaler", "cloud_providers", "cost_models"):
        for f in (REPO / package).rglob("*.py"):
            rel = str(f.relative_to(REPO))
            for mod in imports_of(f):
                if mod in runtime_only or (mod in adaptors and rel not in adaptors[mod]):
                    bad.append(f"{rel} imports {mod}")
    assert not bad, bad
