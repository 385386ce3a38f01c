"""Task attempts in Redis: a lease while a run goes on, a run count, then a done mark.

Delivery is at-least-once (the outbox may publish a row twice, a worker may
die with entries in hand). Two Redis keys per task attempt
(``TaskMessage.dedup_key`` = ``<run_id>:<task_id>:<attempt>``) turn
duplicates into no-ops and count the attempt's runs:

- ``dispatcher:lease:<key>`` — SET NX PX with this worker's token before the
  handler runs, renewed while the run lasts (``leases.py``), deleted (only if
  still ours) when the run ends without success. While it exists, no other
  delivery of the attempt runs: that delivery stays pending, is not counted,
  and is reclaimed later.
- ``dispatcher:attempt:<key>`` — the number of runs started (a run is a
  handler start; taking the lease starts one), then ``done`` once a run
  succeeded, kept for the dedup window (default 24 h) and always written
  before the entry is acked (``settle.py``). A delivery of a done attempt is
  acked without running. A run whose worker died still counts: its lease
  expires, its count stays.

``claim_many`` takes the leases, counts the runs and reads the done marks of
a whole read batch in one round trip: on standalone Redis one script call
(``_CLAIM``), on Redis Cluster one pipeline of single-key commands, then a
second one that counts the runs of the leases it took.

After a success the lease is left to expire rather than deleted, so a
duplicate that read "not done" just before the done mark was written cannot
take the lease until long after the mark exists.

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
- On Redis Cluster the two keys live in different slots; every operation is
  a single-key command (or a single-key script), pipelined but never a
  multi-key transaction, so there is no atomicity across them beyond the
  ordering above. (On standalone Redis the batch scripts are atomic, which
  the guarantees above do not rely on.)
- The keys are independent of the stream: a failover that loses recent
  writes on a replica-less primary can lose a done mark or a count too.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections.abc import Sequence

from redis.asyncio import RedisCluster

from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisPipeline

__all__ = ["DONE", "AttemptGuard", "Claim", "attempt_key", "lease_key"]

log = logging.getLogger(__name__)

LEASE_PREFIX = "dispatcher:lease:"
ATTEMPT_PREFIX = "dispatcher:attempt:"
# The attempt key's value once a run succeeded; before that, the runs started.
DONE = "done"

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS: lease and attempt key of each attempt, in pairs; ARGV: token, lease TTL
# ms, attempt TTL ms. One integer per attempt: 0 done, -1 busy (a run holds the
# lease), n > 0 the lease is ours and this is run n. A first delivery, the common
# case, costs two calls: the count is written first (SET NX: no count yet), and
# taken back if another run holds the lease after all.
_CLAIM = """
local found = {}
for i = 1, #KEYS, 2 do
  if redis.call('set', KEYS[i + 1], 1, 'NX', 'PX', ARGV[3]) then
    if redis.call('set', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
      found[#found + 1] = 1
    else
      redis.call('del', KEYS[i + 1])
      found[#found + 1] = -1
    end
  else
    local runs = redis.call('get', KEYS[i + 1])
    if runs == 'done' then
      found[#found + 1] = 0
    elseif redis.call('set', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
      runs = (tonumber(runs) or 0) + 1
      redis.call('set', KEYS[i + 1], runs, 'KEEPTTL')
      found[#found + 1] = runs
    else
      found[#found + 1] = -1
    end
  end
end
return found
"""
# KEYS: lease and attempt key of each attempt, in pairs; ARGV: token. Undoes a claim whose
# run never started: the lease goes, and so does the run it counted.
_UNCLAIM = """
for i = 1, #KEYS, 2 do
  if redis.call('get', KEYS[i]) == ARGV[1] then
    local runs = tonumber(redis.call('get', KEYS[i + 1]))
    if runs and runs > 1 then
      redis.call('set', KEYS[i + 1], runs - 1, 'KEEPTTL')
    elseif runs then
      redis.call('del', KEYS[i + 1])
    end
    redis.call('del', KEYS[i])
  end
end
return 0
"""
# KEYS: one attempt key; takes back one counted run (a claim whose run never started).
_UNCOUNT = """
local runs = tonumber(redis.call('get', KEYS[1]))
if runs and runs > 1 then
  return redis.call('set', KEYS[1], runs - 1, 'KEEPTTL')
elseif runs then
  return redis.call('del', KEYS[1])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


def lease_key(dedup_key: str) -> str:
    return f"{LEASE_PREFIX}{dedup_key}"


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
    """Lease and attempt keys of task attempts, for one worker process."""

    def __init__(
        self, client: RedisClient, *, owner: str, lease_ttl_ms: int, done_ttl_ms: int
    ) -> None:
        self._client = client
        self._token = f"{owner}:{uuid.uuid4().hex[:12]}"
        self.lease_ttl_ms = lease_ttl_ms
        self.done_ttl_ms = done_ttl_ms
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._claim = client.register_script(_CLAIM)
        self._unclaim = client.register_script(_UNCLAIM)
        self._uncount = client.register_script(_UNCOUNT)
        self._cluster = isinstance(client, RedisCluster)

    async def claim_many(self, dedup_keys: Sequence[str]) -> list[int]:
        """Per attempt, in order: take its lease (counting the run), read its done mark.

        One round trip for the whole batch. A key given twice is acquired at most
        once (SET NX): the later copy is ``BUSY`` unless the attempt is done.
        """
        if not dedup_keys:
            return []
        if self._cluster:
            return await self._claim_pipelined(dedup_keys)
        # As bytes: redis-py packs bytes at half the cost of str, on the hot path.
        keys = [k.encode() for key in dedup_keys for k in (lease_key(key), attempt_key(key))]
        found: list[int] = await self._claim(
            keys=keys, args=[self._token, self.lease_ttl_ms, self.done_ttl_ms]
        )
        return found

    async def _claim_pipelined(self, dedup_keys: Sequence[str]) -> list[int]:
        """Per key: SET NX the lease, GET the attempt; then count runs, let go of done ones."""
        pipe = self._client.pipeline(transaction=False)
        for key in dedup_keys:
            pipe.set(lease_key(key), self._token, nx=True, px=self.lease_ttl_ms)
            pipe.get(attempt_key(key))
        replies = await pipe.execute()
        claims: list[int] = []
        count = self._client.pipeline(transaction=False)
        taken_but_done = []
        for key, acquired, runs in zip(dedup_keys, replies[0::2], replies[1::2], strict=True):
            if runs == DONE:
                claims.append(Claim.DONE)
                if acquired:
                    taken_but_done.append(key)
            elif not acquired:
                claims.append(Claim.BUSY)
            elif runs is None:
                claims.append(1)
                count.set(attempt_key(key), 1, px=self.done_ttl_ms)
            else:
                claims.append(_as_int(runs) + 1)
                count.set(attempt_key(key), claims[-1], keepttl=True)
        if len(count):
            await count.execute()
        if taken_but_done:
            await asyncio.gather(*(self.release(key) for key in taken_but_done))
        return claims

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

        Only leases still ours are touched. On Cluster the two keys live in
        different slots: the count is taken back while the lease (still ours,
        checked first) keeps other workers off the attempt, then the lease goes.
        """
        if not dedup_keys:
            return
        if not self._cluster:
            keys = [k for key in dedup_keys for k in (lease_key(key), attempt_key(key))]
            await self._unclaim(keys=keys, args=[self._token])
            return
        pipe = self._client.pipeline(transaction=False)
        for key in dedup_keys:
            pipe.get(lease_key(key))
        ours = [
            k
            for k, holder in zip(dedup_keys, await pipe.execute(), strict=True)
            if holder == self._token
        ]
        await asyncio.gather(*(self._uncount(keys=[attempt_key(k)]) for k in ours))
        await asyncio.gather(*(self.release(k) for k in ours))

    async def renew(self, dedup_key: str) -> bool:
        """Push the lease's expiry a full TTL ahead; False if it is no longer ours."""
        kept = await self._renew(keys=[lease_key(dedup_key)], args=[self._token, self.lease_ttl_ms])
        return bool(kept)

    async def release(self, dedup_key: str) -> None:
        """Delete the lease if it is still ours (a failed run: let a retry take it)."""
        await self._release(keys=[lease_key(dedup_key)], args=[self._token])

    async def forget(self, dedup_key: str) -> None:
        """Drop the attempt's run count and our lease: it was dead-lettered.

        A replay of the dead letter then starts with a fresh run budget.
        """
        await asyncio.gather(self._client.delete(attempt_key(dedup_key)), self.release(dedup_key))


def _as_int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0
