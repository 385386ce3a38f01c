"""Pre-flight check: does a connection keep its session state between transactions?

The enqueuer keeps session state on its own connection: LISTEN, and the idle
flag's advisory lock. Behind a pooler in transaction (or statement) pooling
mode, such as PgBouncer's ``pool_mode = transaction``, each transaction runs
on whichever server connection is free, so that state stays behind on a server
session the enqueuer no longer owns: notifications never arrive and the flag
is held by nobody. Dispatch would silently fall back to the poll interval.

The check sets a session variable on one connection, makes a second
connection hold a server connection in an open transaction, and reads the
variable back on the first. A direct connection, or a session-mode pool, reads
it back; a transaction pool either runs the read on another server session
(the variable is gone) or has no free server to run it on (the read waits).
A pooler that reuses server connections most-recently-first hands the held
transaction the very server the variable was set on; one that reuses them
oldest-first hands the read another one: either way the check sees it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

import psycopg

from dispatcher.config import ConfigError

__all__ = ["PoolingModeError", "require_session_pooling", "session_pooling"]

_VARIABLE = "outbox_dispatcher.session_probe"

Pooling = Literal["session", "transaction", "statement"]


class PoolingModeError(ConfigError):
    """The database URL goes through a pooler that does not keep session state."""


async def session_pooling(conninfo: str, *, wait: float = 3.0) -> Pooling:
    """``"session"`` when session state sticks on ``conninfo``, else the pooling mode seen."""
    token = uuid.uuid4().hex
    kwargs: dict[str, Any] = {"prepare_threshold": None}  # no server-side prepared statements
    async with (
        await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs) as probe,
        await psycopg.AsyncConnection.connect(conninfo, autocommit=False, **kwargs) as holder,
    ):
        await probe.execute(f"SET {_VARIABLE} = '{token}'")
        try:
            await holder.execute("SELECT 1")  # BEGIN: the holder now keeps a server connection
        except (psycopg.errors.FeatureNotSupported, psycopg.errors.ProtocolViolation):
            return "statement"  # the pooler refuses transaction blocks
        try:
            cur = await asyncio.wait_for(
                probe.execute("SELECT current_setting(%s, true)", (_VARIABLE,)), wait
            )
            row = await cur.fetchone()
        except TimeoutError:
            return "transaction"  # no server connection of its own to run on
        finally:
            await holder.rollback()
    return "session" if row is not None and row[0] == token else "transaction"


async def require_session_pooling(conninfo: str, **session_kwargs: Any) -> None:
    """Raise one line for the user unless ``conninfo`` keeps session state.

    Then connect once with ``session_kwargs`` (the enqueuer's session options): a pool
    retries a refused connection quietly until its timeout, which would hide the reason.
    """
    mode = await session_pooling(conninfo)
    if mode != "session":
        raise PoolingModeError(
            f"the database URL goes through a connection pooler in {mode} pooling mode "
            f"(e.g. PgBouncer pool_mode = {mode}); the enqueuer needs session state for "
            "LISTEN and its idle flag: connect it to PostgreSQL directly or through a "
            "session-mode pool"
        )
    conn = await psycopg.AsyncConnection.connect(conninfo, **session_kwargs)
    await conn.close()
