"""Worker probes during a Redis outage: unready at once, alive for a bounded failover.

A Redis failover (Sentinel or Cluster promoting a replica, a managed service's maintenance)
can take minutes. Killing every worker for it (liveness failing) only adds restarts and a
thundering herd of reconnects; the kubelet should take them out of rotation (readiness) and
keep them. A worker that has not reached Redis for ``REDIS_DEAD_AFTER`` is presumed stuck and
does fail liveness. The probes' clock is injected, so the minutes pass instantly; Redis is a
private redis-server paused with SIGSTOP.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.redis_client import connect_redis
from dispatcher.worker import Worker, WorkerConfig
from dispatcher.worker.runtime import REDIS_DEAD_AFTER, REDIS_UNREADY_AFTER
from tests.waiting import eventually


@dataclasses.dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


async def _handler(_message: object) -> None:
    return None


@pytest.mark.timeout(120)
async def test_a_redis_outage_makes_workers_unready_but_keeps_them_alive_for_a_while(
    redis_process: RedisProcess,
) -> None:
    client = connect_redis(redis_process.url, socket_timeout=1.0)
    clock = Clock()
    config = WorkerConfig(
        queues=("probes",), block_ms=100, shard_poll_interval=0.2, stats_interval=0.2
    )
    worker = Worker(client, _handler, config, clock=clock)
    run = asyncio.create_task(worker.run())
    try:

        async def ready() -> bool:
            return worker.ready()

        await eventually(ready, within=20)
        redis_process.pause()
        try:
            clock.now += REDIS_UNREADY_AFTER + 1

            async def unready() -> bool:
                # A read answered just before the pause may still count as contact: let the
                # clock creep on (a few minutes at most, within REDIS_DEAD_AFTER).
                clock.now += 0.5
                return not worker.ready()

            await eventually(unready, within=20)
            assert worker.live()  # a failover is no reason to restart
            clock.now += 120  # longer than the 60 s that used to fail liveness
            assert not worker.ready()
            assert worker.live()
            clock.now += REDIS_DEAD_AFTER  # bounded: a worker that long without Redis is stuck
            assert not worker.live()
        finally:
            redis_process.resume()
        await eventually(ready, within=30)  # Redis answers again: back in rotation
        assert worker.live()
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 30)
        await client.aclose()
