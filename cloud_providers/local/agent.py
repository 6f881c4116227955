"""The local instance agent: one detached process per (instance, attempt) that runs its ranks.

Started by ``LocalExecutor`` in a new session, so the workers outlive the controller (a controller
crash must not kill training) and the whole machine can be killed at once with ``killpg``. It runs the
job's ``setup`` once per instance, starts one ``bash -c <run>`` per local rank (the user's own command,
given as one argument, never spliced into another shell string), forwards SIGTERM to them (a notice
source of the runtime), and records each rank's exit code in a file as it happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    adir = Path(cfg["attempt_dir"])
    children: dict[int, subprocess.Popen[bytes]] = {}

    def forward(signum: int, _frame: object) -> None:
        for p in children.values():
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    signal.signal(signal.SIGTERM, forward)

    setup = cfg.get("setup")
    marker = Path(cfg["instance_dir"]) / "setup.done"
    if setup and not marker.exists():
        with open(Path(cfg["log_dir"]) / f"setup-{cfg['instance_id']}.log", "ab") as log:
            rc = subprocess.call(["bash", "-c", setup], cwd=cfg["cwd"], stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, **cfg["env"]})
        if rc != 0:
            for r in cfg["ranks"]:
                _write_atomic(adir / f"exit-{r}", str(_code(rc)))
            _write_atomic(adir / "done", "setup failed")
            return 0
        marker.write_text("ok")

    for r, local in zip(cfg["ranks"], range(len(cfg["ranks"]))):
        env = {
            **os.environ,
            **cfg["env"],
            "RANK": str(r),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(len(cfg["ranks"])),
            "WORLD_SIZE": str(cfg["world_size"]),
            "MASTER_ADDR": cfg["master_addr"],
            "MASTER_PORT": str(cfg["master_port"]),
        }
        log = open(Path(cfg["log_dir"]) / f"attempt-{cfg['attempt']}-rank-{r}.log", "ab")
        children[r] = subprocess.Popen(["bash", "-c", cfg["run"]], cwd=cfg["cwd"], env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
        log.close()

    pending = dict(children)
    while pending:
        for r, p in list(pending.items()):
            rc = p.poll()
            if rc is not None:
                _write_atomic(adir / f"exit-{r}", str(_code(rc)))
                del pending[r]
        time.sleep(0.05)
    _write_atomic(adir / "done", "ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
