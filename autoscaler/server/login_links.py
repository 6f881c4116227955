"""One-time login links to the dashboard (issue 24, item 5): ``spotrain dashboard`` prints one.

Logging in used to mean pasting the API token into a form. Now the CLI, which holds the API token,
asks the controller (``POST /v1/dashboard/links``, bearer-authenticated) for a link; the link carries a
fresh random secret that the dashboard exchanges, once, for its session cookie (``/ui/link?t=...``).

- single use: the first exchange marks the secret used; a second one is refused, and told so;
- short-lived: a secret expires ``ttl_s`` after it was issued (monotonic clock, injectable for tests);
- only a hash of each secret is kept (a memory dump does not hand out live links), in memory: a
  controller restart ends every outstanding link, which costs one more ``spotrain dashboard``;
- bounded: at most ``max_outstanding`` secrets are kept; issuing past that drops the oldest, so a
  client with the API token cannot grow the controller's memory without bound.

A refused exchange says which of ``used``, ``expired`` or ``unknown`` it was, so the page can tell the
user what to do (``dashboard.py``); the three are indistinguishable to anyone without a secret.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_TTL_S = 120.0
MAX_TTL_S = 600.0
MAX_OUTSTANDING = 64
# A secret's length in bytes before URL-safe base64 (256 bits).
SECRET_BYTES = 32


class Redeemed(enum.Enum):
    OK = "ok"
    USED = "used"
    EXPIRED = "expired"
    UNKNOWN = "unknown"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class LoginLinks:
    """The outstanding one-time secrets of one controller process (thread-safe)."""

    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, max_outstanding: int = MAX_OUTSTANDING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < ttl_s <= MAX_TTL_S or max_outstanding < 1:
            raise ValueError(f"ttl_s must be in (0, {MAX_TTL_S:g}] and max_outstanding >= 1")
        self.ttl_s = ttl_s
        self.max_outstanding = max_outstanding
        self._clock = clock
        self._lock = threading.Lock()
        # digest -> (expires at, used); oldest first. A used secret is kept until it expires, so that
        # its second use is told "already used" rather than "unknown".
        self._links: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    def issue(self) -> str:
        """A fresh secret, valid once within ``ttl_s``."""
        secret = secrets.token_urlsafe(SECRET_BYTES)
        with self._lock:
            self._prune()
            while len(self._links) >= self.max_outstanding:
                self._links.popitem(last=False)
            self._links[_digest(secret)] = (self._clock() + self.ttl_s, False)
        return secret

    def redeem(self, secret: str) -> Redeemed:
        """Use ``secret`` up: OK the first time within its lifetime, else why not."""
        if not secret or len(secret) > 256:
            return Redeemed.UNKNOWN
        key = _digest(secret)
        with self._lock:
            entry = self._links.get(key)
            if entry is None:
                return Redeemed.UNKNOWN
            expires_at, used = entry
            if self._clock() >= expires_at:
                del self._links[key]
                return Redeemed.EXPIRED
            if used:
                return Redeemed.USED
            self._links[key] = (expires_at, True)
            return Redeemed.OK

    def outstanding(self) -> int:
        """Secrets issued, unused and unexpired."""
        with self._lock:
            now = self._clock()
            return sum(1 for exp, used in self._links.values() if not used and now < exp)

    def _prune(self) -> None:
        """Forget expired secrets (a long-expired one reads as unknown, which is just as refused)."""
        now = self._clock()
        for key in [k for k, (exp, _) in self._links.items() if now >= exp + self.ttl_s]:
            del self._links[key]
