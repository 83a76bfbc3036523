"""Renew on access: traffic through the server's proxy extends a sandbox's expiry (OpenSandbox's
OSEP-0009, its server-proxy path).

Rules:
1. A sandbox opts in at create with `extensions["access.renew.extend.seconds"]`: a decimal
   integer string, 300 to 86400. Anything else, or any value on a server that does not renew
   (setting `renew_on_access_max_lifetime = 0`), is a 400 at create: never ignored.
2. A renewal sets the expiry to now + that many seconds, but never past the sandbox's creation
   + `renew_on_access_max_lifetime` (the server's maximum), and only when that is later than the
   expiry it has (a sandbox without an expiry has nothing to renew). Each renewal is one
   `lifecycle` audit record (`Service.renew_on_access`).
3. Rate: a sandbox is renewed at most once per `renew_on_access_interval` seconds, decided in
   memory (`AccessRenewals`) before anything touches the database, so a busy sandbox's requests
   do not each write a row. The renewal runs off the request's path.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from sandgate.lifecycle.errors import LifecycleError

EXTENSION = "access.renew.extend.seconds"
EXTEND_MIN, EXTEND_MAX = 300, 86400  # OpenSandbox's bounds: 5 minutes to 24 hours
TRACKED_SANDBOXES = 8192  # the rate limiter's memory: least recently renewed sandboxes go first


def extend_seconds(extensions: Mapping[str, str]) -> int | None:
    """The opted-in extension (rule 1), None when the sandbox did not opt in."""
    if EXTENSION not in extensions:
        return None
    raw = str(extensions[EXTENSION]).strip()
    if not (raw.isascii() and raw.isdigit()) or not EXTEND_MIN <= int(raw) <= EXTEND_MAX:
        raise LifecycleError(
            "invalid",
            f"extensions[{EXTENSION!r}] = {extensions[EXTENSION]!r}: a whole number of seconds from "
            f"{EXTEND_MIN} to {EXTEND_MAX} (omit it to keep the sandbox's expiry as set)",
        )
    return int(raw)


def check_opt_in(extensions: Mapping[str, str], max_lifetime: int) -> None:
    """Refuse a create whose opt-in is malformed or that this server would not honour."""
    if extend_seconds(extensions) is not None and max_lifetime <= 0:
        raise LifecycleError(
            "invalid",
            f"extensions[{EXTENSION!r}]: this server does not renew sandboxes on access "
            "(setting renew_on_access_max_lifetime = 0); renew with POST .../renew-expiration",
        )


class AccessRenewals:
    """Which accesses may renew now: at most one per sandbox per `interval` seconds (rule 3)."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: OrderedDict[str, float] = OrderedDict()

    def due(self, sandbox_id: str) -> bool:
        now = self.clock()
        if now - self._last.get(sandbox_id, -math.inf) < self.interval:
            return False
        self._last[sandbox_id] = now
        self._last.move_to_end(sandbox_id)
        while len(self._last) > TRACKED_SANDBOXES:
            self._last.popitem(last=False)
        return True
