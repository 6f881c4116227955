"""Architecture rules the product owner fixed, enforced: dependency directions and shared contracts."""

from __future__ import annotations

import ast
import typing
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
    # The progress record: the same fields, of the same types, on both sides.
    assert typing.get_type_hints(a.ProgressRecord) == typing.get_type_hints(b.ProgressRecord)
    assert set(a.ProgressRecord.__annotations__) == set(a.PROGRESS_FIELDS)


def test_cloud_sdks_are_imported_only_by_their_adaptor_modules() -> None:
    """The controller side reaches boto3/botocore only through ``cloud_providers/aws/_boto.py`` and the
    Google SDK (``google.*``) only through ``cloud_providers/gcp/_google.py`` (extras; they import them
    lazily), and no controller-side module imports the runtime's packages."""
    adaptors = {
        "boto3": {"cloud_providers/aws/_boto.py"},
        "botocore": {"cloud_providers/aws/_boto.py"},
        "google": {"cloud_providers/gcp/_google.py"},
    }
    runtime_only = {"torch", "safetensors", "sklearn"}
    bad = []
    for package in ("autoscaler", "cloud_providers", "cost_models"):
        for f in (REPO / package).rglob("*.py"):
            rel = str(f.relative_to(REPO))
            for mod in imports_of(f):
                if mod in runtime_only or (mod in adaptors and rel not in adaptors[mod]):
                    bad.append(f"{rel} imports {mod}")
    assert not bad, bad


# --- size limits (issue 10): no file over 600 lines, no function over 80 ---------------------------------

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """(qualified name, length in lines) of every function and method, nested ones included."""
    out: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            assert node.end_lineno is not None
            out.append((name, node.end_lineno - node.lineno + 1))
            out.extend(_functions(node, f"{name}."))
        elif isinstance(node, ast.ClassDef):
            out.extend(_functions(node, f"{prefix}{node.name}."))
        else:
            out.extend(_functions(node, prefix))
    return out


def test_no_file_or_function_is_too_long() -> None:
    bad = []
    for f in sorted((REPO / "autoscaler").rglob("*.py")):
        rel = f.relative_to(REPO)
        text = f.read_text()
        n_lines = len(text.splitlines())
        if n_lines > MAX_FILE_LINES:
            bad.append(f"{rel}: {n_lines} lines (at most {MAX_FILE_LINES})")
        for name, length in _functions(ast.parse(text, filename=str(f))):
            if length > MAX_FUNCTION_LINES:
                bad.append(f"{rel}::{name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    assert not bad, "\n".join(bad)


# --- no import cycle among our modules ----------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements a module runs when it is imported: top level and inside ``if``/``try``/
    ``with``/class bodies, but not in function bodies nor under ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                out.extend(_import_time_imports(node.body))
            out.extend(_import_time_imports(node.orelse))
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                out.extend(_import_time_imports(block))
        elif isinstance(node, (ast.With, ast.For, ast.While, ast.ClassDef)):
            out.extend(_import_time_imports(node.body))
            out.extend(_import_time_imports(getattr(node, "orelse", [])))
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports at import time. A relative import is resolved against
    the importing module's package; ``from pkg import name`` imports the module ``pkg.name`` when there
    is one and ``pkg`` (its ``__init__``) otherwise; ``import a.b`` imports ``a.b``."""
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in _import_time_imports(ast.parse(path.read_text(), filename=str(path)).body):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
                continue
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in modules:
                    deps.add(sub)
                elif target in modules:
                    deps.add(target)
        deps.discard(mod)
        graph[mod] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one node (Tarjan), as one cycle through it
    (first node repeated at the end), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    sccs: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
    return sorted(_cycle_in(graph, set(comp)) for comp in sccs)


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One cycle through the smallest node of a strongly connected component (breadth first: shortest)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for dep in sorted(graph[node] & comp):
                if dep == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if dep not in prev:
                    prev[dep] = node
                    nxt_frontier.append(dep)
        frontier = nxt_frontier
    raise AssertionError(f"not a cycle: {sorted(comp)}")


def test_cycle_finder_finds_cycles() -> None:
    graph = {
        "a": {"a.b"}, "a.b": {"a.c"}, "a.c": set(),  # a package importing its submodules: no cycle
        "p": {"p.x"}, "p.x": {"p.y"}, "p.y": {"p"},  # p.y imports its package, which imports p.x: a cycle
        "q": {"r"}, "r": {"q", "a"},
        "s": {"s"},  # a self-import is not a cycle
    }
    assert find_cycles(graph) == [["p", "p.x", "p.y", "p"], ["q", "r", "q"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_import_graph_resolves_relative_imports(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from . import sub\nfrom .mod import f\nfrom .sub import leaf\n",
        "pkg/mod.py": "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from .sub import late\ndef f():\n    from . import sub\n",
        "pkg/sub/__init__.py": "try:\n    from ..mod import f\nexcept ImportError:\n    pass\n",
        "pkg/sub/leaf.py": "import pkg.sub\nfrom .. import VALUE\nfrom pkg.sub import leaf\n",
    }
    modules = {}
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        modules[".".join(Path(rel).with_suffix("").parts).removesuffix(".__init__")] = p
    graph = import_graph(modules)
    assert graph == {"pkg": {"pkg.sub", "pkg.mod", "pkg.sub.leaf"}, "pkg.mod": set(), "pkg.sub": {"pkg.mod"},
                     "pkg.sub.leaf": {"pkg.sub", "pkg"}}
    assert find_cycles(graph) == [["pkg", "pkg.sub.leaf", "pkg"]]


def test_no_import_cycles() -> None:
    modules = {_module_name(f): f for package in sorted(OURS) for f in sorted((REPO / package).rglob("*.py"))}
    cycles = find_cycles(import_graph(modules))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
