"""Regroups ``autoscaler/``'s flat modules into packages by role (issue 22), and rewrites every reference.

Why a script and not a hand-made commit: the move touches most files of the repository, and other work
lands on those files at the same time. Run on whatever the tree is, the script gives the same result:

    python tools/regroup_autoscaler.py          # from the repository root, in a clean git tree

It (1) ``git mv``s each flat module of ``autoscaler/`` into its group package (``MOVES`` below) and writes
the group's ``__init__.py``; a flat module with no rule stops it before anything changes, so a new module
cannot be left behind silently; (2) rewrites every reference to the moved modules in the tracked text
files: dotted names (imports, ``"autoscaler.api:app"``, ``python -m``, monkeypatch targets,
``import_module`` strings, logger names), file paths (``autoscaler/api.py``), ``from autoscaler import x``
statements and, inside ``autoscaler/``, bare ``api.py`` mentions of a sibling and
relative imports (made absolute where they reach a moved module or sit in one, since a moved
file's depth changes); (3) leaves no compatibility module at the old paths; and
(4) runs ``ruff check --fix --select I`` to sort the imports it touched. Run again on the moved tree it finds
nothing flat to move and changes nothing.

``errors.py`` (the one exception tree, imported by most modules) and ``home.py`` (where every file of the
controller lives, used by the server, the client, the controller and the remote executor alike) stay at
the top on purpose: they belong to every group.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "autoscaler"

# Flat modules that stay at the top of ``autoscaler/`` on purpose (see the docstring).
KEEP = {"__init__", "errors", "home"}

# old flat module -> (group package, new module name)
MOVES: dict[str, tuple[str, str]] = {
    # server/: the controller's HTTP face for users: API, its models, dashboard, metrics.
    "api": ("server", "api"),
    "schemas": ("server", "schemas"),
    "dashboard": ("server", "dashboard"),
    "metrics": ("server", "metrics"),
    "listing": ("server", "listing"),
    "resume": ("server", "resume"),
    # client/: what the CLI uses to talk to a controller and show a job.
    "client": ("client", "http"),
    "logs": ("client", "logs"),
    "report": ("client", "report"),
    # jobs/: the job's domain: spec, states, scaling model, workdir, summary, output cap.
    "spec": ("jobs", "spec"),
    "domain": ("jobs", "domain"),
    "scaling": ("jobs", "scaling"),
    "workdir": ("jobs", "workdir"),
    "globmatch": ("jobs", "globmatch"),
    "summary": ("jobs", "summary"),
    "log_cap": ("jobs", "log_cap"),
    # fleet/: the clouds a controller runs on: building providers, several clouds, the market, billing.
    "clouds": ("fleet", "clouds"),
    "multicloud": ("fleet", "multicloud"),
    "market_watch": ("fleet", "market_watch"),
    "accounting": ("fleet", "accounting"),
    # remote/: the remote executor, whole: executor, agents' listener and endpoints, auth, TLS, wheel, shipper.
    "remote_executor": ("remote", "executor"),
    "agent_server": ("remote", "listener"),
    "api_agents": ("remote", "endpoints"),
    "agent_auth": ("remote", "auth"),
    "agent_wheel": ("remote", "wheel"),
    "tls": ("remote", "tls"),
    "workdir_shipper": ("remote", "shipper"),
}

GROUP_DOCS = {
    "server": "The controller's HTTP face: the user API and its models, the dashboard, metrics, job lists, resume.",
    "client": "The CLI's side of the API: the HTTP client, job logs and report pictures.",
    "jobs": "The job's domain: its spec, states and outcomes, scaling model, workdir archive, summary, output cap.",
    "fleet": "The clouds a controller runs on: building the provider, several clouds as one, the market, billing.",
    "remote": "The remote executor, whole: the executor, the agents' listener, endpoints, auth, TLS, wheel, workdir shipper.",
}

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".txt", ".sh", ".json", ""}
SKIP = {"tools/regroup_autoscaler.py"}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def flat_modules() -> list[str]:
    return sorted(p.stem for p in PKG.glob("*.py") if p.stem not in KEEP)


def new_name(old: str) -> str:
    group, mod = MOVES[old]
    return f"autoscaler.{group}.{mod}"


def move_files(flat: list[str]) -> None:
    for group in sorted({MOVES[m][0] for m in flat}):
        init = PKG / group / "__init__.py"
        if not init.exists():
            init.parent.mkdir(exist_ok=True)
            init.write_text(f'"""{GROUP_DOCS[group]}"""\n')
            git("add", str(init.relative_to(REPO)))
    for old in flat:
        group, mod = MOVES[old]
        git("mv", f"autoscaler/{old}.py", f"autoscaler/{group}/{mod}.py")


def rewrite_text(text: str, flat: list[str]) -> str:
    """Dotted names and file paths of moved modules, anywhere in a text file."""
    for old in flat:
        group, mod = MOVES[old]
        # ``autoscaler.api`` (not ``autoscaler.api_agents``, not ``x.autoscaler.api``).
        text = re.sub(rf"(?<![\w.])autoscaler\.{old}(?![\w])", f"autoscaler.{group}.{mod}", text)
        text = re.sub(rf"(?<![\w/])autoscaler/{old}\.py\b", f"autoscaler/{group}/{mod}.py", text)
    return text


def rewrite_bare_names(path: Path, text: str, flat: list[str]) -> str:
    """Inside ``autoscaler/``, a bare ``api.py`` in a docstring or comment names a flat module when the
    file sat beside it (or has no module of that name beside it): it becomes ``server/api.py``."""
    for old in flat:
        if path.parent != PKG and (path.parent / f"{old}.py").exists():
            continue
        group, mod = MOVES[old]
        text = re.sub(rf"(?<![\w/.-]){old}\.py\b", f"{group}/{mod}.py", text)
    return text


def _module_of(path: Path) -> list[str]:
    """The package a file's relative imports start from, as parts (its old location)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return parts[:-1]


