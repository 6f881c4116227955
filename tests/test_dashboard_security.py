"""Issue 21, findings 4 and 14 (dashboard): empty tokens, the dashboard's CSP, framing and CSRF.

Finding 4: a 0-byte token file (a first start on a full disk) meant an empty token, and an empty
dashboard login then got in. The controller now refuses to start with an empty or unreadable token
(one line, non-zero exit), a token is written whole or not at all, and an empty credential never
matches. Finding 14: the dashboard sent no Content-Security-Policy or X-Frame-Options and its login
had no CSRF token. The app is the real one (FastAPI's TestClient), the CLI a real subprocess.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoscaler.controller import Controller
from autoscaler.fleet.clouds import local_cloud
from autoscaler.home import db_url, ensure_token
from autoscaler.policy import get_policy
from autoscaler.server.api import create_app
from autoscaler.state import Store
from support import run_cli

TOKEN = "dash-t0ken-secret"
FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture()
def ctl(spotrain_home: Path) -> Controller:
    setup = local_cloud("dash")
    return Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                      controller_id="dash", tick_s=0.1, clock_rate=setup.clock_rate)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page[-400:]
    return found.group(1)


# ----- finding 4: empty tokens --------------------------------------------------------------------
def test_an_empty_token_file_is_refused_at_start(spotrain_home: Path) -> None:
    (spotrain_home / "token").write_text("\n")
    r = run_cli("controller", "start", "--port", "0", timeout=30)  # on main: it served, with an empty token
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "token" in r.stderr and "empty" in r.stderr, r.stderr
    assert not (spotrain_home / "controller.json").exists()
    from autoscaler.home import SecretError

    with pytest.raises(SecretError, match="empty"):
        ensure_token()


def test_a_token_that_cannot_be_written_leaves_no_empty_file(spotrain_home: Path) -> None:
    """A full disk, for real: files may not grow past 0 bytes (RLIMIT_FSIZE)."""
    code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)); "
            "from autoscaler.home import ensure_token; ensure_token()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "SecretError" in r.stderr, r.stderr
    assert not (spotrain_home / "token").exists() and not list(spotrain_home.glob(".token*"))
    tok = ensure_token()  # the next start, with room on the disk, makes a whole one
    assert len(tok) >= 32 and (spotrain_home / "token").read_text().strip() == tok


def test_an_empty_token_never_opens_anything(ctl: Controller) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        create_app(ctl, "")
    http = TestClient(create_app(ctl, TOKEN))
    assert http.get("/v1/jobs", headers={"authorization": "Bearer "}).status_code == 401
    assert http.get("/ui", headers={"cookie": "spotrain_token="}, follow_redirects=False).status_code == 303
    csrf = csrf_of(http.get("/ui/login").text)
    empty = http.post("/ui/login", content=f"csrf={csrf}&token=", headers=FORM, follow_redirects=False)
    assert empty.status_code == 401 and "spotrain_token=" not in empty.headers.get("set-cookie", "")


# ----- finding 14: CSP, framing, CSRF ---------------------------------------------------------------
def test_every_dashboard_page_forbids_scripts_and_framing(ctl: Controller) -> None:
    http = TestClient(create_app(ctl, TOKEN))
    login = http.get("/ui/login")
    jobs = http.get("/ui", headers={"cookie": f"spotrain_token={TOKEN}"})
    for page in (login, jobs):
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
        assert directives["default-src"] == ["'none'"] and "script-src" not in directives  # no script at all
        assert directives["frame-ancestors"] == ["'none'"] and page.headers["x-frame-options"] == "DENY"
        assert "'unsafe-inline'" not in csp and "<script" not in page.text
        # The one inline stylesheet is allowed by its hash, so the browser still applies it.
        style = re.search(r"<style>(.*?)</style>", page.text, re.S)
        assert style is not None
        digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
        assert directives["style-src"] == [f"'sha256-{digest}'"]


def test_login_and_logout_need_the_forms_csrf_token(ctl: Controller) -> None:
    http = TestClient(create_app(ctl, TOKEN))
    form = http.get("/ui/login")
    csrf = csrf_of(form.text)
    assert f"spotrain_csrf={csrf}" in form.headers["set-cookie"] and "HttpOnly" in form.headers["set-cookie"]
    # A cross-site form (no CSRF field, or one that is not this browser's) is refused, even with the token.
    for body in (f"token={TOKEN}", f"token={TOKEN}&csrf=forged-forged-forged-forged"):
        r = http.post("/ui/login", content=body, headers=FORM, follow_redirects=False)
        assert r.status_code == 403 and "spotrain_token" not in r.headers.get("set-cookie", ""), body
    bare = TestClient(create_app(ctl, TOKEN))  # a browser without the CSRF cookie, sending a field
    r = bare.post("/ui/login", content=f"token={TOKEN}&csrf={csrf}", headers=FORM, follow_redirects=False)
    assert r.status_code == 403
    ok = http.post("/ui/login", content=f"token={TOKEN}&csrf={csrf}", headers=FORM, follow_redirects=False)
    assert ok.status_code == 303 and "spotrain_token=" in ok.headers["set-cookie"]
    assert http.get("/ui").status_code == 200  # the cookie the login set opens the dashboard
    assert http.get("/ui/logout", follow_redirects=False).status_code == 405  # logging out is a POST now
    refused = http.post("/ui/logout", content="", headers=FORM, follow_redirects=False)
    assert refused.status_code == 403
    out = http.post("/ui/logout", content=f"csrf={csrf_of(http.get('/ui').text)}", headers=FORM, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
