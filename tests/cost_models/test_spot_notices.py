"""The notice client's protocol (``cost_models/spot_notices.py``) against a scripted transport: every
request it makes and every answer it is given are in the test, no sockets, no sleeps. The real HTTP
transports are tested against the loopback fake in ``tests/runtime/test_runtime_notices.py``."""

from __future__ import annotations

import calendar
from collections.abc import Mapping

import pytest

import runtime.protocol as worker_protocol
from cost_models import spot_notices
from cost_models.spot_notices import (
    GCE_NOTICE_S,
    IMDS_TOKEN_TTL_S,
    AwsImds,
    GceMetadata,
    Notice,
    parse_iso_utc,
)

GCE = {"metadata-flavor": "Google"}


class Unreadable(Exception):
    """The test's error type: what ``failure`` makes, so a test sees the client chose it."""


class Scripted:
    """Answers by (method, path without the endpoint); records each request. A path scripted with an
    ``OSError`` raises it (no answer)."""

    def __init__(self, endpoint: str = "http://md") -> None:
        self.endpoint = endpoint
        self.answers: dict[tuple[str, str], tuple[int, str, Mapping[str, str]] | OSError] = {}
        self.requests: list[tuple[str, str, dict[str, str], float]] = []

    def request(self, method: str, url: str, headers: Mapping[str, str],
                timeout_s: float) -> tuple[int, str, Mapping[str, str]]:
        assert url.startswith(self.endpoint)
        path = url[len(self.endpoint):]
        self.requests.append((method, path, dict(headers), timeout_s))
        answer = self.answers.get((method, path.split("?")[0]), (404, "not found", {}))
        if isinstance(answer, OSError):
            raise answer
        return answer

    def failure(self, message: str) -> Exception:
        return Unreadable(message)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


def _imds(rebalance: bool = False) -> tuple[AwsImds, Scripted, Clock]:
    t, clock = Scripted(), Clock()
    t.answers[("PUT", "/latest/api/token")] = (200, "tok-1\n", {})
    return AwsImds(t, "http://md/", rebalance=rebalance, clock=clock), t, clock


def test_the_constants_are_the_worker_protocols() -> None:
    assert spot_notices.PREEMPTION == worker_protocol.NOTICE_PREEMPTION
    assert spot_notices.REBALANCE == worker_protocol.NOTICE_REBALANCE


