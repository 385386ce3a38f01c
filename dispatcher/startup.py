"""Bringing a long-running process's backends up: bounded, retried with backoff, stoppable.

A backend that is down or silent when a process starts is the ordinary case on
Kubernetes (the database pod still starting, a Service without endpoints yet).
The enqueuer and the worker then log what failed, wait, and try again (1 s
doubling to 30 s), serving ``/healthz`` (live) and ``/readyz`` (not ready)
meanwhile, instead of exiting or hanging. Every connection attempt is bounded
by a connect timeout, so "silent" fails like "refused". SIGTERM ends the wait.
Errors that waiting cannot mend (a bad setting, a missing schema) are not
retried: they end the process with their one-line message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import psycopg
from redis.exceptions import AuthenticationError, AuthorizationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dispatcher.heap import settle_heap
from dispatcher.lifecycle import run_until_signalled
from dispatcher.observability import ObservabilityServer

__all__ = ["TRANSIENT", "Component", "run_when_up", "transient", "until_up"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Component(Protocol):
    """A long-running part: the enqueuer, a worker."""

    async def run(self) -> None: ...
    def request_stop(self) -> None: ...
    def live(self) -> bool: ...
    def ready(self) -> bool: ...


C = TypeVar("C", bound=Component)

# What a backend that is down, unreachable or silent raises (psycopg_pool's PoolTimeout is an
# OperationalError).
TRANSIENT: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    TimeoutError,
)
# A server that answered and refused: waiting changes nothing (a wrong password, a missing
# database or role, a session option a pooler refuses). libpq gives no SQLSTATE for errors
# while connecting, so its words are all there is to go by.
_REFUSALS = (
    "authentication",
    "password",
    "does not exist",
    "pg_hba.conf",
    "permission denied",
    "startup parameter",
    "invalid",
)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says a backend is down, unreachable or silent (worth waiting for)."""
    if not isinstance(exc, TRANSIENT) or isinstance(exc, AuthenticationError | AuthorizationError):
        return False
    if isinstance(exc, psycopg.OperationalError):
        text = str(exc).lower()
        return not any(word in text for word in _REFUSALS)
    return True


async def until_up(
    start: Callable[[], Awaitable[T]],
    *,
    what: str,
    stopping: asyncio.Event,
    first_delay: float = 1.0,
    max_delay: float = 30.0,
) -> T | None:
    """``await start()`` until it succeeds; None if ``stopping`` is set first."""
    delay = first_delay
    while not stopping.is_set():
        try:
            return await start()
        except TRANSIENT as exc:
            if not transient(exc):
                raise
            log.warning("%s failed (%s); trying again in %.0f s", what, _first_line(exc), delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        delay = min(delay * 2, max_delay)
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


async def run_when_up(
    start: Callable[[], Awaitable[C]], *, what: str, metrics_port: int
) -> C | None:
    """Serve the probes at once, ``start()`` the component once its backends are up
    (``until_up``), and run it until SIGTERM/SIGINT; the component (None if stopped first).

    Until it has started the process is live (it is working on it) and not ready.
    """
    component: C | None = None
    stopping = asyncio.Event()

    async def run() -> None:
        nonlocal component
        component = await until_up(start, what=what, stopping=stopping)
        if component is None:
            return  # stopped before the backends came up
        settle_heap()  # every module the component needs is imported by now
        if stopping.is_set():
            component.request_stop()
        await component.run()

    def request_stop() -> None:
        stopping.set()
        if component is not None:
            component.request_stop()

    server = ObservabilityServer(
        port=metrics_port,
        live=lambda: component is None or component.live(),
        ready=lambda: component is not None and component.ready(),
    )
    await server.start()
    try:
        await run_until_signalled(run, request_stop)
    finally:
        await server.stop()
    return component
