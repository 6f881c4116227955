"""Issue 21, finding 7: list views grew with history.

At 10,000 finished jobs ``GET /v1/jobs`` took 147 s (every job, one instances query per job), the
dashboard 160 s, ``/metrics`` 9.9 s and startup recovery ~57 s (it read every job, one instances
query each). The harness here: a real SQLite file holding N finished jobs of the controller (bulk
inserted through the store's models: two instances, two decisions, three events each,
``test_tick_cost.add_finished_jobs``) and a few live ones, the real app over HTTP (FastAPI's
TestClient) and the real ``Controller.recover`` on the local cloud. Each view's SQL statements and
the size of what it answers must not grow with the finished jobs; ``benchmarks/list_latency.py``
prints the latencies at 10,000.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, insert
from test_tick_cost import _spec, add_finished_jobs

from autoscaler.controller import Controller
from autoscaler.fleet.clouds import local_cloud
from autoscaler.policy import get_policy
from autoscaler.server.api import create_app
from autoscaler.state import Job, Store

TOKEN = "list-token"
LIVE = 3
CONTROLLER_ID = "sim"  # add_finished_jobs' controller


@dataclasses.dataclass
class ViewCost:
    statements: int
    ms: float
    answer_bytes: int


def controller_with_history(db: Path, finished: int) -> Controller:
    """A controller on the local cloud over the SQLite file ``db``: ``finished`` finished jobs and
    ``LIVE`` pending ones."""
    store = Store(f"sqlite:///{db}")
    add_finished_jobs(store, finished, CONTROLLER_ID)
    spec_json = _spec().model_dump_json()
    with store.session() as s:
        s.execute(insert(Job), [dict(job_id=f"live-{i}", name=f"live{i}", controller_id=CONTROLLER_ID, cloud="local",
                                     spec_json=spec_json, workdir="/", checkpoint_uri=f"file:///ckpt/live-{i}",
                                     state="PENDING", submitted_at=1e9 + i) for i in range(LIVE)])
    setup = local_cloud(CONTROLLER_ID)
    return Controller(store=store, provider=setup.provider, executor=setup.executor, policy=get_policy(),
                      controller_id=CONTROLLER_ID, tick_s=0.1, clock_rate=setup.clock_rate)


def views(ctl: Controller) -> dict[str, Any]:
    """Each view, as a call that returns what it answered (bytes, or recovery's counts)."""
    http = TestClient(create_app(ctl, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    cookie = {"cookie": f"spotrain_token={TOKEN}"}

    def get(path: str, **kw: Any) -> bytes:
        r = http.get(path, **kw)
        assert r.status_code == 200, (path, r.text[:300])
        return r.content

    return {
        "GET /v1/jobs": lambda: get("/v1/jobs"),
        "GET /v1/jobs?state=all&limit=10": lambda: get("/v1/jobs", params={"state": "all", "limit": 10}),
        "/ui": lambda: get("/ui", headers=cookie),
        "/metrics": lambda: get("/metrics"),
        "recovery": lambda: repr(ctl.recover()).encode(),
    }


def measure(ctl: Controller, repeat: int = 1) -> dict[str, ViewCost]:
    """Each view's SQL statements (of one call) and its best latency of ``repeat`` calls."""
    out = {}
    for name, call in views(ctl).items():
        call()  # warm: the app's first request builds its routes' models
        statements = 0

        def count(*_: Any) -> None:
            nonlocal statements
            statements += 1

        best = float("inf")
        answer = b""
        for i in range(repeat):
            if i == 0:
                event.listen(ctl.store.engine, "before_cursor_execute", count)
            t0 = time.perf_counter()
            answer = call()
            best = min(best, time.perf_counter() - t0)
            if i == 0:
                event.remove(ctl.store.engine, "before_cursor_execute", count)
        out[name] = ViewCost(statements, 1000.0 * best, len(answer))
    return out


def test_list_views_cost_the_same_with_more_finished_jobs(spotrain_home: Path, tmp_path: Path) -> None:
    small = measure(controller_with_history(tmp_path / "small.db", 60))
    large = measure(controller_with_history(tmp_path / "large.db", 400))
    for name in small:
        assert large[name].statements == small[name].statements, (name, small[name], large[name])
    for name in small:
        # The same answer, but for a live job's wall time, the totals and the dashboard's "N ended".
        assert abs(large[name].answer_bytes - small[name].answer_bytes) < 64, (name, small[name], large[name])


def test_lists_page_and_filter(spotrain_home: Path, tmp_path: Path) -> None:
    ctl = controller_with_history(tmp_path / "lists.db", 30)
    http = TestClient(create_app(ctl, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    live = http.get("/v1/jobs")
    assert [j["job_id"] for j in live.json()] == [f"live-{i}" for i in range(LIVE)]
    assert live.headers["x-total-count"] == str(LIVE) and "x-next-offset" not in live.headers
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        r = http.get("/v1/jobs", params={"state": "all", "limit": 7, "offset": offset})
        assert r.status_code == 200 and len(r.json()) <= 7 and r.headers["x-total-count"] == str(30 + LIVE)
        seen += [j["job_id"] for j in r.json()]
        offset = int(r.headers["x-next-offset"]) if "x-next-offset" in r.headers else None
    assert seen == [f"old-{i:06d}" for i in range(30)] + [f"live-{i}" for i in range(LIVE)]
    newest = http.get("/v1/jobs", params={"state": "SUCCEEDED", "limit": 2, "order": "newest"}).json()
    assert [j["job_id"] for j in newest] == ["old-000029", "old-000028"]
    assert newest[0]["workers"] == [] and newest[0]["spot_seconds"] == 3600.0  # its instances, batched
    bad = http.get("/v1/jobs", params={"state": "DONE"})
    assert bad.status_code == 422 and "state: 'DONE'" in bad.json()["detail"]
    assert http.get("/v1/jobs", params={"limit": 0}).status_code == 422
    ops = http.get("/openapi.json").json()["paths"]["/v1/jobs"]["get"]
    assert {p["name"] for p in ops["parameters"]} == {"state", "limit", "offset", "order"}
    assert {"x-total-count", "x-next-offset"} <= set(ops["responses"]["200"]["headers"])
    assert ops["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/JobList")