def test_imds_token_first_then_the_documents_with_it() -> None:
    aws, t, _ = _imds()
    assert aws.check() == []
    (put, get) = t.requests
    assert put[:3] == ("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)})
    assert get[:3] == ("GET", ACTION, {"X-aws-ec2-metadata-token": "tok-1"})
    assert get[3] == 1.0  # the short timeout of a link-local read


def test_the_token_is_reused_until_half_its_ttl_then_renewed() -> None:
    aws, t, clock = _imds()
    aws.check()
    aws.check()
    assert [r[0] for r in t.requests].count("PUT") == 1
    clock.now += IMDS_TOKEN_TTL_S / 2 + 1
    aws.check()
    assert [r[0] for r in t.requests].count("PUT") == 2


def test_a_rejected_token_is_dropped_and_is_a_failure_not_a_notice() -> None:
    aws, t, _ = _imds()
    t.answers[("GET", ACTION)] = (401, "unauthorized", {})
    with pytest.raises(Unreadable, match="^IMDS spot/instance-action: token rejected$"):
        aws.check()
    t.answers[("GET", ACTION)] = (404, "", {})
    assert aws.check() == []
    assert [r[0] for r in t.requests].count("PUT") == 2  # a new token after the 401


def test_the_spot_notice_with_its_deadline_and_action() -> None:
    aws, t, _ = _imds()
    t.answers[("GET", ACTION)] = (200, '{"action": "stop", "time": "2026-12-02T08:00:00Z"}', {})
    (notice,) = aws.check()
    expected = float(calendar.timegm((2026, 12, 2, 8, 0, 0, 0, 0, 0)))
    assert notice == Notice(reason="preemption", source="aws-imds", deadline_unix_s=expected, stop=True,
                            action="stop")
    assert notice.to_json() == {"reason": "preemption", "source": "aws-imds", "deadline_unix_s": expected,
                                "action": "stop"}
    t.answers[("GET", ACTION)] = (200, '{"action": "terminate", "time": "soon"}', {})
    assert aws.check()[0].deadline_unix_s is None  # an unreadable time is no deadline, still a notice


def test_rebalance_only_where_asked_for_and_never_a_stop() -> None:
    for wanted in (False, True):
        aws, t, _ = _imds(rebalance=wanted)
        t.answers[("GET", REBALANCE)] = (200, '{"noticeTime": "2026-12-02T08:00:00Z"}', {})
        notices = aws.check()
        assert [(n.reason, n.stop) for n in notices] == ([("rebalance", False)] if wanted else [])
        assert any(r[1] == REBALANCE for r in t.requests) is wanted


@pytest.mark.parametrize(("answer", "detail"), [
    ((200, "{half", {}), "not JSON"),
    ((200, "[1, 2]", {}), "not a JSON object: list"),
    ((500, "oops", {}), "HTTP 500"),
    (ConnectionResetError("reset by peer"), "reset by peer"),
])
def test_every_unreadable_answer_is_the_callers_failure(answer: tuple[int, str, Mapping[str, str]] | OSError,
                                                        detail: str) -> None:
    aws, t, _ = _imds()
    t.answers[("GET", ACTION)] = answer
    with pytest.raises(Unreadable, match=f"^IMDS spot/instance-action: .*{detail}"):
        aws.check()


def test_an_empty_document_is_no_notice_and_a_failed_token_is_a_failure() -> None:
    aws, t, _ = _imds()
    t.answers[("GET", ACTION)] = (200, "", {})
    assert aws.check() == []
    t2 = Scripted()
    t2.answers[("PUT", "/latest/api/token")] = (403, "forbidden", {})
    with pytest.raises(Unreadable, match="^IMDS token: HTTP 403$"):
        AwsImds(t2, "http://md").check()


def test_imds_identity() -> None:
    aws, t, _ = _imds()
    t.answers[("GET", "/latest/meta-data/instance-id")] = (200, "i-0abc\n", {})
    t.answers[("GET", "/latest/meta-data/local-ipv4")] = (200, "10.0.0.7", {})
    assert (aws.instance_id(), aws.address()) == ("i-0abc", "10.0.0.7")
    del t.answers[("GET", "/latest/meta-data/local-ipv4")]
    assert aws.address() is None


PREEMPTED = "/computeMetadata/v1/instance/preempted"


def test_gce_preempted_sticks_with_a_deadline_from_when_it_was_seen() -> None:
    t, clock = Scripted(), Clock(500.0)
    gce = GceMetadata(t, "http://md", wait_for_change=False, clock=clock)
    t.answers[("GET", PREEMPTED)] = (200, "FALSE\n", GCE)
    assert gce.check() == []
    t.answers[("GET", PREEMPTED)] = (200, "true", GCE)
    (notice,) = gce.check()
    assert notice == Notice(reason="preemption", source="gce-metadata", deadline_unix_s=500.0 + GCE_NOTICE_S)
    assert all(r[2] == {"Metadata-Flavor": "Google"} and "?" not in r[1] for r in t.requests)  # plain reads
    clock.now += 100
    asked = len(t.requests)
    assert gce.check() == [notice] and len(t.requests) == asked  # it does not turn back, nor ask again


def test_gce_long_poll_after_the_first_read_with_the_last_etag() -> None:
    t = Scripted()
    gce = GceMetadata(t, "http://md", wait_s=10)
    t.answers[("GET", PREEMPTED)] = (200, "FALSE", {**GCE, "etag": "e1"})
    assert gce.check() == []
    assert t.requests[0][1] == PREEMPTED and t.requests[0][3] == 1.0
    assert gce.check() == []
    _, path, _, timeout_s = t.requests[1]
    assert path == PREEMPTED + "?wait_for_change=true&last_etag=e1&timeout_sec=10"
    assert timeout_s == 10 + spot_notices.GCE_WAIT_SLACK_S  # longer than the server's own wait


def test_gce_refuses_an_answer_without_the_flavor_header() -> None:
    t = Scripted()
    t.answers[("GET", PREEMPTED)] = (200, "TRUE", {})
    with pytest.raises(Unreadable, match="HTTP 200 without Metadata-Flavor: Google .not the metadata server"):
        GceMetadata(t, "http://md").check()
    t.answers[("GET", PREEMPTED)] = (503, "busy", GCE)
    with pytest.raises(Unreadable, match="^GCE metadata preempted: HTTP 503$"):
        GceMetadata(t, "http://md").check()


def test_gce_identity() -> None:
    t = Scripted()
    t.answers[("GET", "/computeMetadata/v1/instance/name")] = (200, "vm-7\n", GCE)
    t.answers[("GET", "/computeMetadata/v1/instance/network-interfaces/0/ip")] = (200, "10.1.2.3", GCE)
    gce = GceMetadata(t, "http://md")
    assert (gce.instance_id(), gce.address()) == ("vm-7", "10.1.2.3")


def test_iso_times() -> None:
    assert parse_iso_utc("1970-01-02T00:00:00Z") == 86400.0
    assert parse_iso_utc("2026-12-02 08:00:00") is None and parse_iso_utc("") is None
