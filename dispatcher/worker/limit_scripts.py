"""The queue limits in Redis: slots and tokens taken with the attempts' leases, atomically.

A queue's slots in use are counted per worker process:
``dispatcher:limits:{<queue>}:held`` (a hash: worker token -> runs holding a
slot) and ``dispatcher:limits:{<queue>}:alive`` (a sorted set: worker token
-> the end of its slots, Redis's clock in ms, pushed a lease TTL ahead while
it runs, as its leases are). A worker that stops renewing (it died, or
stalled past the lease TTL) has its count dropped by the next claim once
that end has passed: its slots come back when its leases end. The bucket is
``dispatcher:limits:{<queue>}:tat`` (GCRA: the theoretical arrival time).

``LimitScripts.claim`` is ``AttemptGuard.claim_many`` for a queue with
limits. On standalone Redis it is one script (``_LIMITED_CLAIM``): while a
slot and a token are left, an attempt is claimed exactly as without limits
(one ``SET NX GET`` for a first delivery), and a run it starts takes one of
each; once none is left, an attempt that would run is left untouched (no
lease, no run counted) and comes back as ``WAIT``. Attempts that are done,
busy, or out of runs take nothing. The slots and the bucket are updated
once per call, not per attempt, and freed slots travel with the next claim.

On Redis Cluster the attempt keys live in many hash slots and the limits'
keys in their queue's, and a script may touch one slot only: slots and
tokens are reserved first (``_RESERVE``), then the leases of as many
attempts claimed as without limits, and the reservations of those that do
not run are freed: three round trips instead of one, and a reservation made
for an attempt that turns out done or busy costs its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import RedisCluster
from redis.typing import EncodableT, KeyT

from dispatcher.redis_client import RedisClient
from dispatcher.stream.limit_keys import QueueLimits, alive_key, held_key, tokens_key
from dispatcher.worker.dedup import _PRELUDE, AttemptGuard, attempt_key

__all__ = ["WAIT", "Claimed", "LimitScripts"]

# A claim's answer for an attempt that found no slot or token: nothing was taken.
WAIT = -2

# The limits' part of both claim scripts. KEYS[n+1..n+3]: held, alive, tat. ARGV from
# ``first``: token, slot TTL ms, max in flight (0: none), token interval ms (0: no rate),
# bucket, slots this worker frees. ``limits_open`` frees them, drops the slots of workers
# whose end passed and answers how many runs may start; ``limits_close`` takes ``taken``.
_LIMITS = """
local L = {}
local function limits_open(n, first)
  L.held, L.alive, L.tat_key = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
  L.token, L.ttl, L.max = ARGV[first], tonumber(ARGV[first + 1]), tonumber(ARGV[first + 2])
  L.interval = tonumber(ARGV[first + 3])
  L.tolerance = L.interval * tonumber(ARGV[first + 4])
  local freed = tonumber(ARGV[first + 5])
  local ends = tonumber(on(L.alive, 'zscore', L.alive, L.token))
  if freed > 0 and ends and ends > now then
    local mine = tonumber(on(L.held, 'hget', L.held, L.token)) or 0
    redis.call('hset', L.held, L.token, math.max(mine - freed, 0))
  end
  -- Slots count while their worker's end lies ahead, and no further ahead than a worker
  -- pushes it (a slot TTL, three of them at most across workers of other settings): an
  -- end past that, or a count that is not a count, was written by no worker and goes.
  local horizon = now + L.ttl * 3
  local live = {}
  for _, token in ipairs(redis.call('zrangebyscore', L.alive, now, string.format('%d', horizon))) do
    live[token] = true
  end
  redis.call('zremrangebyscore', L.alive, '-inf', string.format('(%d', now))
  redis.call('zremrangebyscore', L.alive, string.format('(%d', horizon), '+inf')
  L.in_use = 0
  local held = on(L.held, 'hgetall', L.held)
  for i = 1, #held, 2 do
    local count = tonumber(held[i + 1])
    if live[held[i]] and count and count >= 0 and count <= 1e9 then
      L.in_use = L.in_use + math.floor(count)
    else
      redis.call('hdel', L.held, held[i])
    end
  end
  L.tat = tonumber(on(L.tat_key, 'get', L.tat_key)) or 0
  if L.tat < now or L.tat > now + L.tolerance + L.interval then
    L.tat = now  -- not a number, or further ahead than a claim puts it: as if absent
  end
  local room = 1e9
  if L.max > 0 then
    room = math.max(L.max - L.in_use, 0)
  end
  if L.interval > 0 then
    room = math.min(room, math.floor((now + L.tolerance - L.tat) / L.interval + 0.001))
  end
  return room
