"""The only module that imports the Google SDK: everything else receives clients through a factory.

``google-cloud-compute`` costs about a second to import and is an extra of the package (a controller
for the local cloud needs no cloud SDK), so ``import cloud_providers.gcp`` must not pay for it
(SkyPilot's ``adaptors/gcp.py`` lesson; the twin of ``aws/_boto.py``).

A *client factory* (``kind -> client``, kinds in ``KINDS``) is the seam tests use: they build the real
``compute_v1`` clients on a REST transport pointed at a loopback fake (``tests/gcp/fake_compute.py``)
with anonymous credentials; no method of the Google clients is patched. The same seam takes an
``endpoint`` (``SPOTRAIN_GCP_ENDPOINT``, e.g. ``http://127.0.0.1:PORT``), which is how a controller
started as a subprocess reaches the fake.

Credentials come from the standard Google auth chain (``google.auth.default()``: the
``GOOGLE_APPLICATION_CREDENTIALS`` key file, ``gcloud auth application-default login``, or the
attached service account on GCE), checked once when the provider is built.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from ..errors import CredentialsError, SdkMissing

# A compute_v1 client of one kind. Typed as Any: the generated clients are not worth mirroring here.
ClientFactory = Callable[[str], Any]

INSTANCES = "instances"
ZONE_OPERATIONS = "zone_operations"
MACHINE_TYPES = "machine_types"
ACCELERATOR_TYPES = "accelerator_types"
KINDS = (INSTANCES, ZONE_OPERATIONS, MACHINE_TYPES, ACCELERATOR_TYPES)
# kind -> (client class, package of its REST transport, transport class), all in compute_v1.
_CLASSES = {
    INSTANCES: ("InstancesClient", "instances", "InstancesRestTransport"),
    ZONE_OPERATIONS: ("ZoneOperationsClient", "zone_operations", "ZoneOperationsRestTransport"),
    MACHINE_TYPES: ("MachineTypesClient", "machine_types", "MachineTypesRestTransport"),
    ACCELERATOR_TYPES: ("AcceleratorTypesClient", "accelerator_types", "AcceleratorTypesRestTransport"),
}

INSTALL_HINT = "the GCP provider needs google-cloud-compute, which is not installed: pip install 'spotrain[gcp]'"
CREDENTIALS_HINT = (
    "GCP credentials not found: run `gcloud auth application-default login`, set "
    "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run on GCE with a service account"
)
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


def _sdk_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SdkMissing(INSTALL_HINT, cloud="gcp") from exc


def require_sdk() -> None:
    """Raise ``SdkMissing`` (one line naming the extra) unless google-cloud-compute can be imported."""
    _sdk_module("google.cloud.compute_v1")


def compute() -> Any:
    """The ``google.cloud.compute_v1`` module (request and resource types)."""
    return _sdk_module("google.cloud.compute_v1")


def api_exceptions() -> Any:
    """``google.api_core.exceptions``: the HTTP error tree the clients raise."""
    return _sdk_module("google.api_core.exceptions")


def auth_exceptions() -> Any:
    """``google.auth.exceptions``: missing, unrefreshable or otherwise broken credentials."""
    return _sdk_module("google.auth.exceptions")


def sdk_errors() -> tuple[type[BaseException], ...]:
    """Every exception type a call through the clients may raise on purpose (nothing broader).

    The REST transport talks through ``requests``, whose connection errors are not wrapped by
    api_core, so they are listed too.
    """
    api = api_exceptions()
    auth = auth_exceptions()
    requests_exc = _sdk_module("requests.exceptions")
    return (api.GoogleAPICallError, api.RetryError, auth.GoogleAuthError, requests_exc.RequestException)


def default_credentials() -> tuple[Any, str | None]:
    """``(credentials, project or None)`` from the standard chain; ``CredentialsError`` in one line."""
    auth = _sdk_module("google.auth")
    try:
        credentials, project = auth.default(scopes=list(SCOPES))
    except auth_exceptions().DefaultCredentialsError as exc:
        raise CredentialsError(CREDENTIALS_HINT, cloud="gcp") from exc
    return credentials, project


def anonymous_credentials() -> Any:
    return _sdk_module("google.auth.credentials").AnonymousCredentials()


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """``"http://127.0.0.1:8080"`` -> ``("http", "127.0.0.1:8080")`` (ValueError if it is not a URL)."""
    url = urlparse(endpoint)
    if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
        raise ValueError(f"GCP endpoint {endpoint!r} must be http(s)://host[:port] with no path")
    return url.scheme, url.netloc


def make_client_factory(*, credentials: Any | None = None, endpoint: str | None = None) -> ClientFactory:
    """A thread-safe, caching ``kind -> compute_v1 client`` factory.

    With ``endpoint``, each client gets a REST transport on that host and scheme (a plain-HTTP
    endpoint is a loopback stand-in, so it gets anonymous credentials unless others are given).
    Without, the clients use compute.googleapis.com and ``credentials`` (default: the auth chain).
    The clients' own retries are not used: the provider passes ``retry=None`` and retries itself,
    bounded, with full jitter (``errors.call``).
    """
    c = compute()
    where = split_endpoint(endpoint) if endpoint else None
    if where is not None and where[0] == "http" and credentials is None:
        credentials = anonymous_credentials()
    lock = threading.Lock()
    clients: dict[str, Any] = {}

    def factory(kind: str) -> Any:
        if kind not in _CLASSES:
            raise ValueError(f"unknown compute client kind {kind!r} (one of {', '.join(KINDS)})")
        with lock:
            client = clients.get(kind)
            if client is None:
                client_name, package, transport_name = _CLASSES[kind]
                client_cls = getattr(c, client_name)
                if where is None:
                    client = client_cls(credentials=credentials)
                else:
                    transports = importlib.import_module(f"google.cloud.compute_v1.services.{package}.transports")
                    transport = getattr(transports, transport_name)(
                        host=where[1], url_scheme=where[0], credentials=credentials
                    )
                    client = client_cls(transport=transport)
                clients[kind] = client
            return client

    return factory
