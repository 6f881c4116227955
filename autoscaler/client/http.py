"""HTTP client of the controller API, used by the CLI.

Answers are parsed into the models of ``server/schemas.py``. A refusal becomes the ``SpotrainError`` the
controller raised: the API's ``ErrorBody`` names its type, and the types in ``_BY_NAME`` are rebuilt
as such (``JobNameTaken``, ``NotOwner``, ``JobNotFound``, ...); any other refusal is an ``ApiError``
with its status. A 401 is always ``AuthError`` and a 404 without a known type ``JobNotFound``.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from autoscaler.errors import ApiError, AuthError, Conflict, ControllerUnreachable, DomainError, JobNotFound, SpotrainError
from autoscaler.home import live_controller_info, no_controller_message, read_token
from autoscaler.jobs.domain import JobNameTaken, NotOwner
from autoscaler.server.schemas import ErrorBody, Health, JobEvent, JobEvents, JobList, JobSummary

PAGE_LIMIT = 1000  # the API's largest page (``listing.MAX_LIMIT``; not imported: it brings SQLAlchemy)
M = TypeVar("M", bound=BaseModel)

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
        self._http = http or httpx.Client(base_url=self.url, timeout=timeout_s)
        if tok:
            self._http.headers["Authorization"] = f"Bearer {tok}"

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError:
            raise ControllerUnreachable(
                f"cannot reach the controller at {self.url} (start it with `spotrain controller start`)"
            ) from None
        if r.status_code >= 400:
            raise self._refusal(r)
        return r

    def _refusal(self, r: httpx.Response) -> SpotrainError:
        if r.status_code == 401:
            return AuthError(f"the controller at {self.url} refused the API token (see $SPOTRAIN_HOME/token)")
        body = _error_body(r)
        cls = _BY_NAME.get(body.error)
        if cls is not None:
            return cls(body.detail)
        if r.status_code == 404:
            return JobNotFound(body.detail)
        return ApiError(body.detail, status=r.status_code)

    def _parse(self, model: type[M], r: httpx.Response) -> M:
        try:
            return model.model_validate_json(r.content)
        except ValidationError as exc:
            raise ApiError(f"the controller at {self.url} sent an answer this client cannot read: "
                           f"{exc.errors()[0].get('msg', exc)}", status=r.status_code) from None

    def healthz(self) -> Health:
        return self._parse(Health, self._call("GET", "/healthz"))

    def submit(self, spec: dict[str, Any], workdir: str) -> JobSummary:
        return self._parse(JobSummary, self._call("POST", "/v1/jobs", json={"spec": spec, "workdir": workdir}))

    def jobs_page(self, *, state: str = "live", limit: int = PAGE_LIMIT, offset: int = 0,
                  order: str = "oldest") -> tuple[list[JobSummary], int | None]:
        """One page of ``GET /v1/jobs`` (``server/listing.py``) and the offset of the next (None: the last)."""
        r = self._call("GET", "/v1/jobs", params={"state": state, "limit": limit, "offset": offset, "order": order})
        nxt = r.headers.get("x-next-offset")
        return self._parse(JobList, r).root, int(nxt) if nxt and nxt.isdigit() and int(nxt) > offset else None

    def jobs(self, state: str = "all") -> list[JobSummary]:
        """Every job ``state`` selects (``all``, ``live``, ``ended`` or a list of states), oldest
        first, read a page at a time."""
        out: list[JobSummary] = []
        offset: int | None = 0
        while offset is not None:
            page, offset = self.jobs_page(state=state, offset=offset)
            out.extend(page)
        return out

    def recent_jobs(self, ended: int) -> list[JobSummary]:
        """The live jobs and the ``ended`` newest ended ones, oldest first (``spotrain status``)."""
        live = self.jobs("live")
        done = self.jobs_page(state="ended", limit=ended, order="newest")[0] if ended > 0 else []
        return sorted(live + done, key=lambda j: (j.submitted_at, j.job_id))

    def job(self, ref: str) -> JobSummary:
        return self._parse(JobSummary, self._call("GET", f"/v1/jobs/{ref}"))

    def events(self, ref: str) -> list[JobEvent]:
        return self._parse(JobEvents, self._call("GET", f"/v1/jobs/{ref}/events")).root

    def logs(self, ref: str, rank: int | None = None) -> str:
        params = {"rank": rank} if rank is not None else {}
        return self._call("GET", f"/v1/jobs/{ref}/logs", params=params).text

    def cancel(self, ref: str) -> JobSummary:
        return self._parse(JobSummary, self._call("POST", f"/v1/jobs/{ref}/cancel"))

    def resume(self, ref: str) -> JobSummary:
        return self._parse(JobSummary, self._call("POST", f"/v1/jobs/{ref}/resume"))

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


def _error_body(r: httpx.Response) -> ErrorBody:
    """The refusal's ``ErrorBody``; FastAPI's own bodies (``{"detail": ...}``, a list for a request it
    could not validate) and bodies that are no JSON at all are read as well."""
    try:
        data = r.json()
    except ValueError:
        data = None
    d = data.get("detail") if isinstance(data, dict) else None
    if isinstance(d, list) and d:
        d = d[0].get("msg") if isinstance(d[0], dict) else d[0]
    error = data.get("error") if isinstance(data, dict) else None
    return ErrorBody(detail=str(d or f"HTTP {r.status_code}"), error=error if isinstance(error, str) else "HTTPException")
