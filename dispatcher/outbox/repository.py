"""All database I/O of the enqueuer, through one narrow async interface.

Every statement runs on a pooled autocommit connection as one short
transaction; every write to a claimed row names the claim token, so it
succeeds only for the enqueuer that holds the claim.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.backoff import ClaimedRow, Retry
from dispatcher.outbox.queries import QUERIES

__all__ = ["Claim", "OutboxRepository", "StatusCounts", "enqueuer_pool"]

# The enqueuer's own commits need no synchronous WAL flush: losing the last few in a
# PostgreSQL crash only republishes rows (at-least-once). The application's dispatch
# commit keeps its own synchronous durability. This takes a WAL flush (ms) off every
# claim and delete.
ENQUEUER_SESSION = "-c synchronous_commit=off"


def enqueuer_pool(
    conninfo: str, *, max_size: int, application_name: str = "outbox-dispatcher-enqueuer"
) -> AsyncConnectionPool[Any]:
    """A closed pool of autocommit sessions set up for the enqueuer; ``await pool.open()``."""
    return AsyncConnectionPool(
        conninfo,
        min_size=1,
        max_size=max_size,
        kwargs={
            "autocommit": True,
            "application_name": application_name,
            "options": ENQUEUER_SESSION,
        },
        open=False,
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """Rows claimed together under one token."""

    token: uuid.UUID
    rows: list[ClaimedRow]


@dataclass(frozen=True, slots=True)
class StatusCounts:
    by_status: dict[str, int]
    oldest_age_seconds: dict[str, float]
    dlq: int


class OutboxRepository:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool

    async def _execute(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(QUERIES[name], params)
            return await cur.fetchall() if cur.description else []

    async def _rowcount(self, name: str, params: dict[str, Any]) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(QUERIES[name], params)
            return int(cur.rowcount)

    async def claim(self, limit: int) -> Claim:
        token = uuid.uuid4()
        rows = await self._execute("claim_batch", {"limit": limit, "token": token})
        return Claim(token, [ClaimedRow(**r) for r in rows])

    async def delete_sent(self, token: uuid.UUID, ids: Sequence[str]) -> int:
        return await self._rowcount("delete_sent", {"token": token, "ids": list(ids)})

    async def mark_sent(self, token: uuid.UUID, ids: Sequence[str]) -> int:
        return await self._rowcount("mark_sent", {"token": token, "ids": list(ids)})

    async def release(self, token: uuid.UUID, ids: Sequence[str]) -> int:
        return await self._rowcount("release_claims", {"token": token, "ids": list(ids)})

    async def schedule_retries(self, token: uuid.UUID, retries: Sequence[Retry]) -> int:
        return await self._rowcount(
            "schedule_retries",
            {
                "token": token,
                "ids": [r.id for r in retries],
                "attempts": [r.attempt for r in retries],
                "delays": [r.delay for r in retries],
                "errors": [r.error for r in retries],
            },
        )

    async def move_to_dlq(self, token: uuid.UUID, dead: Sequence[Retry]) -> int:
        return await self._rowcount(
            "move_to_dlq",
            {
                "token": token,
                "ids": [r.id for r in dead],
                "attempts": [r.attempt for r in dead],
                "errors": [r.error for r in dead],
            },
        )

    async def recover_stale(self, age_seconds: float, limit: int = 1000) -> tuple[int, int]:
        """Reset claims older than ``age_seconds``; return (retried, dead-lettered)."""
        (row,) = await self._execute("recover_stale", {"age": age_seconds, "limit": limit})
        return int(row["retried"]), int(row["dead"])

    async def cleanup_sent(self) -> int:
        return await self._rowcount("cleanup_sent", {})

    async def announce_idle(self, enqueuer: str, listener_pid: int) -> None:
        """From now on, outbox inserts NOTIFY: this enqueuer is idle and listening."""
        await self._rowcount("announce_idle", {"enqueuer": enqueuer, "pid": listener_pid})

    async def withdraw_idle(self, enqueuer: str) -> None:
        await self._rowcount("withdraw_idle", {"enqueuer": enqueuer})

    async def forget_dead_listeners(self) -> int:
        return await self._rowcount("forget_dead_listeners", {})

    async def status_counts(self) -> StatusCounts:
        rows = await self._execute("status_counts", {})
        (dlq,) = await self._execute("dlq_count", {})
        return StatusCounts(
            by_status={r["status"]: int(r["rows"]) for r in rows},
            oldest_age_seconds={r["status"]: float(r["oldest_age_seconds"]) for r in rows},
            dlq=int(dlq["count"]),
        )
