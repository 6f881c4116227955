"""HTTP client of the controller API, used by the CLI.

Answers are parsed into the models of ``server/schemas.py``. A refusal becomes the ``SpotrainError`` the
controller raised: the API's ``ErrorBody`` names its type, and the types in ``_BY_NAME`` are rebuilt
as such (``JobNameTaken``, ``NotOwner``, ``JobNotFound``, ...); any other refusal is an ``ApiError``
with its status. A 401 is always ``AuthError`` and a 404 without a known type ``JobNotFound``; no
answer at all is ``ControllerUnreachable``.

Start-up cost is part of every CLI command, so nothing heavy is imported at module level (issue 24):
a plain ``http://`` URL is spoken to with the standard library (``client/plainhttp.py``), httpx is
imported only for ``https://`` or a client handed in (tests pass FastAPI's TestClient), and pydantic
(``server/schemas.py``) only when an answer is parsed into a model. ``spotrain status`` reads the
``*_json`` methods, which return the API's JSON as it came and import neither.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

from autoscaler.errors import ApiError, AuthError, Conflict, ControllerUnreachable, DomainError, JobNotFound, SpotrainError
from autoscaler.home import live_controller_info, no_controller_message, read_token
from autoscaler.jobs.domain import JobNameTaken, JobState, NotOwner

if TYPE_CHECKING:
    from typing import Protocol

    import httpx
    from pydantic import BaseModel

    from autoscaler.server.schemas import ErrorBody, Health, JobEvent, JobSummary

    from .plainhttp import PlainHttp

    class _Response(Protocol):
        """What the client reads of an answer: ``httpx.Response`` and ``plainhttp.PlainResponse`` both
        have it (a type only: a Protocol class costs milliseconds to build at import)."""

        @property
        def status_code(self) -> int: ...
        @property
        def headers(self) -> Any: ...
        @property
        def content(self) -> bytes: ...
        @property
        def text(self) -> str: ...
        def json(self) -> Any: ...


PAGE_LIMIT = 1000  # the API's largest page (``listing.MAX_LIMIT``; not imported: it brings SQLAlchemy)
M = TypeVar("M", bound="BaseModel")

# The controller's error types the client rebuilds from an ``ErrorBody`` (each takes a message).
_BY_NAME: dict[str, type[SpotrainError]] = {
    cls.__name__: cls for cls in (JobNotFound, Conflict, JobNameTaken, NotOwner, DomainError)
}


def controller_url() -> str:
    """The controller this home talks to: ``SPOTRAIN_CONTROLLER_URL`` if set, else the live one
    recorded in ``controller.json``. There is no default port: with neither, ``ControllerUnreachable``
    says so before anything is contacted (a port such as 8470 may be another user's controller, which
    would be handed this home's token; issue 24)."""
    env = os.environ.get("SPOTRAIN_CONTROLLER_URL")
    if env:
        return env.rstrip("/")
    info = live_controller_info()
    if info is None:
        raise ControllerUnreachable(no_controller_message())
    return str(info["url"]).rstrip("/")


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout_s: float = 10.0,
                 http: httpx.Client | None = None) -> None:
        """``url``: the controller's (default ``controller_url()``, which raises ``ControllerUnreachable``
        when this home has none); ``http``: a client to use instead of a new one (tests pass FastAPI's TestClient)."""
        self.url = url or (str(http.base_url).rstrip("/") if http is not None else controller_url())
        tok = token if token is not None else (os.environ.get("SPOTRAIN_TOKEN") or read_token())
        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
        self._plain: PlainHttp | None = None
        self._http = http
        if http is None and self.url.lower().startswith("http://"):
            from .plainhttp import PlainHttp

            self._plain = PlainHttp(self.url, timeout_s=timeout_s)
            self._plain.headers.update(headers)
        else:
            if self._http is None:
                import httpx

                self._http = httpx.Client(base_url=self.url, timeout=timeout_s)
            self._http.headers.update(headers)

    def _call(self, method: str, path: str, **kw: Any) -> _Response:
        r: _Response
        if self._plain is not None:
            from .plainhttp import TransportFailed

            try:
                r = self._plain.request(method, path, **kw)
            except TransportFailed:
                raise self._unreachable() from None
        else:
            import httpx

            assert self._http is not None
            try:
                r = self._http.request(method, path, **kw)
            except httpx.TransportError:
                raise self._unreachable() from None
        if r.status_code >= 400:
            raise self._refusal(r)
        return r

    def _unreachable(self) -> ControllerUnreachable:
        return ControllerUnreachable(
            f"cannot reach the controller at {self.url} (start it with `spotrain controller start`)")

    def _refusal(self, r: _Response) -> SpotrainError:
        if r.status_code == 401:
            return AuthError(f"the controller at {self.url} refused the API token (see $SPOTRAIN_HOME/token)")
        body = _error_body(r)
        cls = _BY_NAME.get(body.error)
        if cls is not None:
            return cls(body.detail)
        if r.status_code == 404:
            return JobNotFound(body.detail)
        return ApiError(body.detail, status=r.status_code)

    def _parse(self, model: type[M], r: _Response) -> M:
        from pydantic import ValidationError

        try:
            return model.model_validate_json(r.content)
        except ValidationError as exc:
            raise self._unreadable(exc.errors()[0].get("msg", exc), r.status_code) from None

    def _unreadable(self, why: object, status: int) -> ApiError:
        return ApiError(f"the controller at {self.url} sent an answer this client cannot read: {why}", status=status)

    def _job_json(self, value: Any, status: int) -> dict[str, Any]:
        """``value`` if it reads as a job of the API (an object with a string ``job_id`` and ``state``:
        what the CLI's renderer needs), else the same ``ApiError`` ``_parse`` raises."""
        if not isinstance(value, dict):
            raise self._unreadable("a job is not a JSON object", status)
        for key in ("job_id", "state"):
            if not isinstance(value.get(key), str):
                raise self._unreadable(f"a job has no string {key!r}", status)
        return value

    def _json(self, r: _Response) -> Any:
        try:
            return r.json()
        except ValueError:
            raise self._unreadable("not JSON", r.status_code) from None

    def _summaries(self, jobs: list[dict[str, Any]]) -> list[JobSummary]:
        from pydantic import ValidationError

        from autoscaler.server.schemas import JobSummary

        try:
            return [JobSummary.model_validate(j) for j in jobs]
        except ValidationError as exc:
            raise self._unreadable(exc.errors()[0].get("msg", exc), 200) from None

    def healthz(self) -> Health:
        from autoscaler.server.schemas import Health

        return self._parse(Health, self._call("GET", "/healthz"))

    def submit(self, spec: dict[str, Any], workdir: str) -> JobSummary:
        from autoscaler.server.schemas import JobSummary

        return self._parse(JobSummary, self._call("POST", "/v1/jobs", json={"spec": spec, "workdir": workdir}))

    def jobs_page_json(self, *, state: str = "live", limit: int = PAGE_LIMIT, offset: int = 0,
                       order: str = "oldest") -> tuple[list[dict[str, Any]], int | None]:
        """One page of ``GET /v1/jobs`` (``server/listing.py``) as the API's JSON, and the offset of
        the next (None: the last)."""
        r = self._call("GET", "/v1/jobs", params={"state": state, "limit": limit, "offset": offset, "order": order})
        nxt = r.headers.get("x-next-offset")
        data = self._json(r)
        if not isinstance(data, list):
            raise self._unreadable("the job list is not a JSON array", r.status_code)
        page = [self._job_json(j, r.status_code) for j in data]
        return page, int(nxt) if nxt and nxt.isdigit() and int(nxt) > offset else None

    def jobs_page(self, *, state: str = "live", limit: int = PAGE_LIMIT, offset: int = 0,
                  order: str = "oldest") -> tuple[list[JobSummary], int | None]:
        """One page of ``GET /v1/jobs`` (``server/listing.py``) and the offset of the next (None: the last)."""
        page, nxt = self.jobs_page_json(state=state, limit=limit, offset=offset, order=order)
        return self._summaries(page), nxt

    def jobs_json(self, state: str = "all") -> list[dict[str, Any]]:
        """Every job ``state`` selects (``all``, ``live``, ``ended`` or a list of states), oldest
        first, read a page at a time; the API's JSON."""
        out: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page, offset = self.jobs_page_json(state=state, offset=offset)
            out.extend(page)
        return out

    def jobs(self, state: str = "all") -> list[JobSummary]:
        """``jobs_json`` parsed."""
        return self._summaries(self.jobs_json(state))

    def recent_jobs_json(self, ended: int, states: list[str] | None = None) -> list[dict[str, Any]]:
        """The live jobs and the ``ended`` newest ended ones, oldest first (``spotrain status``); the
        API's JSON. ``states``: only jobs in these (a job state's names; ``status --state``). Over
        plain HTTP the two reads go out at once on two connections: a loaded controller took ~50 ms
        for each, most of what ``status`` waited for (issue 24)."""
        live_sel, ended_sel = live_and_ended_selectors(states)
        done: list[dict[str, Any]] = []
        if ended_sel is None:
            ended = 0
        if ended > 0 and live_sel is not None and self._plain is not None:
            import copy
            import threading

            twin = copy.copy(self)
            twin._plain = self._plain.twin()
            failed: list[BaseException] = []

            def read_ended() -> None:
                try:
                    done.extend(twin.jobs_page_json(state=str(ended_sel), limit=ended, order="newest")[0])
                except BaseException as exc:  # raised below, in the caller's thread
                    failed.append(exc)

            reader = threading.Thread(target=read_ended, name="spotrain-ended-jobs", daemon=True)
            reader.start()
            try:
                live = self.jobs_json(live_sel)
            finally:
                reader.join()
                twin._plain.close()
            if failed:
                raise failed[0]
        else:
            live = self.jobs_json(live_sel) if live_sel is not None else []
            done = (self.jobs_page_json(state=str(ended_sel), limit=ended, order="newest")[0]
                    if ended > 0 else [])
        return sorted(live + done, key=lambda j: (_number(j.get("submitted_at")), j["job_id"]))

    def recent_jobs(self, ended: int) -> list[JobSummary]:
        """``recent_jobs_json`` parsed."""
        return self._summaries(self.recent_jobs_json(ended))

    def job_json(self, ref: str) -> dict[str, Any]:
        """``job`` as the API's JSON."""
        r = self._call("GET", f"/v1/jobs/{ref}")
        return self._job_json(self._json(r), r.status_code)

    def job(self, ref: str) -> JobSummary:
        from autoscaler.server.schemas import JobSummary

        return self._parse(JobSummary, self._call("GET", f"/v1/jobs/{ref}"))

    def events(self, ref: str) -> list[JobEvent]:
        from autoscaler.server.schemas import JobEvents

        return self._parse(JobEvents, self._call("GET", f"/v1/jobs/{ref}/events")).root

    def logs(self, ref: str, rank: int | None = None) -> str:
        params = {"rank": rank} if rank is not None else {}
        return self._call("GET", f"/v1/jobs/{ref}/logs", params=params).text

    def cancel(self, ref: str) -> JobSummary:
        from autoscaler.server.schemas import JobSummary

        return self._parse(JobSummary, self._call("POST", f"/v1/jobs/{ref}/cancel"))

    def resume(self, ref: str) -> JobSummary:
        from autoscaler.server.schemas import JobSummary

        return self._parse(JobSummary, self._call("POST", f"/v1/jobs/{ref}/resume"))

    def login_link(self) -> tuple[str, float]:
        """A one-time login link to this controller's dashboard (its full URL) and the seconds it
        stays valid (``POST /v1/dashboard/links``)."""
        r = self._call("POST", "/v1/dashboard/links")
        data = self._json(r)
        path = data.get("path") if isinstance(data, dict) else None
        ttl = data.get("expires_in_s") if isinstance(data, dict) else None
        if not isinstance(path, str) or not path.startswith("/") or not isinstance(ttl, (int, float)):
            raise self._unreadable("the login link has no path or lifetime", r.status_code)
        return self.url + path, float(ttl)

    def spec(self, ref: str) -> dict[str, Any]:
        data = self._call("GET", f"/v1/jobs/{ref}/spec").json()
        return data if isinstance(data, dict) else {}

    def report_png(self, ref: str) -> bytes:
        return self._call("GET", f"/v1/jobs/{ref}/report.png").content

    def output(self, ref: str, *, attempt: int, rank: int = 0, offset: int = 0) -> tuple[bytes, int]:
        """Output of worker ``rank`` of gang ``attempt`` from byte ``offset`` of its log, at most
        ``logs.CHUNK_BYTES``: (bytes, the offset to ask from next)."""
        r = self._call("GET", f"/v1/jobs/{ref}/output", params={"attempt": attempt, "rank": rank, "offset": offset})
        return r.content, int(r.headers.get("x-next-offset", offset + len(r.content)))


def live_and_ended_selectors(states: list[str] | None) -> tuple[str | None, str | None]:
    """The API's ``state`` selectors for the live and the ended part of ``states`` (None: all of
    either); None for a part none of ``states`` falls in."""
    if states is None:
        return "live", "ended"
    live = [s for s in states if not JobState(s).terminal]
    ended = [s for s in states if JobState(s).terminal]
    return ",".join(live) or None, ",".join(ended) or None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _error_body(r: _Response) -> ErrorBody:
    """The refusal's ``ErrorBody``; FastAPI's own bodies (``{"detail": ...}``, a list for a request it
    could not validate) and bodies that are no JSON at all are read as well."""
    from autoscaler.server.schemas import ErrorBody

    try:
        data = r.json()
    except ValueError:
        data = None
    d = data.get("detail") if isinstance(data, dict) else None
    if isinstance(d, list) and d:
        d = d[0].get("msg") if isinstance(d[0], dict) else d[0]
    error = data.get("error") if isinstance(data, dict) else None
    return ErrorBody(detail=str(d or f"HTTP {r.status_code}"), error=error if isinstance(error, str) else "HTTPException")
