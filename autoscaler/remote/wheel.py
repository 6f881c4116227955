"""The controller's own spotrain as a wheel, for its agents to install (issue 21, finding 14).

With ``--executor remote`` and the default install source (``served``, ``cloud_providers/agent_boot.py``)
the instances install exactly the spotrain the controller runs, never a package found by name on a
public index: the controller makes a wheel of the code it has imported (the four packages, their
typing markers and bundled data, and the installed distribution's metadata and entry points), keeps
it in the fleet's directory (``agent-wheel/``, mode 0600, written atomically), serves it on the
agents' HTTPS listener and puts its file name and sha256 in every agent config. The instance's boot
refuses a file with another hash.

The wheel is reproducible: files in sorted order with a fixed timestamp and mode, so the same code
gives the same sha256 on every controller of a fleet (a standby that took over serves the file that
instances its leader launched are still fetching). It is made in memory (about 0.6 MB, 0.4 s) without
a build backend, so it needs no network and no build tools on the controller, and served from memory,
so a later change to the copy on disk cannot reach an instance (its boot would refuse it anyway).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import io
import os
import zipfile
from pathlib import Path

from autoscaler.errors import SpotrainError
from autoscaler.home import fleet_dir, private_dir
from cloud_providers.agent_boot import installed_version

PACKAGES = ("autoscaler", "cloud_providers", "cost_models", "runtime")
WHEEL_DIR = "agent-wheel"
_EPOCH = (1980, 1, 1, 0, 0, 0)
_WHEEL_META = "Wheel-Version: 1.0\nGenerator: spotrain-agent-wheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


@dataclasses.dataclass(frozen=True)
class AgentWheel:
    """The wheel as made (``data``, what the listener serves) and where a copy is kept for operators."""

    path: Path
    name: str
    sha256: str
    data: bytes = dataclasses.field(repr=False, default=b"")


def _shipped(rel: Path) -> bool:
    """What setuptools puts in the wheel (pyproject's packages and package-data)."""
    return rel.suffix in (".py", ".pyi") or rel.name == "py.typed" or "data" in rel.parts[:-1]


def _package_files() -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise SpotrainError(f"cannot make the agents' wheel: package {package} is not importable here")
        root = Path(list(spec.submodule_search_locations)[0])
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for filename in sorted(filenames):
                path = Path(dirpath) / filename
                rel = path.relative_to(root)
                if _shipped(rel) and path.is_file() and not path.is_symlink():
                    files.append((f"{package}/{rel.as_posix()}", path))
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel_bytes(version: str | None = None) -> tuple[str, bytes]:
    """(file name, bytes) of the wheel of the code this process runs (see the module doc)."""
    version = version or installed_version()
    dist = importlib.metadata.distribution("spotrain")
    info = f"spotrain-{version}.dist-info"
    entries: list[tuple[str, bytes]] = [(name, path.read_bytes()) for name, path in _package_files()]
    metadata = dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: spotrain\nVersion: {version}\n"
    entries += [(f"{info}/METADATA", metadata.encode()), (f"{info}/WHEEL", _WHEEL_META.encode()),
                (f"{info}/top_level.txt", "".join(p + "\n" for p in PACKAGES).encode())]
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    record = "".join(_record_line(n, d) + "\n" for n, d in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, date_time=_EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return f"spotrain-{version}-py3-none-any.whl", buf.getvalue()


def ensure_agent_wheel(root: Path | None = None) -> AgentWheel:
    """This controller's wheel in the fleet's directory, (re)written if absent or different."""
    name, data = wheel_bytes()
    directory = private_dir((root or fleet_dir()) / WHEEL_DIR)
    path = directory / name
    sha = hashlib.sha256(data).hexdigest()
    try:
        same = hashlib.sha256(path.read_bytes()).hexdigest() == sha
    except OSError:
        same = False
    if not same:
        tmp = directory / f".{name}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return AgentWheel(path, name, sha, data)


__all__ = ["AgentWheel", "ensure_agent_wheel", "wheel_bytes"]
