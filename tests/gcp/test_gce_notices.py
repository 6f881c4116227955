"""GCE preemption notices on the instance: the agent's metadata client long-polls ``instance/preempted``
(``wait_for_change`` with ``last_etag``) on the loopback metadata fake, and the agent relays the notice
to its workers and to the controller, as it relays IMDS on AWS."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from remote.remote_support import FakeChannel, agent_config, drive, rank_assignment

from cloud_providers.remote.agent import Agent, CloudNoticeWatcher
from cloud_providers.remote.config import NOTICE_SOURCE_AWS, NOTICE_SOURCE_GCE
from cloud_providers.remote.metadata import GCE_NOTICE_S, AwsImds, GceMetadata, MetadataError, sources_for
from cloud_providers.remote.wire import STATE_EXITED, STATE_RUNNING
from fakes.imds import FakeMetadataServer

from .fake_metadata import FakeGceMetadata

pytestmark = pytest.mark.gcp

WAIT_FOR_NOTICE = ('while [ ! -e "$SPOTRAIN_NOTICE_FILE" ]; do sleep 0.02; done; '
                   'echo \'{"step": 5, "total_steps": 10}\' > "$SPOTRAIN_PROGRESS_FILE"; exit 85')


def test_the_notice_arrives_through_the_long_poll_as_soon_as_it_is_given() -> None:
    with FakeGceMetadata() as fake:
        gce = GceMetadata(fake.endpoint, wait_s=10)
        assert gce.check() is None  # a plain read: the value and its ETag
        assert fake.requests[-1] == ("/computeMetadata/v1/instance/preempted", "")
        found: list[dict | None] = []
        waiting = threading.Thread(target=lambda: found.append(gce.check()))
        waiting.start()
        fake.wait_for_waiters(1)
        flipped = time.time()
        fake.preempt()
        waiting.join(timeout=5)
        seen = time.time()
        assert found and found[0] is not None and seen - flipped < 1.0  # not at the 10 s timeout
        notice = found[0]
        assert notice["reason"] == "preemption" and notice["source"] == NOTICE_SOURCE_GCE
        assert abs(notice["deadline_unix_s"] - (flipped + GCE_NOTICE_S)) < 1.0
        path, query = fake.requests[-1]
        assert "wait_for_change=true" in query and "last_etag=" in query and "timeout_sec=10" in query
        assert gce.check() == notice and len(fake.requests) == 2  # it sticks, without asking again


def test_a_change_between_two_polls_is_not_missed() -> None:
    with FakeGceMetadata() as fake:
        gce = GceMetadata(fake.endpoint, wait_s=10)
        assert gce.check() is None
        fake.preempt()  # while no request is waiting
        t0 = time.time()
        assert gce.check() is not None and time.time() - t0 < 1.0  # last_etag differs: answered at once


def test_a_long_poll_without_a_change_ends_at_its_timeout() -> None:
    with FakeGceMetadata() as fake:
        gce = GceMetadata(fake.endpoint, wait_s=1)
        gce.check()
        t0 = time.time()
        assert gce.check() is None
        assert 0.9 < time.time() - t0 < 3.0


def test_plain_polling_when_wait_for_change_is_off() -> None:
    with FakeGceMetadata() as fake:
        gce = GceMetadata(fake.endpoint, wait_for_change=False)
        assert gce.check() is None and gce.check() is None
        assert all(q == "" for _, q in fake.requests)


def test_identity_and_the_metadata_flavor_both_ways() -> None:
    with FakeGceMetadata(name="vm-7", ip="10.1.2.3") as fake:
        gce = GceMetadata(fake.endpoint)
        assert (gce.instance_id(), gce.address()) == ("vm-7", "10.1.2.3")
        import httpx

        assert httpx.get(f"{fake.endpoint}/computeMetadata/v1/instance/name").status_code == 403
    with FakeGceMetadata(impostor=True) as impostor:
        with pytest.raises(MetadataError, match="not the metadata server"):
            GceMetadata(impostor.endpoint).check()
    with pytest.raises(MetadataError, match="GCE metadata preempted"):
        GceMetadata("http://127.0.0.1:9", timeout_s=0.2).check()  # nothing listens there


def test_one_client_for_both_clouds() -> None:
    config = agent_config(Path("/tmp"), notice_sources=(NOTICE_SOURCE_AWS, NOTICE_SOURCE_GCE),
                          aws_imds_endpoint="http://127.0.0.1:1", gce_metadata_endpoint="http://127.0.0.1:2")
    aws, gce = sources_for(config)
    assert isinstance(aws, AwsImds) and isinstance(gce, GceMetadata)
    assert type(aws._client) is type(gce._client)


def test_the_agent_relays_a_gce_preemption_to_its_workers_and_the_controller(tmp_path: Path) -> None:
    channel = FakeChannel()
    with FakeGceMetadata(name="spotrain-vm-3", ip="10.128.0.9") as fake:
        config = agent_config(tmp_path, instance_id=None, notice_sources=(NOTICE_SOURCE_GCE,),
                              gce_metadata_endpoint=fake.endpoint)
        agent = Agent(config, channel=channel)
        assert (agent.instance_id, agent.address) == ("spotrain-vm-3", "10.128.0.9")  # from the metadata server
        agent.watcher.start()
        try:
            channel.assign(rank_assignment(tmp_path, WAIT_FOR_NOTICE))
            drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_RUNNING)
            fake.wait_for_waiters(1)  # the watcher is long-polling
            fake.preempt()
            drive(agent, lambda: channel.reports[-1].state == STATE_EXITED)
        finally:
            agent.watcher.close()
    last = channel.reports[-1]
    assert dict(last.exit_codes) == {0: 85}  # the worker checkpointed and asked to be rescheduled
    assert last.notice is not None and last.notice["source"] == NOTICE_SOURCE_GCE
    assert last.notice["reason"] == "preemption" and last.notice["deadline_unix_s"] > time.time()
    written = json.loads((tmp_path / "state" / "attempts" / "1" / "notice.json").read_text())
    assert written["source"] == NOTICE_SOURCE_GCE


def test_a_waiting_long_poll_does_not_hold_up_another_source() -> None:
    with FakeGceMetadata() as gce_fake, FakeMetadataServer() as imds:
        watcher = CloudNoticeWatcher([GceMetadata(gce_fake.endpoint, wait_s=30), AwsImds(imds.endpoint)],
                                     interval_s=0.05).start()
        try:
            gce_fake.wait_for_waiters(1)
            imds.notice_spot_interruption(in_s=120)
            deadline = time.time() + 3
            while watcher.notice is None and time.time() < deadline:
                time.sleep(0.02)
        finally:
            watcher.close()
        assert watcher.notice is not None and watcher.notice["source"] == NOTICE_SOURCE_AWS
