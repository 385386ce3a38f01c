"""Queue limits across worker processes: ``max_in_flight``, ``rate``/``burst``, a killed worker.

Every worker is a real ``dispatcher worker`` process running
``tests.handlers:timed``, which records each run's start and end (wall clock)
in a Redis list; the limits are set with ``dispatcher limits set``. What held
is read from those records: how many runs overlapped at any instant, how many
started in any one-second window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import pytest
import redis as sync_redis

from dispatcher.cli.main import main
from dispatcher.redis_client import RedisClient
from dispatcher.stream import dead_letter_stream, publish_shard_count
from tests.data import publish, tasks
from tests.fix_worker_process import LOG_KEY, WorkerProcess
from tests.waiting import eventually_sync


@dataclasses.dataclass
class Scene:
    """A queue's workers and limits: ``limits(...)`` sets them, ``workers(n)`` starts them."""

    queue: str
    spawn: Callable[..., WorkerProcess]

    async def limits(self, *flags: str) -> None:
        """``dispatcher limits set --queue <queue> <flags>``, its CLI run in a thread here
        (``REDIS_URL`` is set), so the write lands within milliseconds of the call."""
        argv = ["limits", "set", "--queue", self.queue, *flags]
        assert await asyncio.to_thread(main, argv) == 0

    def workers(self, count: int, *, name: str = "w") -> list[WorkerProcess]:
        return [self.spawn(*worker_flags(self.queue, f"{name}{n}")) for n in range(count)]


@pytest.fixture
def scene(
    redis_url: str, queue: str, spawn: Callable[..., WorkerProcess], monkeypatch: pytest.MonkeyPatch
) -> Scene:
    monkeypatch.setenv("REDIS_URL", redis_url)
    return Scene(queue, spawn)


def worker_flags(queue: str, consumer: str, *extra: str) -> list[str]:
    return [
        *("--queue", queue, "--handler", "tests.handlers:timed", "--consumer", consumer),
        *("--concurrency", "4", "--reclaim-idle", "1", "--lease-ttl", "2"),
        *extra,
    ]


def records(log: sync_redis.Redis, kind: str) -> list[tuple[str, float]]:
    """(task, time) of every ``kind`` record (``start`` or ``end``), in the order written."""
    found: list[str] = log.lrange(LOG_KEY, 0, -1)  # type: ignore[assignment]
    parts = [entry.split(":") for entry in found]
    return [(task, float(at)) for what, task, at in parts if what == kind]


def peak_running(
    log: sync_redis.Redis, *, since: float = 0.0, until: float = 1e12, cut: float = 1e12
) -> int:
    """The most runs in progress at one instant between ``since`` and ``until``.

    A run that never recorded its end (its process was killed) ends at ``cut``.
    """
    ends: dict[str, list[float]] = {}
    for task, at in records(log, "end"):
        ends.setdefault(task, []).append(at)
    changes = []
    for task, at in records(log, "start"):
        left = ends.get(task)
        changes += [(at, 1), (left.pop(0) if left else cut, -1)]
    running = peak = 0
    for at, change in sorted(changes):  # at one instant an end sorts before a start
        running += change
        if since <= at <= until:
            peak = max(peak, running)
    return peak


async def test_max_in_flight_holds_across_workers_and_a_change_applies_within_2_s(
    redis_standalone: RedisClient,
    queue: str,
    scene: Scene,
    log: sync_redis.Redis,
) -> None:
    await publish_shard_count(redis_standalone, 4)
    await scene.limits("--max-in-flight", "4")
    scene.workers(3)
    await publish(redis_standalone, tasks(queue, 200, input={"sleep": 0.3}), shards=4)
    eventually_sync(lambda: len(records(log, "end")) >= 50, within=60)
    changing = time.time()
    await scene.limits("--max-in-flight", "8")
    eventually_sync(lambda: len(records(log, "end")) >= 200, within=120)

    assert peak_running(log, until=changing) == 4  # bound, and reached: 12 slots in the workers
    assert peak_running(log, since=changing, until=changing + 2.0) >= 5  # the new limit, within 2 s
    assert peak_running(log) == 8
    assert sorted(task for task, _at in records(log, "end")) == sorted(
        task for task, _at in records(log, "start")
    )
    assert len({task for task, _at in records(log, "end")}) == 200
    assert await redis_standalone.xlen(dead_letter_stream(queue)) == 0


async def test_rate_and_burst_bound_the_starts_in_every_second(
    redis_standalone: RedisClient,
    queue: str,
    scene: Scene,
    log: sync_redis.Redis,
) -> None:
    await publish_shard_count(redis_standalone, 4)
    await scene.limits("--rate", "20", "--burst", "5")
    scene.workers(3)
    await publish(redis_standalone, tasks(queue, 300, input={"sleep": 0}), shards=4)
    eventually_sync(lambda: len(records(log, "end")) >= 300, within=120)

    starts = sorted(at for _task, at in records(log, "start"))
    assert len(starts) == 300
    in_a_second = max(
        sum(1 for later in starts[i:] if later < at + 1.0) for i, at in enumerate(starts)
    )
    assert in_a_second <= 25  # the rate over a second, plus the burst
    assert starts[-1] - starts[0] >= 14.0  # 295 starts after the burst, at 20 a second
    assert await redis_standalone.xlen(dead_letter_stream(queue)) == 0


async def test_slots_of_a_killed_worker_come_back_when_its_leases_end(
    redis_standalone: RedisClient,
    queue: str,
    scene: Scene,
    log: sync_redis.Redis,
) -> None:
    await publish_shard_count(redis_standalone, 2)
    await scene.limits("--max-in-flight", "2")
    (victim,) = scene.workers(1, name="victim")
    held = tasks(queue, 2, input={"first_sleep": 60, "sleep": 0.3}, prefix="held")
    await publish(redis_standalone, held, shards=2)
    eventually_sync(lambda: len(records(log, "start")) == 2, within=30)
    victim.proc.kill()  # SIGKILL while its two runs hold both slots
    victim.proc.wait()
    killed = time.time()
    scene.workers(2)
    await publish(redis_standalone, tasks(queue, 20, input={"sleep": 0.5}), shards=2)
    eventually_sync(lambda: len(records(log, "end")) >= 22, within=90)

    assert peak_running(log, since=killed, cut=killed) == 2  # both slots back, and never more
    assert {task for task, _at in records(log, "end")} >= {d.task_id for d in held}
    assert await redis_standalone.xlen(dead_letter_stream(queue)) == 0
