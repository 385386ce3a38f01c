"""Cancelled runs in Redis: the record the workers read and the signal they block on.

- ``workflow.cancel.runs``: a sorted set, one member per cancelled run id, its
  score the end of the dedup window in Redis's own clock (``TIME``, ms). A
  member whose score has passed is no longer cancelled; the enqueuer trims
  those each time it writes.
- ``workflow.cancel.signal``: a stream the enqueuer appends one entry to
  after each write of the set (capped near ``SIGNAL_MAXLEN`` entries). Workers
  block on it (``XREAD``) and, on any entry, read the set again: an entry is a
  wake-up, never data, so a missed, trimmed or forged entry changes nothing
  but when the set is read.

Only the enqueuer writes both (its ACL); workers read them. Run ids are any
non-empty text, as the application gave them.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.client import NEVER_DECODE
from redis.exceptions import ResponseError

from dispatcher.redis_client import RedisClient

__all__ = [
    "CANCELLED_RUNS",
    "CANCEL_SIGNAL",
    "SIGNAL_MAXLEN",
    "cancelled_runs",
    "count_cancelled",
    "record_cancels",
    "redis_now_ms",
    "wait_for_signal",
]

CANCELLED_RUNS = "workflow.cancel.runs"
CANCEL_SIGNAL = "workflow.cancel.signal"
SIGNAL_MAXLEN = 1000


async def redis_now_ms(client: RedisClient) -> int:
    """Redis's clock, in ms (on Cluster, the node the client asks)."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def record_cancels(client: RedisClient, run_ids: Sequence[str], *, ttl_ms: int) -> None:
    """Record ``run_ids`` as cancelled for ``ttl_ms``, then signal the workers.

    The set is written (and trimmed of expired runs) before the signal, so a
    worker woken by it reads the new runs. Every command may be repeated.
    """
    if not run_ids:
        return
    now = await redis_now_ms(client)
    pipe = client.pipeline(transaction=False)
    pipe.zadd(CANCELLED_RUNS, {run_id: now + ttl_ms for run_id in run_ids})
    pipe.zremrangebyscore(CANCELLED_RUNS, "-inf", now)
    await pipe.execute()
    await client.xadd(
        CANCEL_SIGNAL, {"runs": str(len(run_ids))}, maxlen=SIGNAL_MAXLEN, approximate=True
    )


async def cancelled_runs(client: RedisClient, *, limit: int) -> list[str]:
    """The runs cancelled now (their window not over): the ``limit`` cancelled last.

    Read as bytes: a member that is not UTF-8 (no run id of a task is) is skipped,
    never an error that would stop every later read.
    """
    now = await redis_now_ms(client)
    found = await client.execute_command(
        "ZRANGE",
        CANCELLED_RUNS,
        "+inf",
        now,
        "BYSCORE",
        "REV",
        "LIMIT",
        0,
        limit,
        **{NEVER_DECODE: True},
    )
    runs = []
    for member in found or ():
        try:
            runs.append(member.decode() if isinstance(member, bytes) else str(member))
        except UnicodeDecodeError:
            continue
    return runs


async def count_cancelled(client: RedisClient) -> int:
    """How many runs are cancelled now (their window not over)."""
    try:
        return int(await client.zcount(CANCELLED_RUNS, await redis_now_ms(client), "+inf"))
    except ResponseError as exc:  # not a sorted set (written by hand): no run is cancelled
        if "WRONGTYPE" not in str(exc):
            raise
        return 0


async def wait_for_signal(client: RedisClient, *, after: str, block_ms: int) -> str | None:
    """Block up to ``block_ms`` for signal entries after the id ``after``; the last one's id,
    None if none came. Only the ids are read (as bytes): an entry's fields mean nothing."""
    reply = await client.execute_command(
        "XREAD",
        "COUNT",
        SIGNAL_MAXLEN,
        "BLOCK",
        block_ms,
        "STREAMS",
        CANCEL_SIGNAL,
        after,
        **{NEVER_DECODE: True},
    )
    last = None
    for _stream, entries in reply or ():
        for entry in entries or ():
            last = entry[0]
    if last is None:
        return None
    return last.decode() if isinstance(last, bytes) else str(last)
