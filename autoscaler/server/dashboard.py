"""The controller's dashboard at ``/ui``: server-rendered HTML, no JavaScript and no build step.

- ``/ui``: the jobs table (state, progress, workers, cost, preemptions): the live jobs and the
  ``RECENT_ENDED`` newest ended ones, older ones a page at a time (``/ui?older=N``), so the page
  does not grow with history (issue 21, finding 7); refreshed every 10 s by a
  ``<meta http-equiv="refresh">``;
- ``/ui/jobs/JOB``: one job, its report picture (``client/report.py``), its events, the tail of its
  workers' output (what ``spotrain logs`` shows, ``client/logs.py``) and, while it is live, a cancel
  button (a confirmation page, then a POST with the CSRF token; issue 24, item 5);
- ``/ui/login``: a form that takes the API token and keeps it in a cookie;
- ``/ui/link?t=SECRET``: a one-time login link (``spotrain dashboard`` prints it; ``login_links.py``):
  the secret is exchanged once for the same cookie; a used, expired or unknown one gets a page that
  says which, and how to get a new one.

Access is the API's token, as everywhere else (``api.RequestGuard`` checks it before any handler):
a browser presents it in the ``spotrain_token`` cookie the login form sets (HttpOnly, SameSite=Strict,
path ``/ui``), which is honoured on ``/ui`` paths only: it can never authorize an API call, so a
cross-site request cannot act with it. A browser without it is sent to the login form.

Every page says what the browser may do with it (issue 21, finding 14): a Content-Security-Policy
that allows no script at all, the page's one stylesheet by its hash, images and forms from this
origin only, and no framing (``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``). The login
form (and the logout form) carries a CSRF token, double-submitted: the form page sets it in a
``spotrain_csrf`` cookie (HttpOnly, SameSite=Strict) and in a hidden field; a POST whose field does
not equal its cookie is refused (403) before the token is even looked at. An empty token or API
token never matches (issue 21, finding 4).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import secrets
import time
from collections.abc import Callable, Mapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from autoscaler.client.logs import worker_outputs
from autoscaler.controller import Controller, job_summary
from autoscaler.errors import DomainError, JobNotFound
from autoscaler.jobs.domain import JobState
from autoscaler.server.listing import job_page
from autoscaler.server.login_links import LoginLinks, Redeemed
from autoscaler.state.store import ENDED_SELECTOR, LIVE_SELECTOR, Store

PREFIX = "/ui"
LOGIN_PATH = "/ui/login"
LINK_PATH = "/ui/link"
COOKIE = "spotrain_token"
CSRF_COOKIE = "spotrain_csrf"
CSRF_FIELD = "csrf"
# Ended jobs on the jobs page, the newest first; older ones a page of as many at a time.
RECENT_ENDED = 50
# The job page's worker output: rank 0 of the newest attempts, the end of each log.
OUTPUT_ATTEMPTS = 3
OUTPUT_TAIL_BYTES = 16_000

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1d3557; }
table { border-collapse: collapse; } th, td { padding: .3rem .8rem; border-bottom: 1px solid #ddd; text-align: left; }
pre { background: #f8f9fa; padding: .5rem; max-height: 30rem; overflow: auto; }
th { background: #f1faee; } .SUCCEEDED { color: #2a9d8f; } .FAILED, .FAILED_BUDGET, .FAILED_NO_RESOURCE { color: #d62828; }
.CANCELLED { color: #6c757d; } img { max-width: 100%; border: 1px solid #ddd; } code { background: #f1faee; }
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
# No script at all; the one inline stylesheet by its hash; pictures and forms from here; no framing.
CSP = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"content-security-policy": CSP, "x-frame-options": "DENY", "x-content-type-options": "nosniff",
                    "referrer-policy": "no-referrer"}


def _same_secret(given: str, expected: str) -> bool:
    """Constant-time equality of two secrets, never true when either is empty."""
    return bool(given) and bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def _cookie(cookie_header: str, name: str) -> str:
    try:
        jar = SimpleCookie(cookie_header)
    except CookieError:
        return ""
    morsel = jar.get(name)
    return morsel.value if morsel is not None else ""


def cookie_token_ok(cookie_header: str, token: str) -> bool:
    """Whether the ``Cookie`` header carries the API token in ``spotrain_token``."""
    return _same_secret(_cookie(cookie_header, COOKIE), token)


def secured(resp: Response) -> Response:
    """``resp`` with the dashboard's security headers (the module doc)."""
    resp.headers.update(SECURITY_HEADERS)
    return resp


