"""A handler that blocks the event loop past the lease TTL: its attempt still runs once.

Two real ``dispatcher worker`` processes read one queue with a 2 s lease TTL and a 1 s
reclaim idle. The one that reads the task runs an async handler that blocks its event loop
(``time.sleep``) for three lease TTLs: nothing on that loop runs, its entry goes stale and
the other worker reclaims it. The lease is renewed by a thread of the worker with its own
Redis connection, so the other worker finds the attempt busy, leaves the entry pending and
starts nothing; the attempt runs once, start to end, then is acked.
"""

from __future__ import annotations

from collections.abc import Callable

import redis as sync_redis

from dispatcher.redis_client import RedisClient
from dispatcher.stream import publish_shard_count, task_stream
from dispatcher.stream.naming import WORKER_GROUP
from tests.data import publish, tasks
from tests.fix_worker_process import LOG_KEY, WorkerProcess
from tests.waiting import eventually_sync


async def test_a_blocked_loop_never_lets_another_worker_start_the_attempt(
    redis_standalone: RedisClient,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
) -> None:
    await publish_shard_count(redis_standalone, 1)
    flags = [
        *("--queue", queue, "--handler", "tests.handlers:exclusive_blocking"),
        *("--lease-ttl", "2", "--reclaim-idle", "1", "--concurrency", "2"),
    ]
    workers = [spawn(*flags, "--consumer", f"w{n}") for n in range(2)]
    stream = task_stream(queue, 0)

    eventually_sync(lambda: all("worker started" in w.stderr for w in workers), within=30)
    (task,) = tasks(queue, 1, input={"first_sleep": 6})  # three lease TTLs
    await publish(redis_standalone, [task], shards=1)

    def acked() -> bool:
        done = f"done:{task.task_id}" in log.lrange(LOG_KEY, 0, -1)
        return done and _pending(log, stream) == 0

    eventually_sync(acked, within=60)
    records = log.lrange(LOG_KEY, 0, -1)
    for w in workers:
        assert w.proc.poll() is None, w.stderr[-2000:]
    assert records == [f"started:{task.task_id}", f"done:{task.task_id}"], (
        records,
        [w.stderr[-1500:] for w in workers],
    )
    assert log.get(f"{LOG_KEY}:runs:{task.task_id}") == "1"


def _pending(log: sync_redis.Redis, stream: str) -> int:
    summary = log.xpending(stream, WORKER_GROUP)
    return int(summary["pending"])
