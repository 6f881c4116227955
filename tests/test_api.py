"""The HTTP API in process (FastAPI's TestClient, no server, no workers): response models, the error
handlers' statuses and bodies, the client's mapping back to the same exception types, and OpenAPI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoscaler.client.http import Client
from autoscaler.controller import Controller, job_summary
from autoscaler.errors import AuthError, JobNotFound
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url
from autoscaler.jobs.domain import JobNameTaken, NotOwner
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.server.api import create_app
from autoscaler.server.schemas import JobSummary
from autoscaler.state import Job, Store
from support import write_pw_spec

TOKEN = "t0ken"
CONTRACT = {"job_id", "name", "state", "preemptions", "cost_usd", "on_demand_cost_usd", "metric", "final_model",
            "deadline_met"}


def make_controller(cloud_id: str) -> Controller:
    setup = local_cloud(cloud_id)
    return Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                      controller_id=cloud_id, tick_s=0.1, clock_rate=setup.clock_rate)


@pytest.fixture()
def ctl(spotrain_home: Path) -> Controller:
    return make_controller("api-a")


@pytest.fixture()
def http(ctl: Controller) -> TestClient:
    return TestClient(create_app(ctl, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})


def submit_body(tmp_path: Path, extra: str = "") -> dict:
    spec, workdir = load_spec(write_pw_spec(tmp_path, extra=extra))
    return {"spec": spec.to_dict(), "workdir": str(workdir)}


def test_answers_are_the_models_and_errors_have_one_body(http: TestClient, tmp_path: Path) -> None:
    r = http.post("/v1/jobs", json=submit_body(tmp_path))
    assert r.status_code == 200, r.text
    job = r.json()
    assert CONTRACT <= set(job) and job["state"] == "PENDING" and job["deadline_met"] is None
    assert set(job) == set(JobSummary.model_fields)

    dup = http.post("/v1/jobs", json=submit_body(tmp_path))
    assert dup.status_code == 409 and dup.json() == {"error": "JobNameTaken", "detail": "a live job named 'pw' already exists"}
    missing = http.get("/v1/jobs/no-such-job")
    assert missing.status_code == 404 and missing.json() == {"error": "JobNotFound", "detail": "no job 'no-such-job'"}
    assert http.post("/v1/jobs/no-such-job/cancel").status_code == 404
    assert http.get("/v1/jobs/no-such-job/events").json()["error"] == "JobNotFound"
    noauth = http.get("/v1/jobs", headers={"Authorization": "Bearer wrong"})
    assert noauth.status_code == 401 and noauth.json()["error"] == "AuthError"
    bad_spec = http.post("/v1/jobs", json={"spec": {"name": "x"}, "workdir": str(tmp_path)})
    assert bad_spec.status_code == 422 and bad_spec.json()["error"] == "SpecError"
    bad_workdir = http.post("/v1/jobs", json={**submit_body(tmp_path), "workdir": "relative"})
    assert bad_workdir.status_code == 422 and "not an absolute directory" in bad_workdir.json()["detail"]
    unreadable = http.post("/v1/jobs", json={"workdir": str(tmp_path)})
    assert unreadable.status_code == 422 and unreadable.json()["error"] == "RequestValidationError"
    assert "spec" in unreadable.json()["detail"]

    listed = http.get("/v1/jobs").json()
    assert [j["job_id"] for j in listed] == [job["job_id"]]
    events = http.get(f"/v1/jobs/{job['job_id']}/events").json()
    assert events[0]["kind"] == "submitted" and set(events[0]) == {"ts", "kind", "from_state", "to_state", "reason"}
    assert http.get("/healthz").json()["controller_id"] == "api-a"


def test_the_client_raises_what_the_controller_raised(ctl: Controller, http: TestClient, tmp_path: Path) -> None:
    c = Client(http=http, token=TOKEN)
    body = submit_body(tmp_path)
    job = c.submit(body["spec"], body["workdir"])
    assert isinstance(job, JobSummary) and job.name == "pw"
    with pytest.raises(JobNameTaken, match="already exists"):
        c.submit(body["spec"], body["workdir"])
    with pytest.raises(JobNotFound, match="no job 'nope'"):
        c.job("nope")
    with pytest.raises(AuthError, match="refused the API token"):
        Client(http=TestClient(create_app(ctl, TOKEN)), token="wrong").jobs()
    assert [j.job_id for j in c.jobs()] == [job.job_id]
    assert c.events(job.job_id)[0].kind == "submitted"

    # Another controller's job: refused by the domain, as a NotOwner on this side too.
    other = Client(http=TestClient(create_app(make_controller("api-b"), TOKEN)), token=TOKEN)
    with pytest.raises(NotOwner, match="belongs to controller api-a"):
        other.cancel(job.job_id)
    done = c.cancel(job.job_id)
    assert done.state.value == "CANCELLED" and done.deadline_met is None  # no deadline
    with ctl.store.session() as s:
        row = ctl.store.job(s, job.job_id)
        assert row is not None and row.finished_clock_s is not None  # the provider clock at the end


def test_a_cancelled_job_with_a_deadline_missed_it(http: TestClient, tmp_path: Path) -> None:
    job = http.post("/v1/jobs", json=submit_body(tmp_path, extra="objective: {deadline: 2h}\n")).json()
    assert job["deadline_met"] is None  # not ended yet
    assert http.post(f"/v1/jobs/{job['job_id']}/cancel").json()["deadline_met"] is False


def _job(state: str, *, deadline: str | None, finished_clock_s: float | None) -> Job:
    spec = {"name": "j", "run": "true", "resources": {"accelerators": ["T4:1"]},
            "training": {"logical_workers": 1, "global_batch_size": 8}}
    if deadline:
        spec["objective"] = {"deadline": deadline}
    return Job(job_id="j-1", name="j", controller_id="c", cloud="local", spec_json=json.dumps(spec), workdir="/",
               checkpoint_uri="file:///x", state=state, reason="", submitted_at=1000.0, submitted_clock_s=500.0,
               finished_at=1100.0, finished_clock_s=finished_clock_s, attempt=1, preemptions=0, restarts_on_errors=0,
               cost_usd=0.0, on_demand_cost_usd=0.0, step=0, metric_name="")


@pytest.mark.parametrize(("state", "deadline", "finished_clock_s", "met"), [
    ("SUCCEEDED", "1h", 500.0 + 3600, True),     # on the deadline counts as met
    ("SUCCEEDED", "1h", 500.0 + 3601, False),
    ("SUCCEEDED", "1h", None, None),             # ended before the finish was recorded
    ("SUCCEEDED", None, 600.0, None),            # no deadline
    ("FAILED_BUDGET", "1h", 600.0, False),       # ended without the model
    ("RUNNING", "1h", None, None),               # not ended
])
def test_deadline_met_is_on_the_provider_clock(state: str, deadline: str | None, finished_clock_s: float | None,
                                               met: bool | None) -> None:
    assert job_summary(_job(state, deadline=deadline, finished_clock_s=finished_clock_s), []).deadline_met is met


def test_openapi_describes_the_answers_and_the_refusals(http: TestClient) -> None:
    doc = http.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert CONTRACT <= set(schemas["JobSummary"]["properties"])
    assert {"JobList", "JobEvent", "JobEvents", "Worker", "ErrorBody", "Health"} <= set(schemas)
    ops = doc["paths"]
    ok = ops["/v1/jobs/{ref}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/JobSummary")
    for path, method, status in [("/v1/jobs/{ref}", "get", "404"), ("/v1/jobs", "post", "409"), ("/v1/jobs", "post", "422"),
                                 ("/v1/jobs/{ref}/cancel", "post", "409"), ("/v1/jobs", "get", "401")]:
        ref = ops[path][method]["responses"][status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorBody"), (path, method, status)


def test_a_diverged_loss_is_null_in_json() -> None:
    job = _job("RUNNING", deadline=None, finished_clock_s=None)
    job.loss = float("nan")
    assert job_summary(job, []).to_json_dict()["loss"] is None