def _page(title: str, body: str, *, refresh_s: int | None = None, status_code: int = 200,
          go_to: str | None = None) -> HTMLResponse:
    """A page; ``refresh_s``: reload it that often; ``go_to``: move on to that path at once."""
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    if go_to is not None:
        meta = f'<meta http-equiv="refresh" content="0; url={html.escape(go_to)}">'
    page = HTMLResponse(f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>{meta}'
                        f"<style>{_STYLE}</style></head><body>{body}</body></html>", status_code=status_code)
    secured(page)
    return page


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.4f}" if x < 10 else f"${x:,.2f}"


def _progress(j: Mapping[str, Any]) -> str:
    total, step = j.get("total_steps"), j.get("step") or 0
    return f"{step}/{total} ({100.0 * step / total:.0f}%)" if total else (str(step) if step else "-")


def _jobs_table(jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return "<p>No jobs yet: <code>spotrain submit job.yaml</code></p>"
    rows = []
    for j in reversed(jobs):
        jid = html.escape(j["job_id"])
        workers = ", ".join(sorted({f"{w['market']}" for w in j.get("workers", [])})) or "-"
        rows.append(
            f'<tr class="job"><td><a href="{PREFIX}/jobs/{quote(j["job_id"])}">{jid}</a></td>'
            f'<td class="{html.escape(j["state"])}">{html.escape(j["state"])}</td><td>{_progress(j)}</td>'
            f"<td>{len(j.get('workers', []))} ({html.escape(workers)})</td><td>{_money(j.get('cost_usd'))}</td>"
            f"<td>{_money(j.get('on_demand_cost_usd'))}</td><td>{j.get('preemptions', 0)}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("job", "state", "progress", "workers", "cost", "on-demand", "preemptions"))
    head = f"<tr>{head}</tr>"
    return f'<table id="jobs">{head}{"".join(rows)}</table>'


def _output_section(job_id: str) -> str:
    """Rank 0's output of the newest attempts, HTML-escaped (a worker prints anything)."""
    outputs = worker_outputs(job_id, rank=0, limit_bytes=OUTPUT_TAIL_BYTES, last_attempts=OUTPUT_ATTEMPTS)
    if not outputs:
        return '<h2>Worker output</h2><p id="output">No worker output yet.</p>'
    parts = "".join(f"<h3>attempt {a}, rank {r}</h3><pre>{html.escape(text)}</pre>" for a, r, text in outputs)
    return (f'<h2>Worker output</h2><div id="output">{parts}</div><p>The end of rank 0\'s log of the newest '
            f"{OUTPUT_ATTEMPTS} attempts; all of it: <code>spotrain logs {html.escape(job_id)}</code></p>")


def _cancel_button(j: Mapping[str, Any]) -> str:
    if JobState(j["state"]).terminal:
        return ""
    return (f'<form method="get" action="{PREFIX}/jobs/{quote(j["job_id"])}/cancel">'
            '<button type="submit" id="cancel">Cancel job</button></form>')


def _job_page(j: dict[str, Any], events: list[Any], *, note: str = "") -> str:
    jid = html.escape(j["job_id"])
    facts = [("state", j["state"]), ("reason", j.get("reason") or ""), ("progress", _progress(j)),
             ("cost", _money(j.get("cost_usd"))), ("on-demand counterfactual", _money(j.get("on_demand_cost_usd"))),
             ("preemptions", str(j.get("preemptions", 0))), ("checkpoints", j.get("checkpoint_uri", ""))]
    dl = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    ev = "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(e.ts))}</td><td>{html.escape(e.kind)}</td>"
        f"<td>{html.escape(e.from_state + ' -> ' + e.to_state if e.kind == 'state' else e.to_state)}</td>"
        f"<td>{html.escape(e.reason)}</td></tr>" for e in events)
    note_html = f'<p id="note">{html.escape(note)}</p>' if note else ""
    return (f'<p><a href="{PREFIX}">all jobs</a></p><h1>{jid}</h1>{note_html}<table id="facts">{dl}</table>'
            f"{_cancel_button(j)}"
            f'<h2>Report</h2><img id="report" alt="report of {jid}" src="{PREFIX}/jobs/{quote(j["job_id"])}/report.png">'
            f'<h2>Events</h2><table id="events"><tr><th>time</th><th>kind</th><th>state</th><th>reason</th></tr>{ev}</table>'
            f"{_output_section(j['job_id'])}")


def _csrf_field(csrf: str) -> str:
    return f'<input type="hidden" name="{CSRF_FIELD}" value="{html.escape(csrf)}">'


def _login_form(csrf: str, message: str = "") -> str:
    note = f'<p class="FAILED">{html.escape(message)}</p>' if message else ""
    return (f"<h1>spotrain</h1>{note}<form method=\"post\" action=\"{LOGIN_PATH}\">{_csrf_field(csrf)}"
            '<label>API token (<code>$SPOTRAIN_HOME/token</code>) <input type="password" name="token" id="token" autofocus>'
            '</label> <button type="submit" id="login">Log in</button></form>')


def _logout_form(csrf: str) -> str:
    return (f'<form method="post" action="{PREFIX}/logout">{_csrf_field(csrf)}'
            '<button type="submit" id="logout">Log out</button></form>')


def _with_csrf(page: Response, csrf: str) -> Response:
    """Set the CSRF cookie that the page's forms must send back."""
    page.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", path=PREFIX)
    return page


def _csrf_of(cookie_header: str) -> str:
    """The browser's CSRF token, or a fresh one for a browser without."""
    given = _cookie(cookie_header, CSRF_COOKIE)
    return given if 16 <= len(given) <= 128 and given.replace("-", "").replace("_", "").isalnum() else secrets.token_urlsafe(32)


def _csrf_ok(request: Request, form: Mapping[str, list[str]]) -> bool:
    """A state-changing POST's CSRF check: its form field equals its cookie (both non-empty)."""
    return _same_secret((form.get(CSRF_FIELD) or [""])[0], _cookie(request.headers.get("cookie", ""), CSRF_COOKIE))


def _csrf_refused() -> Response:
    return _page("spotrain", "<h1>spotrain</h1><p class=\"FAILED\">This form is stale or was not sent from this "
                 f'dashboard; <a href="{LOGIN_PATH}">log in again</a>.</p>', status_code=403)


def _older_link(older: int, more: bool) -> str:
    links = []
    if older > 0:
        links.append(f'<a href="{PREFIX}?older={max(0, older - RECENT_ENDED)}" id="newer">newer ended jobs</a>')
    if more:
        links.append(f'<a href="{PREFIX}?older={older + RECENT_ENDED}" id="older">older ended jobs</a>')
    return f"<p>{' | '.join(links)}</p>" if links else ""


def _link_refused(why: Redeemed) -> Response:
    """The page for a login link that cannot log in: says why, and how to get a new one."""
    what = {Redeemed.USED: "This login link was already used: each link logs in once.",
            Redeemed.EXPIRED: "This login link has expired: a link is valid for a short time only.",
            Redeemed.UNKNOWN: "This login link is not valid here (mistyped, or made by another controller "
                              "or before this controller restarted)."}[why]
    body = (f'<h1>spotrain</h1><p class="FAILED" id="link-refused">{html.escape(what)}</p>'
            "<p>Get a new one with <code>spotrain dashboard</code> (or <code>spotrain dashboard --open</code>), "
            f'or <a href="{LOGIN_PATH}">log in with the API token</a>.</p>')
    return _page("spotrain login link", body, status_code=410 if why is not Redeemed.UNKNOWN else 401)


def _logged_in(token: str, target: str, body: str) -> Response:
    """A page that sets the session cookie and moves on to ``target`` (a meta refresh, not a
    redirect: a navigation started on this page is same-site, so the SameSite=Strict cookie goes
    with it even when the link was opened from another site)."""
    page = _page("spotrain", body, go_to=target)
    page.set_cookie(COOKIE, token, httponly=True, samesite="strict", path=PREFIX)
    return page


def _add_job_routes(router: APIRouter, store: Store, cancel: Callable[[str], Any]) -> None:
    """One job's page, and its cancel: a confirmation page, then the POST (with the CSRF token)."""

    def job_of(ref: str) -> tuple[dict[str, Any], list[Any]]:
        with store.session() as s:
            job = store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            return job_summary(job, store.instances(s, job.job_id)).to_json_dict(), store.events(s, job.job_id)

    @router.get(PREFIX + "/jobs/{ref}")
    def one_job_page(request: Request, ref: str, note: str = "") -> Response:
        j, events = job_of(ref)
        csrf = _csrf_of(request.headers.get("cookie", ""))
        note = {"cancelled": "Cancel asked: the job is cancelling (its workers stop and its instances are released).",
                "ended": "The job had already ended: there is nothing to cancel."}.get(note, "")
        body = _job_page(j, events, note=note) + _logout_form(csrf)
        page = _page(f"spotrain {j['job_id']}", body, refresh_s=None if JobState(j["state"]).terminal else 10)
        return _with_csrf(page, csrf)

    @router.get(PREFIX + "/jobs/{ref}/cancel")
    def confirm_cancel(request: Request, ref: str) -> Response:
        """The cancel button's confirmation (no script may run here, so no ``confirm()``): a page
        whose one form POSTs the cancel with the CSRF token."""
        j, _ = job_of(ref)
        jid, path = html.escape(j["job_id"]), f"{PREFIX}/jobs/{quote(j['job_id'])}"
        csrf = _csrf_of(request.headers.get("cookie", ""))
        body = (f"<h1>Cancel {jid}?</h1><p>Its workers stop (after a checkpoint when they can) and its instances "
                f"are released; <code>spotrain resume {jid}</code> starts it again from its last checkpoint.</p>"
                f'<form method="post" action="{path}/cancel">{_csrf_field(csrf)}'
                f'<button type="submit" id="confirm-cancel">Yes, cancel {jid}</button></form>'
                f'<p><a href="{path}" id="keep">No, keep it running</a></p>')
        return _with_csrf(_page(f"spotrain cancel {j['job_id']}", body), csrf)

    @router.post(PREFIX + "/jobs/{ref}/cancel")
    async def cancel_job(request: Request, ref: str) -> Response:
        if not _csrf_ok(request, parse_qs((await request.body()).decode(errors="replace"))):
            return _csrf_refused()
        import anyio.to_thread

        j, _ = job_of(ref)
        try:
            await anyio.to_thread.run_sync(cancel, j["job_id"])
        except DomainError as exc:  # e.g. the job of a `spotrain run` that cannot be asked
            body = (f'<h1>spotrain</h1><p class="FAILED" id="cancel-refused">{html.escape(str(exc))}</p>'
                    f'<p><a href="{PREFIX}/jobs/{quote(j["job_id"])}">back to the job</a></p>')
            return _page("spotrain cancel", body, status_code=409)
        note = "ended" if JobState(j["state"]).terminal else "cancelled"
        return secured(RedirectResponse(f"{PREFIX}/jobs/{quote(j['job_id'])}?note={note}", status_code=303))


def dashboard_router(controller: Controller, token: str, report_png: Callable[[str], bytes], *,
                     cancel: Callable[[str], Any], links: LoginLinks) -> APIRouter:
    """The ``/ui`` routes. ``report_png(job_id)``: the job's picture (the API's own renderer);
    ``cancel(job_ref)``: the API's cancel (it asks a ``spotrain run`` that owns the job); ``links``:
    the one-time login links ``POST /v1/dashboard/links`` issues."""
    router = APIRouter(include_in_schema=False)
    store = controller.store

    @router.get(PREFIX)
    def jobs_page(request: Request, older: int = 0) -> Response:
        """Live jobs and a page of ended ones (``older``: ended jobs skipped, the newest first): a
        fixed number of queries however many jobs ended (``server/listing.py``)."""
        older = max(0, older)
        with store.session() as s:
            live = job_page(store, s, state=LIVE_SELECTOR, limit=1000)
            ended = job_page(store, s, state=ENDED_SELECTOR, limit=RECENT_ENDED, offset=older, order="newest")
        jobs = [j.to_json_dict() for j in live.jobs] + [j.to_json_dict() for j in reversed(ended.jobs)]
        jobs.sort(key=lambda j: j["submitted_at"])
        csrf = _csrf_of(request.headers.get("cookie", ""))
        body = (f"<h1>Jobs</h1>{_jobs_table(jobs)}{_older_link(older, ended.next_offset is not None)}"
                f"<p>{live.total} live, {ended.total} ended</p>{_logout_form(csrf)}")
        return _with_csrf(_page("spotrain jobs", body, refresh_s=10 if live.jobs else None), csrf)

    _add_job_routes(router, store, cancel)

    @router.get(LINK_PATH)
    def login_link(t: str = "") -> Response:
        """A one-time login link: its secret, exchanged once for the session cookie."""
        outcome = links.redeem(t)
        if outcome is not Redeemed.OK:
            return _link_refused(outcome)
        return _logged_in(token, PREFIX, f'<h1>spotrain</h1><p id="logged-in">Logged in; <a href="{PREFIX}">'
                                         "open the dashboard</a>.</p>")

    @router.get(PREFIX + "/jobs/{ref}/report.png")
    def job_report(ref: str) -> Response:
        return secured(Response(report_png(ref), media_type="image/png", headers={"cache-control": "no-store"}))

    @router.get(LOGIN_PATH)
    def login_form(request: Request) -> Response:
        csrf = _csrf_of(request.headers.get("cookie", ""))
        return _with_csrf(_page("spotrain login", _login_form(csrf)), csrf)

    @router.post(LOGIN_PATH)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace"))
        if not _csrf_ok(request, form):
            return _csrf_refused()
        given = (form.get("token") or [""])[0].strip()
        if not _same_secret(given, token):
            csrf = _csrf_of(request.headers.get("cookie", ""))
            page = _page("spotrain login", _login_form(csrf, "That is not this controller's token."), status_code=401)
            return _with_csrf(page, csrf)
        resp = secured(RedirectResponse(PREFIX, status_code=303))
        resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path=PREFIX)
        return resp

    @router.post(PREFIX + "/logout")
    async def logout(request: Request) -> Response:
        if not _csrf_ok(request, parse_qs((await request.body()).decode(errors="replace"))):
            return _csrf_refused()
        resp = secured(RedirectResponse(LOGIN_PATH, status_code=303))
        resp.delete_cookie(COOKIE, path=PREFIX)
        return resp

    return router