def _alias(name: str, asname: str | None) -> str:
    return f"{name} as {asname}" if asname and asname != name else name


def _render(indent: str, module: str, names: list[tuple[str, str | None]]) -> str:
    return f"{indent}from {module} import {', '.join(_alias(n, a) for n, a in names)}"


def rewrite_imports(path: Path, text: str, flat: set[str]) -> str:
    """``from autoscaler import x`` and relative imports that reach a moved module, made absolute."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    in_pkg = path.relative_to(REPO).parts[0] == "autoscaler"
    moved_file = in_pkg and len(path.relative_to(REPO).parts) == 2 and path.stem in flat
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if not in_pkg:
                continue
            base = _module_of(path)
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        names = [(a.name, a.asname) for a in node.names]
        top = module.split(".")
        out: list[tuple[str, list[tuple[str, str | None]]]] = []
        if module == "autoscaler":
            keep = [(n, a) for n, a in names if n not in flat]
            if keep:
                out.append(("autoscaler", keep))
            for n, a in names:
                if n in flat:
                    group, mod = MOVES[n]
                    out.append((f"autoscaler.{group}", [(mod, a or n)]))
        elif node.level and len(top) >= 2 and top[0] == "autoscaler" and top[1] in flat:
            out.append((".".join([f"autoscaler.{MOVES[top[1]][0]}.{MOVES[top[1]][1]}", *top[2:]]), names))
        elif node.level and moved_file:
            out.append((module, names))
        else:
            continue
        if out == [(module, names)] and not (node.level and moved_file):
            continue
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        new = "\n".join(_render(indent, m, ns) for m, ns in out) + "\n"
        edits.append((node.lineno - 1, node.end_lineno or node.lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        tail = lines[end - 1]
        if not tail.rstrip("\n").rstrip().endswith((")",)) and ";" in tail:
            raise SystemExit(f"{path}:{start + 1}: an import shares its line; rewrite it by hand first")
        lines[start:end] = [new]
    return "".join(lines)


def tracked_text_files() -> list[Path]:
    out = []
    for rel in git("ls-files").splitlines():
        p = REPO / rel
        if rel in SKIP or not p.is_file() or p.suffix not in TEXT_SUFFIXES:
            continue
        out.append(p)
    return out


def main() -> int:
    flat = flat_modules()
    unknown = [m for m in flat if m not in MOVES]
    if unknown:
        print(
            "regroup_autoscaler: no rule for autoscaler/" + ", autoscaler/".join(f"{m}.py" for m in unknown)
            + ": add it to MOVES (or KEEP) in tools/regroup_autoscaler.py",
            file=sys.stderr,
        )
        return 2
    if not flat:
        print("regroup_autoscaler: nothing flat to move; the tree is already grouped")
        return 0
    if git("status", "--porcelain", "--untracked-files=no").strip():
        print("regroup_autoscaler: the git tree has uncommitted changes; commit or stash them first", file=sys.stderr)
        return 2
    taken = [f"autoscaler/{MOVES[m][0]}/{MOVES[m][1]}.py" for m in flat if (PKG / MOVES[m][0] / f"{MOVES[m][1]}.py").exists()]
    if taken:
        print(f"regroup_autoscaler: the new paths are taken already: {', '.join(taken)}", file=sys.stderr)
        return 2
    flat_set = set(flat)
    # Rewrite imports at the old paths first (relative imports resolve against where a file was).
    for path in tracked_text_files():
        text = path.read_text()
        new = rewrite_text(text, flat)
        if path.suffix == ".py":
            new = rewrite_imports(path, new, flat_set)
            if path.is_relative_to(PKG):
                new = rewrite_bare_names(path, new, flat)
        if new != text:
            path.write_text(new)
    move_files(flat)
    git("add", "-u")
    subprocess.run([sys.executable, "-m", "ruff", "check", "--fix", "--select", "I", "-q", "."], cwd=REPO, check=False)
    print(f"regroup_autoscaler: moved {len(flat)} modules:")
    for old in flat:
        print(f"  autoscaler/{old}.py -> autoscaler/{MOVES[old][0]}/{MOVES[old][1]}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
