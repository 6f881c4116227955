"""Schemathesis over the controller's HTTP API: every operation of its OpenAPI schema, with inputs that
fit the schema and inputs that break it, through the real app (``create_app``, its token guard and
error handlers) in this process over ASGI; no answer may be a server error (5xx).

The controller is a real one on the local cloud with three jobs (one pending, one cancelled, one
named like another's id) that is never ticked, so that nothing but the API acts. Each operation
taking a job is also driven with the real jobs' ids and name, not only with the random strings
that end in 404. Seeded (``derandomize``), so every run sends the same requests.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from schemathesis.python import asgi

from autoscaler.controller import Controller
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.server.api import create_app
from autoscaler.state import Store
from support import write_pw_spec

from .figures import ENV_API_EXAMPLES, env_int, record

pytestmark = pytest.mark.chaos

TOKEN = "reliability-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = env_int(ENV_API_EXAMPLES, 25)  # per operation, generation mode and job reference
SLOW_OPERATIONS = ("report.png",)  # a picture per answer: a few examples are enough


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture()
def controller(spotrain_home: Path, tmp_path: Path) -> Controller:
    setup = local_cloud("rel-api")
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                     controller_id="rel-api", tick_s=0.1, clock_rate=setup.clock_rate)
    return ctl


class Fuzzer:
    """Runs schemathesis's strategies for each operation through one ASGI client; tallies answers."""

    def __init__(self, client: Any, refs: list[str | None]) -> None:
        self.client, self.refs = client, refs
        self.statuses: Counter[int] = Counter()
        self.per_operation: dict[str, Counter[int]] = {}
        self.server_errors: list[str] = []
        self.no_invalid_inputs: set[str] = set()
        self.seconds: dict[str, float] = {}

    def send(self, case: Any, seen: Counter[int]) -> None:
        response = case.call(session=self.client, headers=AUTH)
        self.statuses[response.status_code] += 1
        seen[response.status_code] += 1
        if response.status_code >= 500:
            self.server_errors.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                      f"{response.text[:300]}")

    def operation(self, op: Any, **fixed: Any) -> None:
        seen = self.per_operation.setdefault(op.label, Counter())
        t0 = time.perf_counter()
        examples = 3 if op.path.endswith(SLOW_OPERATIONS) else EXAMPLES
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for ref in self.refs if "{ref}" in op.path else [None]:
                given_parts: dict[str, Any] = {"headers": dict(AUTH), **fixed}
                if ref is not None:
                    given_parts["path_parameters"] = {"ref": ref}

                @_settings(examples)
                @given(op.as_strategy(generation_mode=mode, **given_parts))
                def run(case: Any) -> None:
                    self.send(case, seen)

                try:
                    run()
                except Unsatisfiable:
                    # Nothing of the operation can break its schema (no parameters, no body, or only
                    # the fixed reference): there are no invalid inputs to send.
                    assert mode is GenerationMode.NEGATIVE, op.label
                    self.no_invalid_inputs.add(op.label)
        self.seconds[op.label] = round(self.seconds.get(op.label, 0.0) + time.perf_counter() - t0, 2)


def test_schemathesis_finds_no_server_error(controller: Controller, tmp_path: Path) -> None:
    spec, workdir = load_spec(write_pw_spec(tmp_path, name="pending"))
    pending = controller.submit(spec, workdir)["job_id"]
    spec, workdir = load_spec(write_pw_spec(tmp_path, name="ended"))
    ended = controller.submit(spec, workdir)["job_id"]
    controller.cancel(ended)
    fresh, _ = load_spec(write_pw_spec(tmp_path, name="fresh"))
    app = create_app(controller, TOKEN)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)
    operations = [r.ok() for r in schema.get_all_operations() if isinstance(r, Ok)]
    assert len(operations) >= 10, [op.label for op in operations]
    t0 = time.perf_counter()
    with asgi.get_client(app) as client:  # one client for every request (one each costs ~30 ms)
        fuzz = Fuzzer(client, [None, pending, ended, "pending"])  # None: schemathesis draws the reference
        for op in operations:
            fuzz.operation(op)
            if op.label == "POST /v1/jobs":  # and one submission that is a job, besides the refused ones
                fuzz.operation(op, body={"spec": fresh.to_dict(), "workdir": str(workdir)})
    elapsed = time.perf_counter() - t0
    statuses, requests = fuzz.statuses, sum(fuzz.statuses.values())
    assert not fuzz.server_errors, fuzz.server_errors[:5]
    # The fuzzing reached past the guard and the validation: answers other than 401/404/422 came
    # back, the submission with a real spec among them, and every operation answered.
    assert statuses[200] > 0 and fuzz.per_operation["POST /v1/jobs"][200] >= 1, fuzz.per_operation
    assert all(sum(c.values()) > 0 for c in fuzz.per_operation.values()), fuzz.per_operation
    record("api_fuzz", tried=f"{requests:,} requests from schemathesis over {len(operations)} API operations "
                             "(schema-valid and invalid inputs, real job ids), ASGI in-process",
           held=f"0 server errors (5xx); answers {', '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))}",
           requests=requests, operations=len(operations), server_errors=len(fuzz.server_errors),
           statuses={str(k): v for k, v in sorted(statuses.items())},
           per_operation={k: {str(s): n for s, n in sorted(v.items())} for k, v in fuzz.per_operation.items()},
           no_invalid_inputs=sorted(fuzz.no_invalid_inputs), seconds_per_operation=fuzz.seconds,
           examples_per_run=EXAMPLES, elapsed_s=round(elapsed, 2))
