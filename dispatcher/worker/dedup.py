"""Task attempts in Redis: one key each, holding a lease while a run goes on, the
runs counted, then a done mark.

Delivery is at-least-once (the outbox may publish a row twice, a worker may
die with entries in hand). One Redis key per task attempt
(``TaskMessage.dedup_key`` = ``<run_id>:<task_id>:<attempt>``),
``dispatcher:attempt:<key>``, turns duplicates into no-ops and counts the
attempt's runs. Its value is one of:

- ``<runs>|<token>|<until>`` while a run holds the attempt's lease: the runs
  started (a run is a handler start; taking the lease starts one), the
  holder's token (worker name and a random part) and the lease's end in
  Redis's own clock (``TIME``, ms), so no two workers' clocks are compared.
  Taken before the handler runs, pushed a full TTL ahead while the run lasts
  (``leases.py``). While it has not ended, no other delivery of the attempt
  runs: that delivery stays pending, is not counted, and is reclaimed later.
- ``<runs>`` once a run ended without success (its lease let go), or when
  its worker died (the lease ends by itself: that run counts).
- ``done`` once a run succeeded, always written before the entry is acked
  (``settle.py``). A delivery of a done attempt is acked without running.

The key lives for the dedup window (default 24 h) from the attempt's first
claim, and again from its done mark. A success replaces the lease by the
done mark in one write, so a duplicate either finds the lease held or the
attempt done, never neither.

``claim_many`` takes the leases, counts the runs and reads the done marks of
a whole read batch in one round trip: on standalone Redis one script call
(``_CLAIM``), on Redis Cluster one pipeline of the same script, a key per
call (every script here touches one attempt key per call on Cluster, so
each runs on the node that holds its key). A first delivery, the common
case, costs one ``SET NX GET`` in Redis.

What this does *not* guarantee (be honest with handler authors):

- Effectively-once only within the dedup window; an attempt re-delivered
  after its mark expired runs again.
- A crash (or a lost connection) between the handler's success and the done
  write re-runs the attempt: handlers must still be idempotent.
- A lease that expires while the handler is still running (the process is
  stalled longer than the TTL, or Redis is unreachable for that long) lets
  another worker run the same attempt concurrently.
- Different attempts of one task (``attempt`` 1, 2...) and the same task in
  different runs are different identities by design: they are meant to run.
- The key is independent of the stream: a failover that loses recent
  writes on a replica-less primary can lose a done mark or a count too.
- Workers of 0.1.0 kept the lease in a key of its own
  (``dispatcher:lease:<key>``) and read a count as a bare number: while both
  versions run (a rolling upgrade), neither sees the other's leases, so an
  attempt delivered twice in that window may run on both. Done marks are
  the same in both and always honoured.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from redis.asyncio import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoPermissionError, NoScriptError, RedisError
from redis.typing import EncodableT, KeyT

from dispatcher.config import ConfigError
from dispatcher.redis_client import RedisClient, server_infos
from dispatcher.stream.consumer import RedisPipeline

__all__ = ["DONE", "AttemptGuard", "Claim", "aligned", "attempt_key", "supports_claims"]

log = logging.getLogger(__name__)

ATTEMPT_PREFIX = "dispatcher:attempt:"
# The attempt key's value once a run succeeded.
DONE = "done"

# Every script below: KEYS are attempt keys (one per call on Cluster). ``now`` is
# Redis's clock in ms; a value is parsed into runs, and the lease's holder and end
# (both nil when no lease was taken since the last run ended).
_PRELUDE = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function parse(value)
  local runs, holder, ends = string.match(value, '^(%d+)|(.*)|(%d+)$')
  if runs then
    return tonumber(runs), holder, tonumber(ends)
  end
  return tonumber(value) or 0, nil, nil
end
-- redis.call(...) on ``key``, one of ours: if it holds another type (written by hand or by
-- a handler, never by us), it is garbage and goes, and the call is made again.
local function on(key, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    if not string.find(reply.err, 'WRONGTYPE', 1, true) then
      error(reply)
    end
    redis.call('del', key)
    return redis.call(...)
  end
  return reply
end
"""
# ARGV: token, lease TTL ms, attempt TTL ms. One integer per attempt: 0 done, -1 busy
# (a run holds the lease), n > 0 the lease is now ours and this is run n.
_CLAIM = (
    _PRELUDE
    + """
local lease = '|' .. ARGV[1] .. '|' .. string.format('%d', now + tonumber(ARGV[2]))
local found = {}
for i = 1, #KEYS do
  local was = on(KEYS[i], 'set', KEYS[i], '1' .. lease, 'NX', 'GET', 'PX', ARGV[3])
  if not was then
    found[i] = 1
  elseif was == 'done' then
    found[i] = 0
  else
    local runs, holder, ends = parse(was)
    if holder and ends > now then
      found[i] = -1
    else
      runs = runs + 1
      redis.call('set', KEYS[i], runs .. lease, 'KEEPTTL')
      found[i] = runs
    end
  end
end
return found
"""
)
# ARGV: token, runs to take back (1: the run never started; 0: it ran and failed).
# Lets go of the leases still ours; an attempt left with no run is deleted.
_LET_GO = (
    _PRELUDE
    + """
for i = 1, #KEYS do
  local value = on(KEYS[i], 'get', KEYS[i])
  if value then
    local runs, holder = parse(value)
    if holder == ARGV[1] then
      runs = runs - tonumber(ARGV[2])
      if runs > 0 then
        redis.call('set', KEYS[i], runs, 'KEEPTTL')
      else
        redis.call('del', KEYS[i])
      end
    end
  end
end
return 0
"""
)
# ARGV: token, lease TTL ms. 1 if the lease was ours and now ends a full TTL from now.
_RENEW = (
    _PRELUDE
    + """
local value = on(KEYS[1], 'get', KEYS[1])
if not value then
  return 0
end
local runs, holder = parse(value)
if holder ~= ARGV[1] then
  return 0
end
local ends = string.format('%d', now + tonumber(ARGV[2]))
redis.call('set', KEYS[1], runs .. '|' .. holder .. '|' .. ends, 'KEEPTTL')
return 1
"""
)


