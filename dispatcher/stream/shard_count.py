"""The shard count shared through Redis (``composer:stream_shards``).

One owner writes it: an explicit change (``dispatcher shards set``, the
operator's ``spec.shards``), or the first enqueuer when the key is absent.
Enqueuers route each row when they publish it by the count in force, read
through ``LiveShardCount``: cached, refreshed every couple of seconds, so a
change written straight into the key is followed without a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError, ResponseError

from dispatcher.outage import Outage
from dispatcher.redis_client import RedisClient, get_raw
from dispatcher.stream.naming import DEFAULT_SHARDS, SHARDS_KEY

__all__ = [
    "REFRESH_EVERY",
    "InvalidShardCount",
    "LiveShardCount",
    "change_shard_count",
    "ensure_shard_count",
    "parse_shard_count",
    "publish_shard_count",
    "read_published_count",
    "read_shard_count",
]

log = logging.getLogger(__name__)

# How stale a process's view of the count may be: a change is in force everywhere after it.
REFRESH_EVERY = 2.0


class InvalidShardCount(ValueError):
    """The shard key holds something that is not an integer >= 1."""


def parse_shard_count(raw: str | bytes | int, *, source: str = SHARDS_KEY) -> int:
    """Parse a shard count; raise ``InvalidShardCount`` with the source named."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise InvalidShardCount(f"{source} must be an integer >= 1, got {raw!r:.100}") from None
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidShardCount(f"{source} must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise InvalidShardCount(f"{source} must be an integer >= 1, got {value}")
    return value


async def publish_shard_count(client: RedisClient, shards: int) -> None:
    """Write the shard count (validated) to ``composer:stream_shards``: an explicit change.

    A plain SET: it also replaces a key of another type (``SET ... GET`` would refuse one), so
    an explicit change heals a garbage key; ``read_published_count`` says what was there."""
    parse_shard_count(shards, source="shard count")
    await client.set(SHARDS_KEY, str(shards))


async def change_shard_count(client: RedisClient, shards: int) -> str:
    """The explicit change (``dispatcher shards set``, the console): write ``shards``; what the
    key held before, as a person reads it (a number, "(not set)", or why it was invalid)."""
    published, invalid = await read_published_count(client)
    await publish_shard_count(client, shards)
    return invalid or ("(not set)" if published is None else str(published))


async def ensure_shard_count(client: RedisClient, shards: int) -> bool:
    """Write ``shards`` only if the key is absent (a first start); True if it was written.

    Reads first: a Redis at ``maxmemory`` refuses even a ``SET NX`` that would not write,
    and an enqueuer restarting while Redis is full must still start.
    """
    parse_shard_count(shards, source="shard count")
    if await client.get(SHARDS_KEY) is not None:
        return False
    return bool(await client.set(SHARDS_KEY, str(shards), nx=True))


def unset_fallback(shards: int, *, in_force: bool = False) -> str:
    """How every process says which count it uses while the key is not set, and why.

    ``in_force``: the count the process already works with, kept (a worker never
    stops reading shards because the key vanished); else STREAM_SHARDS.
    """
    why = "the count in force, kept" if in_force else f"STREAM_SHARDS, {DEFAULT_SHARDS} by default"
    return f"{SHARDS_KEY} is not set; using {shards} shards ({why})"


async def read_shard_count(
    client: RedisClient,
    *,
    fallback: int | None = None,
    fallback_in_force: bool = False,
    warn: bool = True,
) -> int:
    """The published shard count; ``fallback`` (STREAM_SHARDS) or the default if unset.

    ``fallback_in_force``: the fallback is the caller's count in force, not STREAM_SHARDS
    (the log line says which). An unset key is said as a WARNING, or with ``warn=False`` at
    DEBUG (a loop that reads it every few seconds says it on its first read only). A key that
    is set but invalid is an error, not a silent fallback: reading the wrong number of shards
    would strand messages.
    """
    raw = await _get_count(client)
    if raw is None:
        shards = fallback if fallback is not None else DEFAULT_SHARDS
        level = logging.WARNING if warn else logging.DEBUG
        log.log(level, "%s", unset_fallback(shards, in_force=fallback_in_force))
        return shards
    return parse_shard_count(raw)


async def read_published_count(client: RedisClient) -> tuple[int | None, str | None]:
    """What the key holds, for a report: the count (None if unset), or why it is invalid."""
    try:
        raw = await _get_count(client)
        return (None if raw is None else parse_shard_count(raw)), None
    except InvalidShardCount as exc:
        return None, str(exc)


async def _get_count(client: RedisClient) -> bytes | None:
    """The key's value as bytes; ``InvalidShardCount`` if it is not a string."""
    try:
        return await get_raw(client, SHARDS_KEY)
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        raise InvalidShardCount(f"{SHARDS_KEY} must be an integer >= 1, not a {exc}") from None


class LiveShardCount:
    """The count in force, read at most every ``refresh_every`` seconds.

    A failed read keeps the last good value (and says so); with no good value
    yet it raises, so the caller fails its publish and retries. An invalid value
    (not an integer >= 1, not UTF-8, a key of another type) keeps the last good
    value too, or else is the fallback (``STREAM_SHARDS``): the workers read the
    shard streams of their count and any other that holds work, so nothing
    routed by it is stranded, and a bad key written by hand must not stop every
    queue. Said once per bad value.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        fallback: int | None = None,
        refresh_every: float = REFRESH_EVERY,
        clock: Callable[[], float] = time.monotonic,
        outage: Outage | None = None,
    ) -> None:
        self.refresh_every = refresh_every
        self._outage = outage or Outage("Redis")  # where Redis being down is said (the owner's)
        self._client = client
        self._fallback = fallback if fallback is not None else DEFAULT_SHARDS
        self._clock = clock
        self._value: int | None = None
        self._next_read = 0.0
        self._invalid: str | None = None  # the bad value said last

    def fresh(self) -> int | None:
        """The count in force if it was read lately, else None (``current`` reads it)."""
        value = self._value
        return value if value is not None and self._clock() < self._next_read else None

    async def current(self) -> int:
        now = self._clock()
        if self._value is not None and now < self._next_read:
            return self._value
        self._next_read = now + self.refresh_every
        try:
            raw = await _get_count(self._client)
            self._outage.ok()
            value = self.store(raw)
        except InvalidShardCount as exc:
            kept = self._value if self._value is not None else self._fallback
            if str(exc) != self._invalid:
                self._invalid = str(exc)
                log.warning("%s; routing by %d shards, the count in force, until it is", exc, kept)
            self._value = kept
            return kept
        except (RedisError, OSError) as exc:
            if self._value is None:
                raise
            if not self._outage.failed(exc, what="refreshing the shard count"):
                log.warning("cannot refresh the shard count, keeping %d: %s", self._value, exc)
            return self._value
        self._invalid = None
        return value

    def store(self, raw: str | bytes | int | None) -> int:
        """Take ``raw`` (the key's value, None if absent) as read now; the count in force.

        For a reader of the key on a connection of its own (the enqueuer's listener
        thread); raises ``InvalidShardCount`` and keeps the count in force if it is bad.
        """
        value = self._fallback if raw is None else parse_shard_count(raw)
        self._next_read = self._clock() + self.refresh_every
        if value != self._value and raw is None:  # a warning when the key was lost
            level = logging.INFO if self._value is None else logging.WARNING
            log.log(level, "%s", unset_fallback(value), extra={"previous": self._value})
        elif value != self._value:
            log.info("shard count in force: %d", value, extra={"previous": self._value})
        self._value = value
        return value
