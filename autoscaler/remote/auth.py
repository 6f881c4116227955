"""The agents' credentials: the fleet's agent key, each instance's credential, and signed requests.

**The agent key** (``agent-token``) is the root of every agent credential. It lives in the fleet's
directory (``SPOTRAIN_FLEET_DIR``, default SPOTRAIN_HOME), beside the agents' TLS certificate
(``remote/tls.py``), so that every controller of one fleet (a leader and its standbys, each with a home of its
own) issues and accepts the same credentials: after a takeover the new leader still knows the agents
the old one launched (issue 21, finding 3; before, each controller made a key in its own home and
every agent got 401 from the new leader, its gang LOST). The key is made once, atomically, by the
first controller of the fleet that needs it (written whole to a private temporary file, mode 0600,
then hard-linked into place, which fails if another controller got there first: the loser reads the
winner's key, so no controller ever reads a half-written or empty one). A controller upgraded from a
release that kept the key in its home seeds the fleet's key with that one, so the agents it launched
before keep working.

**An instance's credential** is ``<decision_id>:<HMAC(key, decision_id)>``, in its user data: bound to
one launch decision, so reading an instance's user data exposes that instance's agent only.

**Requests** never carry that credential (issue 21, finding 14): the agent signs each one with it
(``cloud_providers/remote/wire.py``: method, path, decision, a per-agent counter ``seq`` and the
sha256 of the body or query) and the controller accepts a ``seq`` only once, higher than the last it
took from that decision (``RemoteExecutor.accept_seq``, kept in the database so it holds across
controller restarts and takeovers). A captured request replayed later is refused (409).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from autoscaler.errors import SpotrainError
from autoscaler.home import fleet_dir, home, publish_secret
from cloud_providers.remote.wire import SignedRequest, request_signature

AGENT_TOKEN_FILE = "agent-token"


def agent_token_path() -> Path:
    """The fleet's agent key (``SPOTRAIN_FLEET_DIR``, default SPOTRAIN_HOME)."""
    return fleet_dir() / AGENT_TOKEN_FILE


def _read_key(path: Path) -> str:
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)  # a secret readable by others is narrowed, not used as found
    key = path.read_text().strip()
    if not key:
        raise SpotrainError(f"{path} is empty: the agents' key cannot be empty (stop the fleet's controllers, "
                            "delete it and terminate the instances)")
    return key


def ensure_agent_token() -> str:
    """The fleet's agent key (separate from the user API token), made on first use (see module doc)."""
    path = agent_token_path()
    if not path.exists():
        legacy = home() / AGENT_TOKEN_FILE
        seed = legacy.read_text().strip() if legacy != path and legacy.is_file() else ""
        publish_secret(path, seed or secrets.token_urlsafe(32))  # the first controller's key stands
    return _read_key(path)


def _mac(token: str, decision_id: str) -> str:
    return hmac.new(token.encode(), b"spotrain-agent:" + decision_id.encode(), hashlib.sha256).hexdigest()


def agent_credential(token: str, decision_id: str) -> str:
    """The credential one instance's agent holds: valid for that launch decision only."""
    return f"{decision_id}:{_mac(token, decision_id)}"


def decision_of(token: str, credential: str) -> str | None:
    """The decision id a credential was issued for, or None if it was not issued with ``token``."""
    decision_id, sep, mac = credential.rpartition(":")
    if not sep or not decision_id:
        return None
    return decision_id if hmac.compare_digest(mac.encode(), _mac(token, decision_id).encode()) else None


def signed_decision(token: str, signed: SignedRequest | None, method: str) -> str | None:
    """The decision id of a request signed with the credential ``token`` issued for it, or None. Only
    the signature is checked here (from the headers, before any byte of the body is read); the body's
    hash and the counter are checked by the endpoint (``remote/endpoints.py``)."""
    if signed is None:
        return None
    expected = request_signature(agent_credential(token, signed.decision_id), method=method, path=signed.path,
                                 seq=signed.seq, content_sha256=signed.content_sha256)
    return signed.decision_id if hmac.compare_digest(expected.encode(), signed.signature.encode()) else None


__all__ = ["AGENT_TOKEN_FILE", "agent_credential", "agent_token_path", "decision_of", "ensure_agent_token",
           "signed_decision"]
