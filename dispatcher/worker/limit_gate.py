"""The queue limits one worker applies: read live, taken with the leases, freed with the runs.

``LimitGate`` reads each of the worker's queues' limits key every
``REFRESH_EVERY`` seconds (``dispatcher.stream.limit_keys``); a key that cannot
be read as limits (not UTF-8, not JSON, not numbers, a key of another type)
keeps the last good value, with a warning once per change. For a queue
with limits, the claim of a read batch goes through ``LimitScripts`` (a slot
and a token per run, in the same round trip as the leases, joined across
concurrent batches); the entries that found no room wait in the worker's
``WaitingRoom``, which its loop per queue retries them from. The worker's
slots of a queue are renewed together every third of the lease TTL, as
leases are; a slot is freed when its entry is settled here: counted, and
sent with the queue's next claim or, if none comes within the loop turn, on
its own. A slot this worker fails to free
comes back when the worker's slots end (it dies, or stops renewing them);
one it holds keeps counting until then. A queue without limits costs a
dictionary lookup per batch.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from redis.exceptions import NoPermissionError, RedisError

from dispatcher.models import MalformedMessage, TaskMessage
from dispatcher.observability import PrefixedMetrics
from dispatcher.outage import Outage
from dispatcher.redis_client import RedisClient, queue_get_raw
from dispatcher.stream.entries import Message
from dispatcher.stream.limit_keys import (
    REFRESH_EVERY,
    InvalidLimits,
    QueueLimits,
    limits_key,
    parse_limits,
)
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.dedup import aligned
from dispatcher.worker.limit_scripts import WAIT, LimitScripts
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.slots import SlotPool
from dispatcher.worker.waiting import WaitingRoom

__all__ = ["LimitGate"]

log = logging.getLogger(__name__)

# Slots freed here wait this long for a claim of their queue to take them along before
# they are sent on their own: a claim follows at once while the queue has work (a read, or
# a waiting entry retried on the free), and another worker's wait for them is polled anyway.
FREE_AFTER = 0.02
Tasks = list[TaskMessage | MalformedMessage]
_NONE = QueueLimits()  # what frees a queue's slots once its limits are gone
Keys = list[str | None]


class LimitGate:
    """The limits of one worker's queues and the slots its runs hold."""

    def __init__(
        self,
        client: RedisClient,
        scripts: LimitScripts,
        *,
        queues: Sequence[str],
        slots: SlotPool,
        waiting: WaitingRoom,
        max_runs: int,
        lease_ttl: float,
        registry: CollectorRegistry,
        outage: Outage,
        refresh_every: float = REFRESH_EVERY,
    ) -> None:
        self._client = client
        self._outage = outage  # the worker's: where Redis being down is said
        self._scripts = scripts
        self._queues = tuple(queues)
        self._slots = slots
        self._max_runs = max_runs
        self._renew_every = lease_ttl / 3
        self._refresh_every = refresh_every
        self.waiting = waiting
        self._limits: dict[str, QueueLimits] = {}
        self._warned: dict[str, str] = {}  # per queue: the last problem said
        self._held: dict[str, set[str]] = {}  # per stream: the entries holding a slot
        self._queue_of: dict[str, str] = {}  # stream -> queue
        self._freed: dict[str, int] = {}  # per queue: slots to give back
        self._unrecorded: collections.Counter[str] = collections.Counter()  # granted, not in _held
        self._flushing: set[asyncio.Task[None]] = set()
        self._claims: dict[str, Coalescer[str, int]] = {}
        # Per queue: claims, frees and renewals one at a time, so a renewal's count is what
        # every write before it left in Redis.
        self._locks: collections.defaultdict[str, asyncio.Lock] = collections.defaultdict(
            asyncio.Lock
        )
        self._add_metrics(registry)

    def _add_metrics(self, registry: CollectorRegistry) -> None:
        declare = PrefixedMetrics(registry, prefix="dispatcher_worker_limit_")
        waiting = declare.gauge("waiting", "Entries here waiting for a slot or token.", ["queue"])
        for queue in self._queues:
            waiting.labels(queue).set_function(functools.partial(self.waiting.count, queue))
        self._in_use = declare.gauge(
            "slots_in_use",
            "Runs holding a slot of the queue, across workers (as the last claim saw).",
            ["queue"],
        )
        self._tokens = declare.gauge(
            "tokens", "Tokens left in the queue's bucket (as the last claim saw).", ["queue"]
        )

    def binds(self, queue: str) -> bool:
        return queue in self._limits

    async def room(self, queue: str, want: int) -> int:
        """How many entries a read of ``queue`` may take: none beyond the free slots while
        entries of the queue wait here (after a short pause when that is none)."""
        waiting = self.waiting.count(queue)
        if not waiting:
            return want
        room = min(want, self._slots.free - waiting)
        if room <= 0:
            await asyncio.sleep(self.waiting.poll)
        return max(room, 0)

    # -- claims -----------------------------------------------------------------

    async def claim(
        self, reader: StreamReader, messages: Sequence[Message], tasks: Tasks, keys: Keys
    ) -> tuple[list[int | None], Sequence[Message], Tasks, Keys]:
        """Claim within the queue's limits; what found no room waits. The rest, aligned."""
        queue = reader.queue
        coalescer = self._claims.get(queue)
        if coalescer is None:
            coalescer = self._claims[queue] = Coalescer(
                lambda batch: self._claim(queue, batch), name=f"limited claim {queue}"
            )
        claims = aligned(keys, await coalescer.submit([k for k in keys if k is not None]))
        kept = [i for i, claim in enumerate(claims) if claim != WAIT]
        runs = self._max_runs
        held = self._held.setdefault(reader.stream, set())
        self._queue_of[reader.stream] = queue
        granted = [messages[i].id for i in kept if 0 < (claims[i] or 0) <= runs]
        held.update(granted)
        self._unrecorded[queue] -= len(granted)
        if len(kept) == len(claims):
            return claims, messages, tasks, keys
        self.waiting.park(reader, [messages[i] for i in range(len(claims)) if claims[i] == WAIT])
        return (
            [claims[i] for i in kept],
            [messages[i] for i in kept],
            [tasks[i] for i in kept],
            [keys[i] for i in kept],
        )

    async def _claim(self, queue: str, dedup_keys: list[str]) -> list[int]:
        limits = self._limits.get(queue)
        async with self._locks[queue]:
            if limits is None:  # removed since the batch looked: as without limits
                found = await self._scripts.claim_unlimited(dedup_keys)
            else:
                freed = self._freed.pop(queue, 0)
                claimed = await self._scripts.claim(queue, limits, dedup_keys, freed=freed)
                self._in_use.labels(queue).set(claimed.in_use)
                if claimed.tokens is not None:
                    self._tokens.labels(queue).set(claimed.tokens)
                found = claimed.claims
            self._unrecorded[queue] += sum(1 for n in found if 0 < n <= self._max_runs)
        return found

    # -- slots ------------------------------------------------------------------

    def settled(self, stream: str, entry_ids: Sequence[str]) -> None:
        """Free the slots of the entries done with here."""
        held = self._held.get(stream)
        if not held:
            return
        before = len(held)
        held.difference_update(entry_ids)
        if (freed := before - len(held)) == 0:
            return
        queue = self._queue_of[stream]
        if not self._freed.get(queue):
            task = asyncio.get_running_loop().create_task(self._free(queue))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
        self._freed[queue] = self._freed.get(queue, 0) + freed
        self.waiting.wake(queue)

    async def _free(self, queue: str) -> None:
        await asyncio.sleep(FREE_AFTER)  # the queue's next claim most often takes them along
        try:
            async with self._locks[queue]:
                if not (freed := self._freed.pop(queue, 0)):
                    return
                await self._scripts.release(queue, self._limits.get(queue, _NONE), freed)
        except (RedisError, OSError) as exc:
            log.warning(
                "could not free slots; the next renewal says what this worker holds: %s",
                exc,
                extra={"queue": queue},
            )

    # -- the loop ---------------------------------------------------------------

    async def run(self) -> None:
        """Follow the limits and renew the slots held, until cancelled."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            await self.refresh()
            if loop.time() - renewed >= self._renew_every:
                renewed = loop.time()
                await self.renew()
            await asyncio.sleep(min(self._refresh_every, self._renew_every))

    async def refresh(self) -> None:
        """Read every queue's limits key once."""
        pipe = self._client.pipeline(transaction=False)
        for queue in self._queues:
            queue_get_raw(pipe, limits_key(queue))  # bytes: not UTF-8 is invalid, not a crash
        try:
            raws = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            if not self._outage.failed(exc, what="refreshing the queue limits"):
                log.warning("cannot refresh the queue limits; keeping them: %s", exc)
            return
        for queue, raw in zip(self._queues, raws, strict=True):
            self._take(queue, raw)

    def _take(self, queue: str, raw: object) -> None:
        key = limits_key(queue)
        if isinstance(raw, NoPermissionError):
            why = "the worker's Redis user may not read it (see docs/security.md)"
            self._warn(queue, f"cannot read {key}: {why}; limits kept as they were: {raw}")
            return
        if isinstance(raw, Exception):
            self._warn(queue, f"cannot read {key}; limits kept as they were: {raw}")
            return
        try:
            limits = None if raw is None else parse_limits(_raw(raw), source=key)
        except InvalidLimits as exc:
            self._warn(queue, f"{exc}; limits kept as they were")
            return
        self._warned.pop(queue, None)
        before = self._limits.get(queue)
        if limits is None or limits.empty:
            self._limits.pop(queue, None)
        else:
            self._limits[queue] = limits
        if before != (self._limits.get(queue)):
            now = limits.describe() if limits is not None else "none"
            log.info("queue limits in force: %s", now, extra={"queue": queue})

    def _warn(self, queue: str, problem: str) -> None:
        if self._warned.get(queue) != problem:
            self._warned[queue] = problem
            log.warning("%s", problem, extra={"queue": queue})

    async def renew(self) -> None:
        """Say how many slots this worker holds, a full lease TTL ahead, queue by queue."""
        for queue in {*self._limits, *self._queue_of.values()}:
            streams = [s for s, q in self._queue_of.items() if q == queue]
            try:
                async with self._locks[queue]:
                    self._freed.pop(queue, None)  # the count below has them freed
                    held = sum(len(self._held[stream]) for stream in streams)
                    held += self._unrecorded[queue]  # granted to batches not back yet
                    await self._scripts.renew(queue, held)
            except (RedisError, OSError) as exc:
                log.warning("cannot renew slots: %s", exc, extra={"queue": queue})


def _raw(raw: object) -> str | bytes:
    return raw if isinstance(raw, str | bytes) else str(raw)
