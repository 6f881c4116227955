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


def _all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module: at import time, in function bodies (lazy) and under
    ``if TYPE_CHECKING:`` alike. A lazy import hides a cycle from the interpreter, not from a reader."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (anywhere in it). A relative import is resolved against
    the importing module's package; ``from pkg import name`` imports the module ``pkg.name`` when there
    is one and ``pkg`` (its ``__init__``) otherwise; ``import a.b`` imports ``a.b``."""
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in _all_imports(ast.parse(path.read_text(), filename=str(path))):
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
    # pkg.mod's imports under TYPE_CHECKING and in a function body count: a lazy cycle is a cycle.
    assert graph == {"pkg": {"pkg.sub", "pkg.mod", "pkg.sub.leaf"}, "pkg.mod": {"pkg.sub"}, "pkg.sub": {"pkg.mod"},
                     "pkg.sub.leaf": {"pkg.sub", "pkg"}}
    assert find_cycles(graph) == [["pkg", "pkg.sub.leaf", "pkg"], ["pkg.mod", "pkg.sub", "pkg.mod"]]


def _our_modules(packages: set[str]) -> dict[str, Path]:
    return {_module_name(f): f for package in sorted(packages) for f in sorted((REPO / package).rglob("*.py"))}


def test_no_import_cycles() -> None:
    """No cycle among our modules, the research code's included, lazy imports included (issue 22:
    ``controller/context`` <-> ``controller/goodput`` and ``cli/simulate`` <-> ``cli/tune`` were)."""
    cycles = find_cycles(import_graph(_our_modules(OURS | {"research"})))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# --- research code lives outside the product (issue 22) ------------------------------------------------------

RESEARCH = {"tracegen", "online_dp", "online_bound", "planner"}
# Modules run on their own rather than imported by the product: the CLI, its commands (imported by
# name, autoscaler/cli/main.py's COMMANDS), the agent a cloud VM runs, docs/spec.md's generator.
ENTRY_POINTS = {"autoscaler.cli.main", "cloud_providers.remote.agent", "autoscaler.cli.spec_doc"}


def test_research_code_is_outside_the_installed_packages() -> None:
    """The generator, the online bound, its program and the planner tried and not kept are in
    ``research/``, which ``pip install`` does not ship and no installed module imports."""
    import fnmatch
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not any(fnmatch.fnmatch("research", pattern) for pattern in include), include
    assert {p.stem for p in (REPO / "research").glob("*.py")} >= RESEARCH
    bad = [str(f.relative_to(REPO)) for package in sorted(OURS) for f in (REPO / package).rglob("*.py") if f.stem in RESEARCH]
    bad += [f"{f.relative_to(REPO)} imports research" for package in sorted(OURS) for f in (REPO / package).rglob("*.py")
            if "research" in imports_of(f)]
    assert not bad, bad


def test_every_installed_module_is_used_by_the_product() -> None:
    """Each module of the installed packages is reached from the product's entry points (or is a
    package's ``__init__``, the runtime's and the models' public faces): code only tests and
    benchmarks import is research and belongs in ``research/``."""
    from autoscaler.cli.main import COMMANDS

    modules = _our_modules(OURS)
    graph = import_graph(modules)
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    # Alembic loads the migration scripts by path from their package (autoscaler/state/migrate.py).
    migrations = {m for m in modules if m.startswith("autoscaler.state.migrations.")}
    roots = ENTRY_POINTS | {module for module, _ in COMMANDS.values()} | packages | migrations
    assert roots - set(modules) == set(), roots - set(modules)
    reached: set[str] = set()
    stack = sorted(roots)
    while stack:
        module = stack.pop()
        if module not in reached:
            reached.add(module)
            stack.extend(graph[module])
    assert sorted(set(modules) - reached) == []


# --- the controller's state is its own (issue 22) ------------------------------------------------------------

# Names that hold a Controller or its Context outside the controller package.
CONTROLLER_NAMES = {"ctl", "controller", "ctx"}


def _chain(node: ast.expr) -> list[str]:
    """``a.b.c`` -> ["a", "b", "c"] (a call or subscript in the chain ends it: ``f().x`` -> ["x"])."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def private_controller_access(tree: ast.AST) -> list[tuple[int, str]]:
    """Reads or writes of a private attribute (``_x``) of a Controller or its Context: through a name
    or attribute called ``ctl``/``controller``/``ctx``, and any ``._lock`` but ``self._lock``."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = _chain(node.value)
        if (owner and owner[-1] in CONTROLLER_NAMES) or (node.attr == "_lock" and owner != ["self"]):
            found.append((node.lineno, ".".join([*owner, node.attr])))
    return sorted(found)


def state_set_after_construction(tree: ast.AST) -> list[tuple[int, str]]:
    """Attribute assignments into a controller or its context (``x.controller.ctx.y = ...``, or
    through a name bound to one: ``ctx = self.controller.ctx; ctx.y = ...``) and calls of its
    market watch (``ctx.market.seed(...)``): configuring it after ``Controller(...)`` was built."""
    aliases = set(CONTROLLER_NAMES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _chain(node.value)[-1:] in (["ctx"], ["controller"]):
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = _chain(node.func.value)
            if len(owner) >= 2 and owner[-2] in aliases and owner[-1] == "market":
                found.append((node.lineno, ".".join([*owner, node.func.attr]) + "()"))
        for target in targets:
            if isinstance(target, ast.Attribute) and set(_chain(target.value)) & aliases:
                found.append((target.lineno, ".".join(_chain(target))))
    return sorted(found)


def test_the_access_checks_catch_the_old_code() -> None:
    """The two scans find what the CLI, ``resume.py`` and the simulator did before issue 22."""
    old = ast.parse("with ctl._lock, ctl.store.session() as s:\n    pass\n"
                    "with self.controller._lock:\n    pass\n"
                    "x = ctl.ctx._specs\n"
                    "with self._lock:\n    pass\n")
    assert private_controller_access(old) == [(1, "ctl._lock"), (3, "self.controller._lock"), (5, "ctl.ctx._specs")]
    world = ast.parse("ctx = self.controller.ctx\nctx.logs_dir = f\nctx.market.seed(w)\n"
                      "self.controller.ctx.tick_s = 2\nself.controller = Controller()\nn = self.controller.ctx.next_wake_s\n")
    assert state_set_after_construction(world) == [(2, "ctx.logs_dir"), (3, "ctx.market.seed()"),
                                                   (4, "self.controller.ctx.tick_s")]


def test_no_private_controller_access_outside_the_controller() -> None:
    """The CLI and ``resume`` use the controller's public operations (``exclusive``,
    ``observe_abandoned``), not its lock or its gang functions (issue 22)."""
    bad = [f"{f.relative_to(REPO)}:{line}: {what}" for package in sorted(OURS) for f in sorted((REPO / package).rglob("*.py"))
           if not f.is_relative_to(REPO / "autoscaler" / "controller")
           for line, what in private_controller_access(ast.parse(f.read_text(), filename=str(f)))]
    assert not bad, bad


def test_the_simulator_configures_the_controller_at_construction() -> None:
    """The simulator's hooks go to ``Controller(hooks=...)``; it sets nothing of the controller's after."""
    bad = [f"{f.relative_to(REPO)}:{line}: {what}" for f in sorted((REPO / "autoscaler" / "simulator").rglob("*.py"))
           for line, what in state_set_after_construction(ast.parse(f.read_text(), filename=str(f)))]
    assert not bad, bad


# --- autoscaler/ grouped by role (issue 22): the folder listing is the architecture diagram ---------------

# Each package of autoscaler/ and what it is; docs/architecture.md's map lists the same.
GROUPS = {
    "cli": "the spotrain command",
    "client": "the CLI's side of the API: HTTP client, logs, report pictures",
    "server": "the controller's HTTP face: API and its models, dashboard, metrics, job lists, resume",
    "controller": "the tick: gangs, launches, recovery, budget, views",
    "policy": "pure decisions over a JobView",
    "state": "the database",
    "jobs": "the job's domain: spec, states, scaling, workdir, summary, output cap",
    "fleet": "the clouds: provider building, multicloud, market watch, billing",
    "remote": "the remote executor, whole: executor, agents' listener and endpoints, auth, TLS, wheel, shipper",
    "simulator": "the controller on a virtual clock",
}
# Flat modules kept at the top on purpose: every group uses them.
TOP_MODULES = {"__init__.py", "errors.py", "home.py"}
# The core never reaches the edges: the controller, policy, state and the job's domain import nothing of
# the CLI, the client, the server or the remote executor (the one exception: the API's wire models, which
# a job's summary fills).
CORE = {"controller", "policy", "state", "jobs"}
EDGES = {"cli", "client", "server", "remote"}
CORE_MAY_USE = {"autoscaler.server.schemas"}


def _all_imported_modules(path: Path) -> set[str]:
    """Every module of ours a file names in an import, lazy ones included, relative ones resolved."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def test_autoscaler_is_grouped_by_role() -> None:
    entries = {p.name for p in (REPO / "autoscaler").iterdir() if p.name not in {"__pycache__", "py.typed"}}
    flat = {e for e in entries if e.endswith(".py")}
    assert flat == TOP_MODULES, f"flat modules beside the groups: {sorted(flat - TOP_MODULES)}; put each in a group"
    assert entries - flat == set(GROUPS), f"packages not in GROUPS: {sorted(entries - flat - set(GROUPS))}"
    for group in GROUPS:
        init = REPO / "autoscaler" / group / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(REPO)} says what the group is"


def test_core_never_imports_the_edges() -> None:
    bad = []
    for group in sorted(CORE):
        for f in sorted((REPO / "autoscaler" / group).rglob("*.py")):
            for mod in sorted(_all_imported_modules(f)):
                parts = mod.split(".")
                if parts[0] == "autoscaler" and len(parts) > 1 and parts[1] in EDGES and ".".join(parts[:3]) not in CORE_MAY_USE:
                    bad.append(f"{f.relative_to(REPO)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_architecture_doc_lists_every_group() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    missing = [g for g in GROUPS if f"autoscaler/{g}/" not in doc]
    assert not missing, f"docs/architecture.md's map lacks {missing}"
