"""HTTP client of the controller API, used by the CLI. Errors become one-line ``SpotrainError``s."""

from __future__ import annotations

import os
from typing import Any

import httpx

from .errors import ApiError, AuthError, ControllerUnreachable, JobNotFound
from .home import read_controller_info, read_token

DEFAULT_URL = "http://127.0.0.1:8470"


def controller_url() -> str:
    env = os.environ.get("SPOTRAIN_CONTROLLER_URL")
    if env:
        return env.rstrip("/")
    info = read_controller_info()
    if info and isinstance(info.get("url"), str):
        return str(info["url"]).rstrip("/")
    return DEFAULT_URL


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout_s: float = 10.0) -> None:
        self.url = url or controller_url()
        tok = token if token is not None else (os.environ.get("SPOTRAIN_TOKEN") or read_token())
        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError:
            raise ControllerUnreachable(
                f"cannot reach the controller at {self.url} (start it with `spotrain controller start`)"
            ) from None
        if r.status_code == 401:
            raise AuthError(f"the controller at {self.url} refused the API token (see $SPOTRAIN_HOME/token)")
        if r.status_code == 404:
            raise JobNotFound(_detail(r))
        if r.status_code >= 400:
            raise ApiError(_detail(r), status=r.status_code)
        return r

    def healthz(self) -> dict[str, Any]:
        return dict(self._call("GET", "/healthz").json())

    def submit(self, spec: dict[str, Any], workdir: str) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/jobs", json={"spec": spec, "workdir": workdir}).json())

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/jobs").json())

    def job(self, ref: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/jobs/{ref}").json())

    def logs(self, ref: str, rank: int | None = None) -> str:
        params = {"rank": rank} if rank is not None else {}
        return self._call("GET", f"/v1/jobs/{ref}/logs", params=params).text

    def cancel(self, ref: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/jobs/{ref}/cancel").json())


def _detail(r: httpx.Response) -> str:
    try:
        d = r.json().get("detail")
    except ValueError:
        d = None
    if isinstance(d, list) and d:
        d = d[0].get("msg") if isinstance(d[0], dict) else d[0]
    return str(d or f"HTTP {r.status_code}")