end
local function limits_close(taken)
  if taken > 0 then
    local mine = tonumber(redis.call('hget', L.held, L.token)) or 0
    redis.call('hset', L.held, L.token, mine + taken)
    redis.call('zadd', L.alive, now + L.ttl, L.token)
    redis.call('pexpire', L.held, L.ttl * 3)
    redis.call('pexpire', L.alive, L.ttl * 3)
    L.in_use = L.in_use + taken
    if L.interval > 0 then
      L.tat = L.tat + taken * L.interval
      local keep = math.ceil(L.tat - now) + 1000
      redis.call('set', L.tat_key, string.format('%.3f', L.tat), 'PX', keep)
    end
  end
  local tokens = -1
  if L.interval > 0 then
    tokens = math.max(math.floor((now + L.tolerance - L.tat) / L.interval + 0.001), 0)
  end
  return L.in_use, tokens
end
"""

# KEYS: attempt keys, then held, alive, tat. ARGV: lease TTL ms, attempt TTL ms, max
# runs, then the limits' (from 4). Replies: one claim per attempt (as ``_CLAIM``, or
# -2: wait), then slots in use and tokens left (-1: no rate).
_LIMITED_CLAIM = (
    _PRELUDE
    + _LIMITS
    + """
local n = #KEYS - 3
local room = limits_open(n, 4)
local max_runs, taken = tonumber(ARGV[3]), 0
local lease = '|' .. ARGV[4] .. '|' .. string.format('%d', now + tonumber(ARGV[1]))
local found = {}
for i = 1, n do
  local was
  if taken < room then
    was = on(KEYS[i], 'set', KEYS[i], '1' .. lease, 'NX', 'GET', 'PX', ARGV[2])
  else
    was = on(KEYS[i], 'get', KEYS[i])
  end
  if not was and taken < room then
    found[i], taken = 1, taken + 1
  elseif was == 'done' then
    found[i] = 0
  else
    local runs, holder, ends = 0, nil, nil
    if was then
      runs, holder, ends = parse(was)
    end
    if holder and ends > now then
      found[i] = -1
    elseif runs >= max_runs or taken < room then
      if runs < max_runs then
        taken = taken + 1
      end
      runs = runs + 1
      if was then
        redis.call('set', KEYS[i], runs .. lease, 'KEEPTTL')
      else
        redis.call('set', KEYS[i], runs .. lease, 'PX', ARGV[2])
      end
      found[i] = runs
    else
      found[i] = -2
    end
  end
end
found[n + 1], found[n + 2] = limits_close(taken)
return found
"""
)

# KEYS: held, alive, tat. ARGV: the limits' (from 1), then how many runs are wanted.
# Replies: how many may start (reserved), slots in use, tokens left (-1: no rate).
_RESERVE = (
    _PRELUDE
    + _LIMITS
    + """
local room = limits_open(0, 1)
local taken = math.min(room, tonumber(ARGV[7]))
local in_use, tokens = limits_close(taken)
return {taken, in_use, tokens}
"""
)

# KEYS: held, alive. ARGV: token, slot TTL ms, the runs this worker holds. Sets its count
# to what it holds and pushes the end of its slots (a count that drifted, after a reply
# lost, is right again; a worker that stalled past its end counts again).
_RENEW = (
    _PRELUDE
    + """
