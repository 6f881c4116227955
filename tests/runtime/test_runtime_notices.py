"""Notices: the notice file, SIGTERM, AWS IMDSv2 and GCE metadata (loopback fake), in real gangs."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

import rt_launch
from cost_models.spot_notices import AwsImds, GceMetadata
from fakes.imds import FakeMetadataServer
from runtime import protocol
from runtime.config import NoticeConfig
from runtime.errors import NoticeSourceError
from runtime.notices import NoticeWatcher, UrllibTransport, read_notice_file
from support import wait_until


def test_notice_file_is_read_leniently(tmp_path: Path) -> None:
    f = tmp_path / "notice"
    assert read_notice_file(str(f)) is None
    f.write_text(json.dumps({"reason": "rescale", "deadline_unix_s": 12.5}))
    n = read_notice_file(str(f))
    assert n is not None and n.reason == "rescale" and n.deadline_unix_s == 12.5 and n.stop
    f.write_text("{half")
    n = read_notice_file(str(f))
    assert n is not None and n.reason == protocol.NOTICE_PREEMPTION


def test_the_urllib_transport_against_the_fake() -> None:
    """The runtime's transport under the shared client (tests/cost_models/test_spot_notices.py has the
    protocol's cases): real HTTP to the loopback fake, an error status as an answer, no answer as
    the runtime's own error."""
    with FakeMetadataServer() as fake:
        transport = UrllibTransport()
        aws = AwsImds(transport, fake.endpoint, rebalance=True)
        gce = GceMetadata(transport, fake.endpoint, wait_for_change=False)
        assert aws.check() == [] and gce.check() == []
        fake.recommend_rebalance()
        (rebalance,) = aws.check()
        assert rebalance.reason == "rebalance" and not rebalance.stop
        fake.notice_spot_interruption(in_s=120)
        notices = aws.check()
        assert notices[0].reason == "preemption" and notices[0].stop
        assert abs(notices[0].deadline_unix_s - (time.time() + 120)) < 5
        fake.preempt_gce()
        (pre,) = gce.check()
        assert pre.source == "gce-metadata" and pre.stop
        assert ("PUT", "/latest/api/token") in fake.requests  # IMDSv2 session token first
        status, _, headers = transport.request("GET", f"{fake.endpoint}/latest/meta-data/instance-id", {}, 1.0)
        assert status == 401 and "content-type" in headers  # no token: an answer, not an exception
    with pytest.raises(NoticeSourceError, match="GCE metadata preempted"):
        GceMetadata(UrllibTransport(), "http://127.0.0.1:9", timeout_s=0.2).check()  # nothing listens there


def test_watcher_contacts_no_metadata_server_unless_named(tmp_path: Path) -> None:
    with FakeMetadataServer() as fake:
        fake.notice_spot_interruption()
        watcher = NoticeWatcher(NoticeConfig(aws_imds_endpoint=fake.endpoint, poll_interval_s=0.01,
                                             handle_sigterm=False)).start()
        # No polling thread, so nothing can reach the server later either (poll() reads only the
        # notice file and the SIGTERM flag): checked at once, rather than after a guessed wait.
        assert not [t for t in threading.enumerate() if t.name == "spotrain-notices"]
        assert watcher.poll() == (None, None)
        watcher.close()
        assert fake.requests == []
        watcher = NoticeWatcher(NoticeConfig(sources=("aws-imds",), aws_imds_endpoint=fake.endpoint,
                                             poll_interval_s=0.01, handle_sigterm=False)).start()
        wait_until(lambda: watcher.poll()[0], 5, "the IMDS notice")
        watcher.close()
        stop, _ = watcher.poll()
        assert stop is not None and stop.source == "aws-imds"


def _base_env(tmp: Path, name: str) -> dict[str, str]:
    return {
        protocol.ENV_CHECKPOINT_URI: f"file://{tmp / name}",
        protocol.ENV_CHECKPOINT_INTERVAL_S: "3600",
        protocol.ENV_PROGRESS_FILE: str(tmp / f"{name}-progress.json"),
        "RT_MAX_STEPS": "80", "RT_STEP_SLEEP_S": "0.05", "RT_OUT": str(tmp),
    }


