"""The agent's TLS to the controller: the controller's own certificate, pinned from the user data.

The controller serves the agents' endpoints over HTTPS with a self-signed certificate it made once
(``autoscaler/remote/tls.py``) and puts that certificate, PEM, in every instance's agent config
(``controller_cert_pem``). The agent trusts that one certificate and nothing else: it is the only CA of
its SSL context (no system store), so a server showing any other certificate, a public CA's
included, fails the handshake. Host names are not checked: the pin is stronger than a name, and the
address the agents reach the controller on (``--advertise-url``) may be an IP or change between
controller restarts while the certificate stays. Plain ``http://`` is refused.
"""

from __future__ import annotations

import hashlib
import ssl
from urllib.parse import urlparse

PEM_BEGIN = "-----BEGIN CERTIFICATE-----"


def fingerprint(pem: str) -> str:
    """SHA-256 of the certificate's DER bytes, hex (what ``openssl x509 -fingerprint -sha256`` shows)."""
    try:
        der = ssl.PEM_cert_to_DER_cert(pem.strip())
    except ValueError as exc:
        raise ValueError(f"controller_cert_pem: not a PEM certificate ({exc})") from None
    return hashlib.sha256(der).hexdigest()


def pinned_context(controller_url: str, pem: str | None) -> ssl.SSLContext:
    """An SSL context that accepts the controller's certificate ``pem`` only. ValueError (one line)
    for a plain-HTTP URL or a missing or malformed certificate."""
    if urlparse(controller_url).scheme != "https":
        raise ValueError(f"controller_url: {controller_url!r} is not https:// (the agent talks to the controller "
                         "over TLS only)")
    if not pem or PEM_BEGIN not in pem:
        raise ValueError("controller_cert_pem: required (the controller's certificate the agent pins)")
    fingerprint(pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # see the module doc: the certificate itself is pinned
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_verify_locations(cadata=pem)
    except ssl.SSLError as exc:
        raise ValueError(f"controller_cert_pem: cannot be loaded ({exc})") from None
    return ctx


__all__ = ["fingerprint", "pinned_context"]
