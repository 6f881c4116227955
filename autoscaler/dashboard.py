"""The controller's dashboard at ``/ui``: server-rendered HTML, no JavaScript and no build step.

- ``/ui``: the jobs table (state, progress, workers, cost, preemptions), refreshed every 10 s by a
  ``<meta http-equiv="refresh">``;
- ``/ui/jobs/JOB``: one job, its report picture (``report.py``) and its events;
- ``/ui/login``: a form that takes the API token and keeps it in a cookie.

Access is the API's token, as everywhere else (``api.RequestGuard`` checks it before any handler):
a browser presents it in the ``spotrain_token`` cookie the login form sets (HttpOnly, SameSite=Strict,
path ``/ui``), which is honoured on ``/ui`` paths only: it can never authorize an API call, so a
cross-site request cannot act with it. A browser without it is sent to the login form.
"""

from __future__ import annotations

import hmac
import html
import time
from collections.abc import Callable, Mapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from .controller import Controller, job_summary
from .domain import JobState
from .errors import JobNotFound

PREFIX = "/ui"
LOGIN_PATH = "/ui/login"
COOKIE = "spotrain_token"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1d3557; }
table { border-collapse: collapse; } th, td { padding: .3rem .8rem; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f1faee; } .SUCCEEDED { color: #2a9d8f; } .FAILED, .FAILED_BUDGET, .FAILED_NO_RESOURCE { color: #d62828; }
.CANCELLED { color: #6c757d; } img { max-width: 100%; border: 1px solid #ddd; } code { background: #f1faee; }
"""


def cookie_token_ok(cookie_header: str, token: str) -> bool:
    """Whether the ``Cookie`` header carries the API token in ``spotrain_token``."""
    try:
        jar = SimpleCookie(cookie_header)
    except CookieError:
        return False
    morsel = jar.get(COOKIE)
    return morsel is not None and hmac.compare_digest(morsel.value.encode(), token.encode())


def _page(title: str, body: str, *, refresh_s: int | None = None) -> HTMLResponse:
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return HTMLResponse(f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>{meta}'
                        f"<style>{_STYLE}</style></head><body>{body}</body></html>")


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


def _job_page(j: dict[str, Any], events: list[Any]) -> str:
    jid = html.escape(j["job_id"])
    facts = [("state", j["state"]), ("reason", j.get("reason") or ""), ("progress", _progress(j)),
             ("cost", _money(j.get("cost_usd"))), ("on-demand counterfactual", _money(j.get("on_demand_cost_usd"))),
             ("preemptions", str(j.get("preemptions", 0))), ("checkpoints", j.get("checkpoint_uri", ""))]
    dl = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    ev = "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(e.ts))}</td><td>{html.escape(e.kind)}</td>"
        f"<td>{html.escape(e.from_state + ' -> ' + e.to_state if e.kind == 'state' else e.to_state)}</td>"
        f"<td>{html.escape(e.reason)}</td></tr>" for e in events)
    return (f'<p><a href="{PREFIX}">all jobs</a></p><h1>{jid}</h1><table>{dl}</table>'
            f'<h2>Report</h2><img id="report" alt="report of {jid}" src="{PREFIX}/jobs/{quote(j["job_id"])}/report.png">'
            f'<h2>Events</h2><table id="events"><tr><th>time</th><th>kind</th><th>state</th><th>reason</th></tr>{ev}</table>')


def _login_form(message: str = "") -> str:
    note = f'<p class="FAILED">{html.escape(message)}</p>' if message else ""
    return (f"<h1>spotrain</h1>{note}<form method=\"post\" action=\"{LOGIN_PATH}\">"
            '<label>API token (<code>$SPOTRAIN_HOME/token</code>) <input type="password" name="token" id="token" autofocus>'
            '</label> <button type="submit" id="login">Log in</button></form>')


def dashboard_router(controller: Controller, token: str, report_png: Callable[[str], bytes]) -> APIRouter:
    """The ``/ui`` routes. ``report_png(job_id)``: the job's picture (the API's own renderer)."""
    router = APIRouter(include_in_schema=False)
    store = controller.store

    @router.get(PREFIX)
    def jobs_page() -> HTMLResponse:
        with store.session() as s:
            jobs = [job_summary(j, store.instances(s, j.job_id)).to_json_dict() for j in store.jobs(s)]
        live = any(not JobState(j["state"]).terminal for j in jobs)
        return _page("spotrain jobs", f"<h1>Jobs</h1>{_jobs_table(jobs)}", refresh_s=10 if live else None)

    @router.get(PREFIX + "/jobs/{ref}")
    def job_page(ref: str) -> HTMLResponse:
        with store.session() as s:
            job = store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            j = job_summary(job, store.instances(s, job.job_id)).to_json_dict()
            events = store.events(s, job.job_id)
        return _page(f"spotrain {j['job_id']}", _job_page(j, events),
                     refresh_s=None if JobState(j["state"]).terminal else 10)

    @router.get(PREFIX + "/jobs/{ref}/report.png")
    def job_report(ref: str) -> Response:
        return Response(report_png(ref), media_type="image/png", headers={"cache-control": "no-store"})

    @router.get(LOGIN_PATH)
    def login_form() -> HTMLResponse:
        return _page("spotrain login", _login_form())

    @router.post(LOGIN_PATH)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace"))
        given = (form.get("token") or [""])[0].strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            page = _page("spotrain login", _login_form("That is not this controller's token."))
            page.status_code = 401
            return page
        resp = RedirectResponse(PREFIX, status_code=303)
        resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path=PREFIX)
        return resp

    @router.get(PREFIX + "/logout")
    def logout() -> Response:
        resp = RedirectResponse(LOGIN_PATH, status_code=303)
        resp.delete_cookie(COOKIE, path=PREFIX)
        return resp

    return router
