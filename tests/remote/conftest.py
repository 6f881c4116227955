"""Fixtures for the remote executor and instance agent tests: a fake controller channel, a fake clock
and a controller database with one job and three instances (i-1, i-2 running; i-3 terminated)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.state import InstanceRow, Job, Store
from remote_support import JOB, FakeChannel, FakeClock


@pytest.fixture
def channel() -> FakeChannel:
    return FakeChannel()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'spotrain.db'}")
    with store.session() as s:
        s.add(Job(job_id=JOB, name="job", controller_id="ctl", cloud="aws", spec_json=json.dumps({}),
                  workdir=str(tmp_path), checkpoint_uri="file:///tmp/x"))
        s.flush()
        for n, state in ((1, "running"), (2, "running"), (3, "terminated")):
            s.add(InstanceRow(instance_id=f"i-{n}", job_id=JOB, cloud="aws", offering_key="aws/z/g4dn.xlarge/T4:1",
                              market="spot", state=state, decision_id=f"d-{n}", launched_at_s=0.0))
    yield store
    store.engine.dispose()