def supports_claims(redis_version: str) -> bool:
    """Whether a server of ``redis_version`` runs ``SET ... NX GET`` (7.0 on)."""
    try:
        major = int(redis_version.split(".")[0])
    except ValueError:
        return True  # not a version we can read: let the first claim tell
    return major >= 7


def attempt_key(dedup_key: str) -> str:
    return f"{ATTEMPT_PREFIX}{dedup_key}"


class Claim(enum.IntEnum):
    """What ``AttemptGuard.claim_many`` found for an attempt, when it did not start a run.

    A claim is an ``int``: these two values, or the number (>= 1) of the run
    it started (the lease is ours: run the handler).
    """

    DONE = 0  # the attempt already succeeded: ack without running
    BUSY = -1  # another run holds the lease: leave the entry pending, count nothing


class AttemptGuard:
    """The attempt keys of task attempts, for one worker process."""

    def __init__(
        self, client: RedisClient, *, owner: str, lease_ttl_ms: int, done_ttl_ms: int
    ) -> None:
        self._client = client
        # '|' separates the parts of an attempt's value.
        self._token = f"{owner.replace('|', '_')}:{uuid.uuid4().hex[:12]}"
        self.lease_ttl_ms = lease_ttl_ms
        self.done_ttl_ms = done_ttl_ms
        self._renew = client.register_script(_RENEW)
        self._let_go = client.register_script(_LET_GO)
        self._claim = client.register_script(_CLAIM)
        self._cluster = isinstance(client, RedisCluster)

    @property
    def client(self) -> RedisClient:
        return self._client

    def on(self, client: RedisClient) -> AttemptGuard:
        """This guard's leases (same token and TTLs) through another client."""
        twin = AttemptGuard(
            client, owner="", lease_ttl_ms=self.lease_ttl_ms, done_ttl_ms=self.done_ttl_ms
        )
        twin._token = self._token
        return twin

    @property
    def token(self) -> str:
        """What the values of the leases this guard holds name as their holder."""
        return self._token

    async def check(self) -> None:
        """Raise ``ConfigError`` unless Redis can run the scripts: version and permissions.

        A first claim is one ``SET NX GET`` (Redis 7.0 on), and leases are timed
        by Redis's clock (``TIME``), which the worker's ACL of 0.1.0 did not
        allow: without either, every claim would fail and every entry stay pending.
        """
        try:
            await self._client.time()
        except NoPermissionError as exc:
            raise ConfigError(
                "the worker's Redis user may not run TIME, which times task leases: "
                f"add +time to its ACL (see docs/security.md): {exc}"
            ) from None
        try:
            infos = await server_infos(self._client, "server")
        except RedisError as exc:  # INFO refused (a proxy, say): the first claim will tell
            log.debug("could not read the Redis version: %s", exc)
            return
        for version in {str(info.get("redis_version", "?")) for info in infos}:
            if not supports_claims(version):
                raise ConfigError(
                    f"Redis {version} is too old for the worker: it needs 7.0 or later"
                )

    async def claim_many(self, dedup_keys: Sequence[str]) -> list[int]:
        """Per attempt, in order: take its lease (counting the run), read its done mark.

        One round trip for the whole batch. A key given twice is acquired at most
        once: the later copy is ``BUSY`` unless the attempt is done.
        """
        if not dedup_keys:
            return []
        # As bytes: redis-py packs bytes at half the cost of str, on the hot path.
        keys = [attempt_key(key).encode() for key in dedup_keys]
        args = (self._token, self.lease_ttl_ms, self.done_ttl_ms)
        return [n for claims in await self._run(self._claim, keys, args) for n in claims]

    async def mark_done_many(self, dedup_keys: Sequence[str]) -> None:
        """Write the done marks of ``dedup_keys`` in one pipelined round trip."""
        if not dedup_keys:
            return
        pipe = self._client.pipeline(transaction=False)
        self.add_done_marks(pipe, dedup_keys)
        await pipe.execute()

    def add_done_marks(self, pipe: RedisPipeline, dedup_keys: Sequence[str]) -> None:
        """Queue the done marks of ``dedup_keys`` on ``pipe``; the caller executes it."""
        for key in dedup_keys:
            pipe.set(attempt_key(key), DONE, px=self.done_ttl_ms)

    async def unclaim_many(self, dedup_keys: Sequence[str]) -> None:
        """Undo the claims of ``dedup_keys`` whose runs never started: lease and run count.

        Only leases still ours are touched.
        """
        await self._let_go_of(dedup_keys, uncount=1)

    async def renew(self, dedup_key: str) -> bool:
        """Push the lease's end a full TTL ahead; False if it is no longer ours."""
        kept = await self._renew(
            keys=[attempt_key(dedup_key)], args=[self._token, self.lease_ttl_ms]
        )
        return bool(kept)

    async def release(self, dedup_key: str) -> None:
        """Let go of the lease if it is still ours, keeping the run (a failed run: a retry
        takes it)."""
        await self._let_go_of([dedup_key], uncount=0)

    async def forget(self, dedup_key: str) -> None:
        """Drop the attempt's run count and lease: it was dead-lettered.

        A replay of the dead letter then starts with a fresh run budget.
        """
        await self._client.delete(attempt_key(dedup_key))

    async def _let_go_of(self, dedup_keys: Sequence[str], *, uncount: int) -> None:
        if not dedup_keys:
            return
        keys = [attempt_key(key) for key in dedup_keys]
        await self._run(self._let_go, keys, (self._token, uncount))

    async def _run(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Sequence[EncodableT]
    ) -> list[Any]:
        """``script`` over ``keys``: one call on standalone Redis, one per key on Cluster
        (the keys live in many slots); the replies of its calls."""
        if self._cluster:
            return await self._each_key(script, keys, args)
        return [await script(keys=keys, args=args)]

    async def _each_key(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Sequence[EncodableT]
    ) -> list[Any]:
        """``script`` once per key, in one pipeline (Redis Cluster: each on its key's node).

        A node that does not know the script yet (a new or failed-over primary)
        answers NOSCRIPT: the script is loaded on every primary and those calls
        alone are sent again. Any other error is raised once all replies are in.
        """
        replies: list[Any] = [None] * len(keys)
        todo = list(range(len(keys)))
        for loaded in (False, True):
            pipe = self._client.pipeline(transaction=False)
            for i in todo:
                pipe.evalsha(script.sha, 1, keys[i], *args)
            for i, reply in zip(todo, await pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
            todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
            if not todo or loaded:
                break
            await self._client.script_load(script.script)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies


def aligned(keys: list[str | None], claims: list[int]) -> list[int | None]:
    """The claim of each entry (None for a malformed one, which was not claimed)."""
    found = iter(claims)
    return [next(found) if key is not None else None for key in keys]
