"""What the operator asks to learn whether something answers: PostgreSQL, and its own CRD.

``PostgresProbe`` connects to a dispatcher's database to tell ``Ready`` from
``PostgresUnavailable``; a connection per pass would load the database for nothing, so it
asks at most once every ``interval`` seconds per dispatcher (and at once when the URL
changes). ``CrdProbe`` is the operator's liveness (``/healthz``): with scanning off, kopf
discovers the resource once at start-up, so an operator started before its CRD was served
never watches and must restart. Messages name the host, never the URL (it may carry a password).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import psycopg
from psycopg.conninfo import conninfo_to_dict

from dispatcher.controller.api_requests import KubeApi
from dispatcher.controller.resource import API_GROUP, API_VERSION, PLURAL

__all__ = ["CrdProbe", "PostgresProbe", "ask_postgres"]

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class _Answer:
    """When PostgreSQL was last asked, at which URL, and what it said."""

    fingerprint: int
    at: float
    problem: str | None


@dataclass
class PostgresProbe:
    """Why PostgreSQL does not answer for a dispatcher, remembered for ``interval`` seconds."""

    timeout: float
    interval: float
    _answers: dict[Key, _Answer] = field(default_factory=dict)

    async def problem(self, key: Key, url: str) -> str | None:
        """Why PostgreSQL does not answer at ``url``, or None."""
        answer = self._answers.get(key)
        fingerprint = hash(url)
        fresh = time.monotonic() - self.interval
        if answer is not None and answer.fingerprint == fingerprint and answer.at > fresh:
            return answer.problem
        problem = await ask_postgres(url, seconds=self.timeout)
        self._answers[key] = _Answer(fingerprint=fingerprint, at=time.monotonic(), problem=problem)
        return problem

    def forget(self, key: Key) -> None:
        self._answers.pop(key, None)


async def ask_postgres(url: str, *, seconds: float) -> str | None:
    """Connect once: None if PostgreSQL answered, else one line saying why not."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the PostgreSQL URL in the Secret is not a valid connection string"
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
    try:
        async with asyncio.timeout(seconds + 1):
            conn = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, int(seconds)))
    except (psycopg.Error, OSError, TimeoutError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"cannot reach PostgreSQL at {where}: {detail}".replace(url, "<url>")
    await conn.close()
    return None


@dataclass
class CrdProbe:
    """Why the operator is not live: its CRD is not served, or was not when it started.

    The answer is remembered for ``max_age`` seconds, so a flood of ``/healthz`` requests
    (anyone on the pod network may send them) costs the API server one request per period.
    """

    max_age: float = 10.0
    served_at_start: bool | None = None  # None: not checked yet
    _asked_at: float | None = None
    _problem: str | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def problem(self, api: KubeApi) -> str | None:
        """None while live; else one line saying why not. Raises ``APIError`` if unanswered."""
        async with self._lock:
            now = time.monotonic()
            if self._asked_at is None or now - self._asked_at >= self.max_age:
                self._problem = await self._ask(api)
                self._asked_at = now
            return self._problem

    async def _ask(self, api: KubeApi) -> str | None:
        served = await api.served(group=API_GROUP, version=API_VERSION, plural=PLURAL)
        if self.served_at_start is None:
            self.served_at_start = served
        if not self.served_at_start:
            return (
                f"{PLURAL}.{API_GROUP} was not served when the operator started: "
                "nothing is watched until it restarts"
            )
        if not served:
            return f"{PLURAL}.{API_GROUP} is not served (CRD missing)"
        return None
