"""The instance agent against a scripted controller: real rank processes, real files, real IMDS fake."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cloud_providers.remote import agent as agent_module
from cloud_providers.remote.agent import Agent
from cloud_providers.remote.config import AgentConfig
from cloud_providers.remote.wire import STATE_EXITED, STATE_RUNNING, STATE_STOPPED
from fakes.imds import FakeMetadataServer
from remote_support import FakeChannel, agent_config, drive, rank_assignment

# A rank that waits for the notice file, writes progress as rank 0 does, and exits "reschedule me".
WAIT_FOR_NOTICE = ('while [ ! -e "$SPOTRAIN_NOTICE_FILE" ]; do sleep 0.02; done; '
                   'echo \'{"step": 5, "total_steps": 10}\' > "$SPOTRAIN_PROGRESS_FILE"; exit 85')


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_runs_each_rank_with_the_protocol_env_and_reports_exit_codes(tmp_path: Path, channel: FakeChannel) -> None:
    work = tmp_path / "work"  # does not exist yet: the agent makes it (a setup could fetch code into it)
    run = 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $SPOTRAIN_JOB_ID" > out-$RANK; exit $((RANK - 2))'
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(work, run, ranks=[2, 3], world_size=4, setup="echo ran >> setup.count"))
    drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_EXITED)
    assert (work / "out-2").read_text().split() == ["2", "0", "4", "10.0.0.7", "29511", "job-1"]
    assert (work / "out-3").read_text().split() == ["3", "1", "4", "10.0.0.7", "29511", "job-1"]
    last = channel.reports[-1]
    assert (last.attempt, dict(last.exit_codes), last.instance_id) == (1, {2: 0, 3: 1}, "i-1")
    # A new attempt on the same instance: setup is not run again.
    channel.assign(rank_assignment(work, run, attempt=2, ranks=[2, 3], world_size=4, setup="echo ran >> setup.count"))
    drive(agent, lambda: channel.reports[-1].attempt == 2 and channel.reports[-1].state == STATE_EXITED)
    assert (work / "setup.count").read_text() == "ran\n"
    assert (tmp_path / "state" / "logs" / "job-1" / "attempt-2-rank-3.log").exists()


def test_a_failing_setup_fails_every_rank_with_its_code(tmp_path: Path, channel: FakeChannel) -> None:
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, "exit 0", ranks=[0, 1], world_size=2, setup="exit 3"))
    drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_EXITED)
    assert dict(channel.reports[-1].exit_codes) == {0: 3, 1: 3}


def test_a_directive_reaches_the_notice_file_and_rank0_progress_is_reported(tmp_path: Path, channel: FakeChannel) -> None:
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, WAIT_FOR_NOTICE))
    drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_RUNNING)
    channel.assign(rank_assignment(tmp_path, WAIT_FOR_NOTICE), notice={"reason": "rescale", "deadline_unix_s": 1.0})
    drive(agent, lambda: channel.reports[-1].state == STATE_EXITED)
    last = channel.reports[-1]
    assert dict(last.exit_codes) == {0: 85}
    assert last.progress == {"step": 5, "total_steps": 10}
    assert last.notice is None  # a directive is the controller's own; only cloud notices are reported
    assert json.loads((tmp_path / "state" / "attempts" / "1" / "notice.json").read_text())["reason"] == "rescale"


def test_an_invalid_progress_record_is_not_reported_and_logged_once(tmp_path: Path, channel: FakeChannel,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    run = ('echo \'{"step": "five"}\' > "$SPOTRAIN_PROGRESS_FILE"; '
           'while [ ! -e "$SPOTRAIN_NOTICE_FILE" ]; do sleep 0.02; done; exit 85')
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, run))
    with caplog.at_level("WARNING", logger="spotrain.agent"):
        drive(agent, lambda: len(channel.reports) >= 3 and channel.reports[-1].state == STATE_RUNNING
              and (tmp_path / "state" / "attempts" / "1" / "progress.json").exists())
        agent.report(), agent.report()
    channel.assign(rank_assignment(tmp_path, run), notice={"reason": "rescale"})
    drive(agent, lambda: channel.reports[-1].state == STATE_EXITED)
    assert all(r.progress is None for r in channel.reports)
    lines = [r.getMessage() for r in caplog.records if "progress file ignored" in r.getMessage()]
    assert lines == ["progress file ignored: progress field step: expected int, got 'five'"]


def test_the_clouds_spot_notice_from_imds_is_relayed_and_reported(tmp_path: Path, channel: FakeChannel) -> None:
    with FakeMetadataServer(instance_id="i-0abc") as imds:
        config = agent_config(tmp_path, instance_id=None, notice_sources=("aws-imds",),
                              aws_imds_endpoint=imds.endpoint)
        agent = Agent(config, channel=channel)
        assert agent.instance_id == "i-0abc"  # from IMDS, as on a real instance
        agent.watcher.start()
        try:
            channel.assign(rank_assignment(tmp_path, WAIT_FOR_NOTICE))
            drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_RUNNING)
            imds.notice_spot_interruption(action="terminate", in_s=120)
            drive(agent, lambda: channel.reports[-1].state == STATE_EXITED)
        finally:
            agent.watcher.close()
    last = channel.reports[-1]
    assert dict(last.exit_codes) == {0: 85}
    assert last.notice is not None and last.notice["source"] == "aws-imds" and last.notice["reason"] == "preemption"
    assert last.notice["deadline_unix_s"] > time.time() + 60
    written = json.loads((tmp_path / "state" / "attempts" / "1" / "notice.json").read_text())
    assert written["reason"] == "preemption"


def test_a_stop_order_kills_the_workers_and_their_children(tmp_path: Path, channel: FakeChannel) -> None:
    run = "sleep 30 & echo $! > child.pid; wait"
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, run, ranks=[0, 1], world_size=2))
    drive(agent, lambda: (tmp_path / "child.pid").exists() and bool((tmp_path / "child.pid").read_text().strip()))
    child = int((tmp_path / "child.pid").read_text())
    assert alive(child)
    channel.assign(rank_assignment(tmp_path, run, ranks=[0, 1], world_size=2), stop_attempt=1)
    drive(agent, lambda: channel.reports[-1].state == STATE_STOPPED)
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(child)


def test_training_goes_on_while_the_controller_is_down_and_the_end_is_reported_later(
    tmp_path: Path, channel: FakeChannel
) -> None:
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, "while [ ! -e go ]; do sleep 0.02; done; exit 0"))
    drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_RUNNING)
    channel.down = True
    for _ in range(5):
        assert agent.step()  # no exception, no exit
    assert agent.state() == STATE_RUNNING
    (tmp_path / "go").write_text("")
    drive(agent, lambda: agent.state() == STATE_EXITED)
    assert channel.reports[-1].state == STATE_RUNNING  # nothing got through
    channel.down = False
    drive(agent, lambda: channel.reports[-1].state == STATE_EXITED)
    assert dict(channel.reports[-1].exit_codes) == {0: 0}


def test_a_terminated_instance_stops_its_workers_and_the_agent_exits(tmp_path: Path, channel: FakeChannel) -> None:
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, "sleep 30"))
    drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_RUNNING)
    channel.gone = True
    assert agent.step() is False
    assert agent.state() == STATE_STOPPED
    assert agent.run() == 0  # run() ends at once too


def test_a_restarted_agent_never_starts_an_attempt_twice(tmp_path: Path, channel: FakeChannel) -> None:
    run = "echo started >> starts; sleep 30"
    first = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, run))
    drive(first, lambda: (tmp_path / "starts").exists())
    assert first.gang is not None
    first.gang.kill()  # as systemd does to the unit's processes when the agent dies
    second = Agent(agent_config(tmp_path), channel=channel, sources=[])
    drive(second, lambda: channel.reports[-1].state == STATE_STOPPED and channel.reports[-1].attempt == 1)
    assert (tmp_path / "starts").read_text() == "started\n"
    # A new attempt runs normally.
    channel.assign(rank_assignment(tmp_path, "exit 0", attempt=2))
    drive(second, lambda: channel.reports[-1].state == STATE_EXITED and channel.reports[-1].attempt == 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"surprise": 1}, "surprise: unknown agent config field"),
        ({"controller_url": "ftp://x"}, "controller_url:"),
        ({"agent_credential": "d-2:00"}, "agent_credential: does not belong to decision_id"),
        ({"notice_sources": ["azure"]}, "notice_sources: 'azure'"),
        ({"poll_s": 0}, "poll_s: must be > 0"),
        ({"poll_s": "fast"}, "poll_s: expected a number"),
    ],
)
def test_bad_configs_name_the_field(tmp_path: Path, change: dict[str, object], message: str) -> None:
    good = agent_config(tmp_path).to_json()
    assert AgentConfig.from_json(good) == agent_config(tmp_path)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        AgentConfig.from_json({**good, **change})


def test_main_with_a_bad_config_says_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"controller_url": "http://x"}))
    assert agent_module.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "spotrain agent: agent_credential: required"
    assert agent_module.main(["--config", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err and not os.path.exists(tmp_path / "missing.json")


def test_workers_that_cannot_start_are_reported_as_failed(tmp_path: Path, channel: FakeChannel) -> None:
    (tmp_path / "file").write_text("")
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path / "file" / "sub", "exit 0", ranks=[0, 1], world_size=2))
    drive(agent, lambda: bool(channel.reports) and channel.reports[-1].state == STATE_EXITED)
    assert dict(channel.reports[-1].exit_codes) == {0: 127, 1: 127}


def test_sigterm_reaches_the_ranks_and_the_agent_leaves_once_it_has_reported(
    tmp_path: Path, channel: FakeChannel
) -> None:
    run = "trap 'exit 85' TERM; echo up > up; while true; do sleep 0.02; done"
    agent = Agent(agent_config(tmp_path), channel=channel, sources=[])
    channel.assign(rank_assignment(tmp_path, run))
    drive(agent, lambda: (tmp_path / "up").exists())
    agent.on_sigterm()
    deadline = time.monotonic() + 10
    while agent.step() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert time.monotonic() < deadline
    assert channel.reports[-1].state == STATE_EXITED and dict(channel.reports[-1].exit_codes) == {0: 85}