def _wait_for_step(progress: Path, step: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if json.loads(progress.read_text())["step"] >= step:
                return
        except (FileNotFoundError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"training never reached step {step}")


def _assert_stopped_together(res: rt_launch.GangResult, ckpt_root: Path) -> int:
    assert res.codes == [protocol.EXIT_RESCHEDULE] * len(res.codes), res.outputs
    (step,) = {s["step"] for s in res.summaries}
    assert 0 < step < 80
    assert (ckpt_root / "checkpoints" / str(step) / "manifest.json").exists()
    return step


@pytest.mark.e2e
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_boundary(tmp_path: Path) -> None:
    env = _base_env(tmp_path, "sigterm")
    procs = rt_launch.start(2, env)
    _wait_for_step(tmp_path / "sigterm-progress.json", 3)
    t0 = time.time()
    procs[1].send_signal(signal.SIGTERM)
    res = rt_launch.wait(procs, tmp_path)
    assert time.time() - t0 < 5  # durable well inside a notice window
    _assert_stopped_together(res, tmp_path / "sigterm")
    progress = json.loads((tmp_path / "sigterm-progress.json").read_text())
    assert progress["last_checkpoint_step"] == res.summaries[0]["step"]


@pytest.mark.e2e
def test_aws_spot_interruption_via_imds_stops_the_gang(tmp_path: Path) -> None:
    with FakeMetadataServer() as fake:
        env = {**_base_env(tmp_path, "imds"), "SPOTRAIN_NOTICE_SOURCES": "aws-imds",
               "SPOTRAIN_AWS_IMDS_ENDPOINT": fake.endpoint, "SPOTRAIN_NOTICE_POLL_S": "0.05"}
        procs = rt_launch.start(2, env)
        _wait_for_step(tmp_path / "imds-progress.json", 2)
        fake.notice_spot_interruption(in_s=2)
        res = rt_launch.wait(procs, tmp_path)
    _assert_stopped_together(res, tmp_path / "imds")


@pytest.mark.e2e
def test_gce_preemption_and_aws_rebalance(tmp_path: Path) -> None:
    with FakeMetadataServer() as fake:
        env = {**_base_env(tmp_path, "gce"), "SPOTRAIN_NOTICE_SOURCES": "gce-metadata,aws-imds",
               "SPOTRAIN_GCE_METADATA_ENDPOINT": fake.endpoint, "SPOTRAIN_AWS_IMDS_ENDPOINT": fake.endpoint,
               "SPOTRAIN_NOTICE_POLL_S": "0.05"}
        procs = rt_launch.start(1, env)
        _wait_for_step(tmp_path / "gce-progress.json", 2)
        fake.recommend_rebalance()  # checkpoint now, keep training
        wait_until(lambda: list((tmp_path / "gce").glob("checkpoints/*/manifest.json")), 30, "the rebalance checkpoint")
        assert procs[0].poll() is None
        early = sorted(int(p.parent.name) for p in (tmp_path / "gce").glob("checkpoints/*/manifest.json"))
        fake.preempt_gce()
        res = rt_launch.wait(procs, tmp_path)
    step = _assert_stopped_together(res, tmp_path / "gce")
    assert early and early[0] < step


@pytest.mark.e2e
def test_notice_file_rescale_directive(tmp_path: Path) -> None:
    env = {**_base_env(tmp_path, "nf"), "RT_STEP_SLEEP_S": "0", "RT_MAX_STEPS": "30"}
    res = rt_launch.run(2, env, tmp_path, per_rank=lambda r: {
        protocol.ENV_NOTICE_FILE: str(tmp_path / f"notice-{r}"), "RT_NOTICE_AT_STEP": "4" if r == 0 else "-1",
        "RT_NOTICE_REASON": "rescale"})
    assert _assert_stopped_together(res, tmp_path / "nf") == 5


@pytest.mark.timeout(20)
def test_sigterm_landing_inside_poll_does_not_deadlock() -> None:
    """Python runs a signal handler on the main thread between bytecodes, possibly while that thread
    holds the watcher's lock inside poll(); the handler must not take the lock."""
    watcher = NoticeWatcher(NoticeConfig(handle_sigterm=False))
    with watcher._lock:  # as if the signal arrived in poll()'s critical section
        watcher._on_sigterm(signal.SIGTERM, None)
    stop, _ = watcher.poll()
    assert stop is not None and stop.source == "sigterm" and stop.stop
    watcher.close()