local held, alive, token, ttl = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2])
if tonumber(ARGV[3]) > 0 then
  on(held, 'hset', held, token, ARGV[3])
  on(alive, 'zadd', alive, now + ttl, token)
  redis.call('pexpire', held, ttl * 3)
  redis.call('pexpire', alive, ttl * 3)
else
  on(held, 'hdel', held, token)
  on(alive, 'zrem', alive, token)
end
return 0
"""
)


@dataclass(frozen=True, slots=True)
class Claimed:
    """One limited claim: a claim per attempt (``WAIT`` included), and the usage it saw."""

    claims: list[int]
    in_use: int
    tokens: int | None


class LimitScripts:
    """The limit scripts of one worker process, over its ``AttemptGuard``."""

    def __init__(self, client: RedisClient, guard: AttemptGuard, *, max_runs: int) -> None:
        self._client = client
        self._guard = guard
        self._max_runs = max_runs
        self._cluster = isinstance(client, RedisCluster)
        self._claim = client.register_script(_LIMITED_CLAIM)
        self._reserve = client.register_script(_RESERVE)
        self._renew = client.register_script(_RENEW)

    def _keys(self, queue: str) -> list[KeyT]:
        return [held_key(queue), alive_key(queue), tokens_key(queue)]

    def _limit_args(self, limits: QueueLimits, freed: int) -> list[EncodableT]:
        ttl = self._guard.lease_ttl_ms
        rate = [limits.interval_ms, limits.bucket]
        return [self._guard.token, ttl, limits.max_in_flight or 0, *rate, freed]

    async def claim(
        self, queue: str, limits: QueueLimits, dedup_keys: Sequence[str], *, freed: int
    ) -> Claimed:
        """Claim ``dedup_keys`` within the queue's limits; ``freed`` slots are given back first."""
        if self._cluster:
            return await self._claim_on_cluster(queue, limits, dedup_keys, freed)
        guard = self._guard
        # As bytes, as AttemptGuard.claim_many does: redis-py packs them at half the cost.
        keys: list[KeyT] = [attempt_key(k).encode() for k in dedup_keys]
        keys += self._keys(queue)
        args = [guard.lease_ttl_ms, guard.done_ttl_ms, self._max_runs]
        found = await self._claim(keys=keys, args=[*args, *self._limit_args(limits, freed)])
        in_use, tokens = int(found[-2]), int(found[-1])  # Lua's integers come back as ints
        return Claimed(found[:-2], in_use, None if tokens < 0 else tokens)

    async def _claim_on_cluster(
        self, queue: str, limits: QueueLimits, dedup_keys: Sequence[str], freed: int
    ) -> Claimed:
        args = [*self._limit_args(limits, freed), len(dedup_keys)]
        granted, in_use, tokens = (
            int(n) for n in await self._reserve(keys=self._keys(queue), args=args)
        )
        claims = await self._guard.claim_many(dedup_keys[:granted])
        unused = sum(1 for n in claims if not 0 < n <= self._max_runs)
        if unused:
            await self.release(queue, limits, unused)
        claims += [WAIT] * (len(dedup_keys) - granted)
        return Claimed(claims, in_use - unused, None if tokens < 0 else tokens)

    async def claim_unlimited(self, dedup_keys: Sequence[str]) -> list[int]:
        """The claims of a queue whose limits were just removed: as without limits."""
        return await self._guard.claim_many(dedup_keys)

    async def renew(self, queue: str, held: int) -> None:
        """This worker holds ``held`` slots of ``queue``: say so, a full lease TTL ahead."""
        args: list[EncodableT] = [self._guard.token, self._guard.lease_ttl_ms, held]
        await self._renew(keys=[held_key(queue), alive_key(queue)], args=args)

    async def release(self, queue: str, limits: QueueLimits, freed: int) -> None:
        """Give back ``freed`` slots of this worker (a reservation of no runs)."""
        args = [*self._limit_args(limits, freed), 0]
        await self._reserve(keys=self._keys(queue), args=args)
