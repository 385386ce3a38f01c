"""A backend's outage as a process logs it: one warning when it starts, one when it ends.

Every loop that talks to Redis retries on its own (a worker's read and reclaim
loop per shard, its shard-count and stats loops; the enqueuer's publishes and
shard-count refresh). Each logging its own failures gave hundreds of identical
warnings for one outage of half a minute. They report to one ``Outage`` instead (the
component makes it and hands it to each loop it builds: the enqueuer's ``redis``, the worker's
``RedisContact.outage``): the first
failure of an outage is a WARNING naming the backend and the cause, later ones
go to DEBUG, and the first success after it says how long it lasted. Errors
that are not the backend being unreachable (a lost consumer group, a refused
command) are the caller's to log, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Outage", "is_outage"]

log = logging.getLogger(__name__)

# What a backend that is down, unreachable or silent raises.
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the backend is unreachable (not that it refused a command)."""
    return isinstance(exc, _UNREACHABLE)


class Outage:
    """Whether one backend is down for this process, and since when."""

    def __init__(self, backend: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self._clock = clock
        self._since: float | None = None

    def failed(self, exc: BaseException, *, what: str) -> bool:
        """Report a failure of ``what``; False (nothing logged) if it is no outage."""
        if not is_outage(exc):
            return False
        if self._since is None:
            self._since = self._clock()
            log.warning(
                "%s is down (%s failed: %s); retrying with backoff, quietly until it is back",
                self.backend,
                what,
                _first_line(exc),
            )
        else:
            log.debug("%s still down: %s failed: %s", self.backend, what, _first_line(exc))
        return True

    def ok(self) -> None:
        """Report a round trip that succeeded: the end of the outage, if there was one."""
        if self._since is None:
            return
        lasted, self._since = self._clock() - self._since, None
        log.warning("%s is back after %.0f s", self.backend, lasted)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
