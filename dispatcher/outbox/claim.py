"""A claimed batch: due rows locked by one open transaction, and how it settles.

The claim is the transaction's row locks (``OutboxRepository.claim_batch``
opens it); settling deletes the published rows, reschedules or dead-letters
the rest and commits, in one round trip, so a batch's outcome is all or
nothing. Abandoned, it rolls back and its rows are due again, untouched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncClientCursor, AsyncConnection

from dispatcher.outbox.outcomes import ClaimedRow, Retry
from dispatcher.outbox.queries import QUERIES

__all__ = ["SETTLE_ALL", "ClaimedBatch"]


class ClaimedBatch:
    """Due rows locked by an open transaction: the claim of one batch.

    Made by ``OutboxRepository.claim_batch``. ``settle`` deletes, reschedules
    and dead-letters in that transaction and commits it, in one round trip.
    If the batch is abandoned (an exception, a cancellation, a crash) the
    transaction rolls back and the rows are due again, untouched.

    The claim's rows are kept as they came (in ``ClaimedRow``'s field order);
    ``column`` reads one field of every row for the publishing path, and
    ``rows`` makes a ``ClaimedRow`` of each only when asked (the rows of a
    batch that went out whole never are).
    """

    def __init__(self, conn: AsyncConnection[Any], token: uuid.UUID, raw: list[tuple[Any, ...]]):
        self._conn = conn
        self.token = token
        self._raw = raw
        self._rows: list[ClaimedRow] | None = None
        self.ids: list[str] = [r[0] for r in raw]
        self.settled = False
        self.targets: list[str] | None = None  # the stream each row was published to
        self.journal: asyncio.Task[None] | None = None  # the journal row being written
        # The batch claimed in this one's settlement (``OutboxRepository.claim_next``).
        self.next: ClaimedBatch | None = None

    @property
    def conn(self) -> AsyncConnection[Any]:
        """The connection whose open transaction holds the batch's row locks."""
        return self._conn

    def __len__(self) -> int:
        return len(self._raw)

    @property
    def rows(self) -> list[ClaimedRow]:
        if self._rows is None:
            # The claim's last column (the transaction id) is the journal's, not the row's.
            self._rows = [ClaimedRow(*r[: len(_COLUMNS)]) for r in self._raw]
        return self._rows

    def column(self, name: str) -> list[Any]:
        """One of ``ClaimedRow``'s fields for every row, in the claim's order."""
        index = _COLUMNS[name]
        return [r[index] for r in self._raw]

    async def settle(
        self, sent: Sequence[str], retries: Sequence[Retry] = (), dead: Sequence[Retry] = ()
    ) -> None:
        if self.journal is not None:
            await self.journal  # its row must exist before the commit that deletes it
        if not retries and not dead:  # the common case: one statement and COMMIT, one execute
            cur = AsyncClientCursor(self._conn)
            if len(sent) == len(self) and self._raw:
                await cur.execute(SETTLE_ALL, {"token": self.token})
            else:
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


_COLUMNS = {f.name: i for i, f in enumerate(dataclasses.fields(ClaimedRow))}
# The settlement of a batch that published whole, ending with its COMMIT (one simple query).
SETTLE_ALL = "; ".join(
    [
        QUERIES["delete_claimed"].rstrip(";"),
        QUERIES["close_journal"].rstrip(";"),
        "COMMIT",
    ]
)
_SETTLE_SENT = "; ".join(
    [
        QUERIES["close_journal"].rstrip(";"),
        QUERIES["delete_published"].rstrip(";"),
        "COMMIT",
    ]
)
