"""Make ``import runtime`` find the library, not this test directory.

``tests/`` is on sys.path (rootdir-style imports), where ``tests/runtime`` would otherwise be taken
for a namespace package named ``runtime`` when pytest is started outside the repository root. A
regular package anywhere on sys.path wins over a namespace portion, so the repository root is added.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.append(_REPO)
if getattr(sys.modules.get("runtime"), "__file__", "") is None:
    del sys.modules["runtime"]
