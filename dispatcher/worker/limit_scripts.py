"""The queue limits in Redis: a slot and a token taken with the attempt's lease, atomically.

``LimitScripts.claim`` is ``AttemptGuard.claim_many`` for a queue with
limits. On standalone Redis it is one script (``_LIMITED_CLAIM``): for each
attempt that would start a run, a slot (``max_in_flight``) and a token
(``rate``/``burst``, GCRA on Redis's clock) are taken with its lease; an
attempt that finds none is left untouched (no lease, no run counted) and
comes back as ``WAIT``, and so do the attempts after it in the batch that
would need one (first come, first served). Attempts that are done, busy, or
out of runs take nothing. A slot is a member ``<token>|<attempt key>`` of
the queue's ``running`` set, scored by the lease's end: renewed with the
lease (``renew``), removed when the run ends (``release``), and dropped by
the next claim once its lease ended without a renewal (its worker died).

On Redis Cluster the attempt keys live in many hash slots and the limits'
keys in their queue's, and a script may touch one slot only: the slots and
tokens are reserved first (``_RESERVE``, one script on the queue's keys),
then the leases of the attempts that got one are claimed as without limits,
and the reservations of those that do not run are released. Three round
trips instead of one, and a reservation made for an attempt that turns out
done or busy costs its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import RedisCluster
from redis.typing import EncodableT

from dispatcher.redis_client import RedisClient
from dispatcher.stream.limits import QueueLimits, running_key, tokens_key
from dispatcher.worker.dedup import _PRELUDE, AttemptGuard, attempt_key

__all__ = ["WAIT", "Claimed", "LimitScripts"]

# A claim's answer for an attempt that found no slot or token: nothing was taken.
WAIT = -2

# The limits' part of both claim scripts: open (drop ended slots, read the bucket),
# take one slot and token per run, close (write the bucket; the usage left).
_LIMITS = """
local L = {}
local function limits_open(running, tat_key, max_in_flight, interval, bucket, ttl, releases)
  L.running, L.tat_key, L.max, L.ttl = running, tat_key, max_in_flight, ttl
  L.interval, L.tolerance, L.moved = interval, interval * bucket, false
  for _, member in ipairs(releases) do
    redis.call('zrem', running, member)
  end
  redis.call('zremrangebyscore', running, '-inf', now)
  L.in_use = redis.call('zcard', running)
  L.tat = tonumber(redis.call('get', tat_key)) or 0
  if L.tat < now then
    L.tat = now
  end
end
local function limits_take(member)
  if L.max > 0 and L.in_use >= L.max then
    return false
  end
  if L.interval > 0 then
    if L.tat + L.interval - now > L.tolerance + 0.001 then
      return false
    end
    L.tat, L.moved = L.tat + L.interval, true
  end
  redis.call('zadd', L.running, now + L.ttl, member)
  L.in_use = L.in_use + 1
  return true
end
local function limits_close()
  if L.moved then
    local keep = math.ceil(L.tat - now) + 1000
    redis.call('set', L.tat_key, string.format('%.3f', L.tat), 'PX', keep)
  end
  redis.call('pexpire', L.running, L.ttl * 3)
  local tokens = -1
  if L.interval > 0 then
    tokens = math.floor((now + L.tolerance - L.tat) / L.interval + 0.001)
  end
  return L.in_use, tokens
