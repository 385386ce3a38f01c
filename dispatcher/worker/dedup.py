"""Duplicate suppression for task attempts: a lease while running, a done mark after.

Delivery is at-least-once (the outbox may publish a row twice, a reclaim may
hand out an entry whose first run is still going). Two Redis keys per task
attempt (``TaskMessage.dedup_key`` = ``<task_id>:<attempt>``) turn most
duplicates into no-ops:

- ``dispatcher:lease:<task_id>:<attempt>`` — SET NX PX with this worker's
  token before the handler runs, renewed while a run lasts longer than a
  third of its TTL (``leases.py``), deleted (only if still ours) when the
  handler fails. While it exists, no other delivery of the attempt runs: that
  delivery stays pending and is reclaimed later.
- ``dispatcher:done:<task_id>:<attempt>`` — written after the handler
  succeeded, kept for the dedup window (default 24 h), and always before the
  entry is acked (``settle.py``). A delivery of a done attempt is acked
  without running.

``claim_many`` takes the leases and reads the done marks of a whole read
batch in one round trip: on standalone Redis one script call (``_CLAIM``,
which reads the done mark first and takes no lease for a done attempt), on
Redis Cluster one pipeline of single-key commands.

After a success the lease is left to expire rather than deleted, so a
duplicate that read "not done" just before the done mark was written cannot
take the lease until long after the mark exists.

What this does *not* guarantee (be honest with handler authors):

- Effectively-once only within the dedup window; an attempt re-delivered
  after its done key expired runs again.
- A crash (or a lost connection) between the handler's success and the done
  write re-runs the attempt: handlers must still be idempotent.
- A lease that expires while the handler is still running (the process is
  stalled longer than the TTL, or Redis is unreachable for that long) lets
  another worker run the same attempt concurrently.
- Different attempts of one task (``attempt`` 1, 2...) are different
  identities by design: a retry is meant to run.
- On Redis Cluster the two keys live in different slots; every operation is
  a single-key command (or a single-key script), pipelined but never a
  multi-key transaction, so there is no atomicity across them beyond the
  ordering above. (On standalone Redis the batch scripts are atomic, which
  the guarantees above do not rely on.)
- The keys are independent of the stream: a failover that loses recent
  writes on a replica-less primary can lose a done mark too.
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

__all__ = ["AttemptGuard", "Claim", "done_key", "lease_key"]

log = logging.getLogger(__name__)

LEASE_PREFIX = "dispatcher:lease:"
DONE_PREFIX = "dispatcher:done:"

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS: lease and done key of each attempt, in pairs; ARGV: token, lease TTL ms.
# One character per attempt: D done, A lease acquired, B busy (held by a run).
_CLAIM = """
local found = {}
for i = 1, #KEYS, 2 do
  if redis.call('exists', KEYS[i + 1]) == 1 then
    found[#found + 1] = 'D'
  elseif redis.call('set', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    found[#found + 1] = 'A'
  else
    found[#found + 1] = 'B'
  end
end
return table.concat(found)
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


def lease_key(dedup_key: str) -> str:
    return f"{LEASE_PREFIX}{dedup_key}"


def done_key(dedup_key: str) -> str:
    return f"{DONE_PREFIX}{dedup_key}"


class Claim(enum.Enum):
    """What ``AttemptGuard.claim`` found for one delivery."""

    ACQUIRED = "acquired"  # the lease is ours: run the handler
    DONE = "done"  # the attempt already succeeded: ack without running
    BUSY = "busy"  # another run holds the lease: leave the entry pending


class AttemptGuard:
    """Lease and done keys of task attempts, for one worker process."""

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
        self._cluster = isinstance(client, RedisCluster)

    async def claim(self, dedup_key: str) -> Claim:
        """Try to take the lease and read the done mark in one round trip."""
        (claim,) = await self.claim_many([dedup_key])
        return claim

    async def claim_many(self, dedup_keys: Sequence[str]) -> list[Claim]:
        """``claim`` for many attempts in one round trip, in order.

        A key given twice is acquired at most once (SET NX): the later copy is
        ``BUSY`` unless the attempt is done.
        """
        if not dedup_keys:
            return []
        if self._cluster:
            return await self._claim_pipelined(dedup_keys)
        # As bytes: redis-py packs bytes at half the cost of str, on the hot path.
        keys = [k.encode() for key in dedup_keys for k in (lease_key(key), done_key(key))]
        found = await self._claim(keys=keys, args=[self._token, self.lease_ttl_ms])
        return [_CLAIMS[c] for c in found]

    async def _claim_pipelined(self, dedup_keys: Sequence[str]) -> list[Claim]:
        """Per key: SET NX the lease, EXISTS the done mark; let go of leases of done attempts."""
        pipe = self._client.pipeline(transaction=False)
        for key in dedup_keys:
            pipe.set(lease_key(key), self._token, nx=True, px=self.lease_ttl_ms)
            pipe.exists(done_key(key))
        replies = await pipe.execute()
        acquired, done = replies[0::2], replies[1::2]
        taken_but_done = [k for k, a, d in zip(dedup_keys, acquired, done, strict=True) if a and d]
        if taken_but_done:
            await asyncio.gather(*(self.release(key) for key in taken_but_done))
        return [_claim_of(bool(a), bool(d)) for a, d in zip(acquired, done, strict=True)]

    async def mark_done(self, dedup_key: str) -> None:
        await self.mark_done_many([dedup_key])

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
            pipe.set(done_key(key), "1", px=self.done_ttl_ms)

    async def renew(self, dedup_key: str) -> bool:
        """Push the lease's expiry a full TTL ahead; False if it is no longer ours."""
        kept = await self._renew(keys=[lease_key(dedup_key)], args=[self._token, self.lease_ttl_ms])
        return bool(kept)

    async def release(self, dedup_key: str) -> None:
        """Delete the lease if it is still ours (a failed run: let a retry take it)."""
        await self._release(keys=[lease_key(dedup_key)], args=[self._token])


_CLAIMS = {"A": Claim.ACQUIRED, "D": Claim.DONE, "B": Claim.BUSY}


def _claim_of(acquired: bool, done: bool) -> Claim:
    if done:
        return Claim.DONE
    return Claim.ACQUIRED if acquired else Claim.BUSY
