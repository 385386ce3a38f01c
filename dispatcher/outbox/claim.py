"""A claimed batch: due rows locked by one open transaction, and how it settles.

The claim is the transaction's row locks (``OutboxRepository.claim_batch``
opens it); settling deletes the published rows, reschedules or dead-letters
the rest and commits, in one round trip, so a batch's outcome is all or
nothing. Abandoned, it rolls back and its rows are due again, untouched.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncClientCursor, AsyncConnection

from dispatcher.outbox.outcomes import ClaimedRow, Retry
from dispatcher.outbox.queries import QUERIES

__all__ = ["ClaimedBatch"]


class ClaimedBatch:
    """Due rows locked by an open transaction: the claim of one batch.

    Made by ``OutboxRepository.claim_batch``. ``settle`` deletes, reschedules
    and dead-letters in that transaction and commits it, in one round trip.
    If the batch is abandoned (an exception, a cancellation, a crash) the
    transaction rolls back and the rows are due again, untouched.
    """

    def __init__(self, conn: AsyncConnection[Any], token: uuid.UUID, rows: list[ClaimedRow]):
        self._conn = conn
        self.token = token
        self.rows = rows
        self.settled = False
        self.journal: asyncio.Task[None] | None = None  # the journal row being written

    async def settle(
        self, sent: Sequence[str], retries: Sequence[Retry] = (), dead: Sequence[Retry] = ()
    ) -> None:
        if self.journal is not None:
            await self.journal  # its row must exist before the commit that deletes it
        if not retries and not dead:  # the common case: one statement and COMMIT, one execute
            cur = AsyncClientCursor(self._conn)
            await cur.execute(_SETTLE_SENT, {"token": self.token, "ids": list(sent)})
            self.settled = True
            return
        async with self._conn.pipeline():
            await self._conn.execute(QUERIES["close_journal"], {"token": self.token})
            if sent:
                await self._conn.execute(QUERIES["delete_published"], {"ids": list(sent)})
            if retries:
                await self._conn.execute(QUERIES["schedule_retries"], _retry_params(retries))
            if dead:
                params = _retry_params(dead)
                del params["delays"]
                await self._conn.execute(QUERIES["move_to_dlq"], params)
            await self._conn.execute("COMMIT")
        self.settled = True


def _retry_params(retries: Sequence[Retry]) -> dict[str, Any]:
    return {
        "ids": [r.id for r in retries],
        "attempts": [r.attempt for r in retries],
        "delays": [r.delay for r in retries],
        "errors": [r.error for r in retries],
    }


_SETTLE_SENT = "; ".join(
    [
        QUERIES["close_journal"].rstrip(";"),
        QUERIES["delete_published"].rstrip(";"),
        "COMMIT",
    ]
)