end
local function releases_from(first)
  local found = {}
  for i = first + 1, first + tonumber(ARGV[first]) do
    found[#found + 1] = ARGV[i]
  end
  return found
end
"""

# KEYS: attempt keys, then running, tat. ARGV: token, lease TTL ms, attempt TTL ms,
# max runs, max in flight (0: none), token interval ms (0: no rate), bucket,
# n releases, the n members to release. Replies: one claim per attempt (as
# ``_CLAIM``, or -2: wait), then slots in use and tokens left (-1: no rate).
_LIMITED_CLAIM = (
    _PRELUDE
    + _LIMITS
    + """
local n = #KEYS - 2
local token, max_runs = ARGV[1], tonumber(ARGV[4])
limits_open(KEYS[n + 1], KEYS[n + 2], tonumber(ARGV[5]), tonumber(ARGV[6]),
  tonumber(ARGV[7]), tonumber(ARGV[2]), releases_from(8))
local lease = '|' .. token .. '|' .. string.format('%d', now + tonumber(ARGV[2]))
local found, waiting = {}, false
for i = 1, n do
  local was = redis.call('get', KEYS[i])
  if was == 'done' then
    found[i] = 0
  else
    local runs, holder, ends = 0, nil, nil
    if was then
      runs, holder, ends = parse(was)
    end
    if holder and ends > now then
      found[i] = -1
    elseif runs >= max_runs or (not waiting and limits_take(token .. '|' .. KEYS[i])) then
      runs = runs + 1
      if was then
        redis.call('set', KEYS[i], runs .. lease, 'KEEPTTL')
      else
        redis.call('set', KEYS[i], runs .. lease, 'PX', ARGV[3])
      end
      found[i] = runs
    else
      waiting, found[i] = true, -2
    end
  end
end
found[n + 1], found[n + 2] = limits_close()
return found
"""
)

# KEYS: running, tat. ARGV: max in flight, interval ms, bucket, slot TTL ms, n releases,
# the n members, then the members wanting a slot, in order. Replies: how many of
# them got one (the first ones), slots in use, tokens left (-1: no rate).
_RESERVE = (
    _PRELUDE
    + _LIMITS
    + """
local first = 6 + tonumber(ARGV[5])
limits_open(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), releases_from(5))
local granted = 0
for i = first, #ARGV do
  if not limits_take(ARGV[i]) then
    break
  end
  granted = granted + 1
end
local in_use, tokens = limits_close()
return {granted, in_use, tokens}
"""
)

# KEYS: running. ARGV: slot TTL ms, members. Pushes the end of the slots still held.
_RENEW = (
    _PRELUDE
    + """
for i = 2, #ARGV do
  redis.call('zadd', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
end
redis.call('pexpire', KEYS[1], tonumber(ARGV[1]) * 3)
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

    def member(self, dedup_key: str) -> str:
        """The slot a run of ``dedup_key`` holds, in its queue's ``running`` set."""
        return f"{self._guard.token}|{attempt_key(dedup_key)}"

    def _limit_args(self, limits: QueueLimits) -> list[EncodableT]:
        return [limits.max_in_flight or 0, limits.interval_ms, limits.bucket]

    async def claim(
        self, queue: str, limits: QueueLimits, dedup_keys: Sequence[str], releases: Sequence[str]
    ) -> Claimed:
        """Claim ``dedup_keys`` within the queue's limits; ``releases`` are freed first."""
        if self._cluster:
            return await self._claim_on_cluster(queue, limits, dedup_keys, releases)
        guard = self._guard
        keys = [*(attempt_key(k) for k in dedup_keys), running_key(queue), tokens_key(queue)]
        args: list[EncodableT] = [guard.token, guard.lease_ttl_ms, guard.done_ttl_ms]
        args += [self._max_runs, *self._limit_args(limits), len(releases), *releases]
        found = [int(n) for n in await self._claim(keys=keys, args=args)]
        return Claimed(found[:-2], found[-2], None if found[-1] < 0 else found[-1])

    async def _claim_on_cluster(
        self, queue: str, limits: QueueLimits, dedup_keys: Sequence[str], releases: Sequence[str]
    ) -> Claimed:
        members = [self.member(key) for key in dedup_keys]
        args = [*self._limit_args(limits), self._guard.lease_ttl_ms, len(releases), *releases]
        granted, in_use, tokens = (
            int(n)
            for n in await self._reserve(
                keys=[running_key(queue), tokens_key(queue)], args=[*args, *members]
            )
        )
        claims = await self._guard.claim_many(dedup_keys[:granted])
        unused = [m for m, n in zip(members, claims, strict=False) if not 0 < n <= self._max_runs]
        if unused:
            await self.release(queue, unused)
        claims += [WAIT] * (len(dedup_keys) - granted)
        return Claimed(claims, in_use - len(unused), None if tokens < 0 else tokens)

    async def claim_unlimited(self, dedup_keys: Sequence[str]) -> list[int]:
        """The claims of a queue whose limits were just removed: as without limits."""
        return await self._guard.claim_many(dedup_keys)

    async def renew(self, queue: str, members: Sequence[str]) -> None:
        """Push the end of these slots (still held) a full lease TTL ahead."""
        if members:
            await self._renew(keys=[running_key(queue)], args=[self._guard.lease_ttl_ms, *members])

    async def release(self, queue: str, members: Sequence[str]) -> None:
        if members:
            await self._client.zrem(running_key(queue), *members)
