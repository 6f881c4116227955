"""Issue 24, item 5: the dashboard's one-time login links, its job page's worker output and cancel.

The links (``server/login_links.py``) on a fake clock, then through the real app (FastAPI's
TestClient): a link logs in once, a reused, expired or made-up one gets a page that says so (never a
traceback) and no cookie; only a caller with the API token gets a link. The job page shows the
workers' output HTML-escaped, and its cancel button cancels through a confirmation page and a POST
with the CSRF token. The browser end to end is in ``test_dashboard.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoscaler.client.http import Client
from autoscaler.controller import Controller
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url, logs_dir
from autoscaler.jobs.spec import load_spec
from autoscaler.policy import get_policy
from autoscaler.server.api import create_app
from autoscaler.server.login_links import LoginLinks, Redeemed
from autoscaler.state import Store
from support import run_cli, write_pw_spec

TOKEN = "dash-links-t0ken-secret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
FORM = {"content-type": "application/x-www-form-urlencoded"}


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def ctl(spotrain_home: Path) -> Controller:
    setup = local_cloud("dash-links")
    return Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                      controller_id="dash-links", tick_s=0.1, clock_rate=setup.clock_rate)


def secret_of(path: str) -> str:
    found = re.fullmatch(r"/ui/link\?t=([A-Za-z0-9_-]{40,})", path)
    assert found, path
    return found.group(1)


# ----- the links on their own ----------------------------------------------------------------------
def test_a_link_logs_in_once_and_then_never_again() -> None:
    clock = FakeClock()
    links = LoginLinks(ttl_s=120, clock=clock)
    a, b = links.issue(), links.issue()
    assert a != b and len(a) >= 40 and links.outstanding() == 2
    assert links.redeem(a) is Redeemed.OK
    assert links.redeem(a) is Redeemed.USED
    assert links.redeem(a) is Redeemed.USED  # and stays used
    assert links.outstanding() == 1
    assert links.redeem(b) is Redeemed.OK


def test_a_link_expires() -> None:
    clock = FakeClock()
    links = LoginLinks(ttl_s=120, clock=clock)
    late, on_time = links.issue(), links.issue()
    clock.t += 119.9
    assert links.redeem(on_time) is Redeemed.OK
    clock.t += 0.1  # 120 s after it was issued
    assert links.redeem(late) is Redeemed.EXPIRED
    assert links.redeem(late) is not Redeemed.OK


def test_a_made_up_or_empty_secret_is_refused_and_the_store_is_bounded() -> None:
    links = LoginLinks(max_outstanding=4, clock=FakeClock())
    first = links.issue()
    for bad in ("", "x", first[:-1], first + "x", "a" * 5000):
        assert links.redeem(bad) is Redeemed.UNKNOWN, bad
    for _ in range(10):
        links.issue()
    assert links.outstanding() == 4  # the oldest were dropped: memory stays bounded
    assert links.redeem(first) is Redeemed.UNKNOWN
    with pytest.raises(ValueError):
        LoginLinks(ttl_s=0)


# ----- through the app -----------------------------------------------------------------------------
def test_only_the_api_token_gets_a_link_and_the_link_sets_the_dashboard_cookie(ctl: Controller) -> None:
    clock = FakeClock()
    app = create_app(ctl, TOKEN, login_links=LoginLinks(ttl_s=120, clock=clock))
    http = TestClient(app)
    assert http.post("/v1/dashboard/links").status_code == 401
    assert http.post("/v1/dashboard/links", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert http.post("/v1/dashboard/links", headers={"cookie": f"spotrain_token={TOKEN}"}).status_code == 401
    made = http.post("/v1/dashboard/links", headers=AUTH)
    assert made.status_code == 200 and made.json()["expires_in_s"] == 120
    path = made.json()["path"]
    secret_of(path)
    browser = TestClient(app)
    assert browser.get("/ui", follow_redirects=False).status_code == 303  # not logged in yet
    page = browser.get(path, follow_redirects=False)
    assert page.status_code == 200 and 'id="logged-in"' in page.text
    assert f"spotrain_token={TOKEN}" in page.headers["set-cookie"] and "HttpOnly" in page.headers["set-cookie"]
    assert "samesite=strict" in page.headers["set-cookie"].lower()
    assert 'http-equiv="refresh" content="0; url=/ui"' in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert browser.get("/ui", follow_redirects=False).status_code == 200  # logged in
    assert browser.get("/v1/jobs").status_code == 401  # the cookie never opens the API

    # Used once: a second browser with the same link gets a page that says so, and no cookie.
    again = TestClient(app).get(path, follow_redirects=False)
    assert again.status_code == 410 and "already used" in again.text and 'id="link-refused"' in again.text
    assert "spotrain_token" not in again.headers.get("set-cookie", "") and "Traceback" not in again.text
    assert "spotrain dashboard" in again.text

    # Expired: issued, then not used within its lifetime.
    stale = http.post("/v1/dashboard/links", headers=AUTH).json()["path"]
    clock.t += 121
    late = TestClient(app).get(stale, follow_redirects=False)
    assert late.status_code == 410 and "expired" in late.text and "spotrain_token" not in late.headers.get("set-cookie", "")

    # Made up, empty, or the API token itself: refused.
    for bad in ("/ui/link?t=not-a-link", "/ui/link", f"/ui/link?t={TOKEN}", "/ui/link?t=" + secret_of(path)[:-2]):
        r = TestClient(app).get(bad, follow_redirects=False)
        assert r.status_code == 401 and "not valid" in r.text and "spotrain_token" not in r.headers.get("set-cookie", ""), bad


def test_the_client_builds_the_full_link(ctl: Controller) -> None:
    app = create_app(ctl, TOKEN)
    url, ttl_s = Client(token=TOKEN, http=TestClient(app)).login_link()
    assert url.startswith("http://testserver/ui/link?t=") and ttl_s == 120
    assert TestClient(app).get(url.removeprefix("http://testserver"), follow_redirects=False).status_code == 200


def test_spotrain_dashboard_without_a_controller_says_so(spotrain_home: Path) -> None:
    r = run_cli("dashboard", timeout=60)
    assert r.returncode == 3 and "no controller is running" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ----- the job page --------------------------------------------------------------------------------
def test_job_page_shows_escaped_worker_output_and_cancels_with_csrf(ctl: Controller, tmp_path: Path) -> None:
    spec, workdir = load_spec(write_pw_spec(tmp_path, name="dash-page"))
    job_id = ctl.submit(spec, workdir)["job_id"]
    log_dir = logs_dir(job_id)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "attempt-1-rank-0.log").write_text("epoch 1 loss 0.5\n<script>alert('x')</script> & more\n")
    (log_dir / "attempt-1-rank-1.log").write_text("rank one's own line\n")
    http = TestClient(create_app(ctl, TOKEN))
    http.cookies.set("spotrain_token", TOKEN)
    page = http.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert "epoch 1 loss 0.5" in page.text and "attempt 1, rank 0" in page.text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page.text and "<script>" not in page.text
    assert "rank one's own line" not in page.text  # rank 0's, as `spotrain logs` shows by default
    assert 'id="cancel"' in page.text
    confirm = http.get(f"/ui/jobs/{job_id}/cancel")
    assert confirm.status_code == 200 and 'id="confirm-cancel"' in confirm.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', confirm.text)
    assert csrf
    # Without the form's CSRF token (a cross-site form) nothing is cancelled.
    forged = http.post(f"/ui/jobs/{job_id}/cancel", content="csrf=forged-forged-forged-forged", headers=FORM,
                       follow_redirects=False)
    assert forged.status_code == 403 and ctl.job_info(job_id)["state"] != "CANCELLED"
    done = http.post(f"/ui/jobs/{job_id}/cancel", content=f"csrf={csrf.group(1)}", headers=FORM, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/ui/jobs/{job_id}?note=cancelled"
    assert ctl.job_info(job_id)["state"] == "CANCELLED"
    after = http.get(done.headers["location"])
    assert "cancelling" in after.text and "CANCELLED" in after.text and 'id="cancel"' not in after.text
    # A second cancel of the ended job says there was nothing to cancel.
    again = http.post(f"/ui/jobs/{job_id}/cancel", content=f"csrf={csrf.group(1)}", headers=FORM, follow_redirects=False)
    assert again.headers["location"].endswith("?note=ended")
