"""``dispatcher worker`` as a real process: SIGKILL, SIGTERM and start-up errors.

The worker runs ``tests.handlers:slow``, which records ``started:``/``done:``
per task in a Redis list, so what happened survives the process.
"""

from __future__ import annotations

import asyncio
import collections
import signal
from collections.abc import Callable

import pytest
import redis as sync_redis

from dispatcher.models import TaskDispatch
from dispatcher.redis_client import RedisClient
from dispatcher.stream import dead_letter_stream, publish_shard_count, queue_streams
from dispatcher.worker import Worker, WorkerConfig
from tests.data import GROUP, publish, tasks
from tests.fix_worker_process import LOG_KEY, WorkerProcess
from tests.handlers import slow
from tests.waiting import eventually, eventually_sync


def events(log: sync_redis.Redis, kind: str) -> collections.Counter[str]:
    entries: list[str] = log.lrange(LOG_KEY, 0, -1)  # type: ignore[assignment]
    return collections.Counter(e.split(":", 1)[1] for e in entries if e.startswith(kind + ":"))


def started(log: sync_redis.Redis) -> int:
    """Handler runs started so far."""
    return sum(events(log, "started").values())


def flags(queue: str, consumer: str, *extra: str) -> list[str]:
    return [
        *("--queue", queue, "--handler", "tests.handlers:slow", "--consumer", consumer),
        *("--concurrency", "4", "--reclaim-idle", "1", "--lease-ttl", "2"),
        *extra,
    ]


async def test_tasks_of_a_killed_worker_are_completed_by_another(
    redis_standalone: RedisClient,
    redis_url: str,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await publish_shard_count(redis_standalone, 4)
    victim = spawn(*flags(queue, "victim"))
    published = tasks(queue, 8, input={"sleep": 1.5})
    await publish(redis_standalone, published, shards=4)
    eventually_sync(lambda: started(log) >= 4, within=20)
    victim.kill()  # SIGKILL in the middle of four handlers
    assert not events(log, "done")

    monkeypatch.setenv("HANDLER_REDIS_URL", redis_url)
    monkeypatch.setenv("HANDLER_LOG_KEY", LOG_KEY)
    config = WorkerConfig(
        queues=(queue,), consumer="rescuer", concurrency=4, reclaim_idle=1, lease_ttl=2
    )
    rescuer = Worker(redis_standalone, slow, config)
    run = asyncio.create_task(rescuer.run())
    try:
        await eventually(lambda: _all_done(log, published), within=40)
    finally:
        rescuer.request_stop()
        await run

    assert set(events(log, "done").values()) == {1}  # the victim finished none of them
    for stream in queue_streams([queue], 4):
        assert await redis_standalone.xlen(stream) == 0
        names = [c["name"] for c in await redis_standalone.xinfo_consumers(stream, GROUP)]
        assert "rescuer" not in names


async def _all_done(log: sync_redis.Redis, published: list[TaskDispatch]) -> bool:
    return set(events(log, "done")) == {t.task_id for t in published}


async def test_sigterm_lets_running_handlers_finish_and_exits_zero(
    redis_standalone: RedisClient,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
) -> None:
    await publish_shard_count(redis_standalone, 4)
    worker = spawn(*flags(queue, "polite"))
    published = tasks(queue, 4, input={"sleep": 1.0})
    await publish(redis_standalone, published, shards=4)
    eventually_sync(lambda: started(log) == 4, within=20)

    worker.proc.send_signal(signal.SIGTERM)

    assert worker.wait() == 0, worker.stderr
    assert events(log, "done") == {t.task_id: 1 for t in published}
    for stream in queue_streams([queue], 4):
        assert await redis_standalone.xlen(stream) == 0
        assert await redis_standalone.xinfo_consumers(stream, GROUP) == []  # left the group


async def test_sigterm_past_the_grace_period_keeps_work_pending(
    redis_standalone: RedisClient,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
) -> None:
    await publish_shard_count(redis_standalone, 1)
    worker = spawn(*flags(queue, "hasty", "--grace-period", "0.2", "--shards", "1"))
    (task,) = tasks(queue, 1, input={"sleep": 2})
    await publish(redis_standalone, [task], shards=1)
    eventually_sync(lambda: events(log, "started"), within=20)

    worker.proc.send_signal(signal.SIGTERM)

    assert worker.wait() == 0, worker.stderr
    (stream,) = queue_streams([queue], 1)
    consumers = await redis_standalone.xinfo_consumers(stream, GROUP)
    assert [(c["name"], c["pending"]) for c in consumers] == [("hasty", 1)]  # kept, not lost
    assert await redis_standalone.xlen(stream) == 1


async def test_a_killed_workers_entries_are_run_again_not_dead_lettered(
    redis_standalone: RedisClient,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
) -> None:
    """Reclaim-idle 2 s, a limit of 3, the lease TTL at its default (30 s): one worker SIGKILLed.

    The survivor reclaims the victim's entries many times while their leases
    still live; those reclaims run nothing and count nothing, so every entry
    runs again once the leases expire.
    """
    await publish_shard_count(redis_standalone, 4)
    common = ("--handler", "tests.handlers:slow", "--reclaim-idle", "2", "--max-deliveries", "3")
    victim = spawn("--queue", queue, "--consumer", "victim", *common)
    spawn("--queue", queue, "--consumer", "other", *common)
    published = tasks(queue, 200, input={"sleep": 0.3})
    await publish(redis_standalone, published, shards=4)
    eventually_sync(lambda: started(log) >= 24, within=30)
    victim.kill()  # SIGKILL with handlers in hand

    await eventually(lambda: _all_done(log, published), within=120)

    assert await redis_standalone.xlen(dead_letter_stream(queue)) == 0
    for stream in queue_streams([queue], 4):
        assert await redis_standalone.xlen(stream) == 0


async def test_sigterm_past_the_grace_period_never_lets_a_sync_run_overlap_another(
    redis_standalone: RedisClient,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
) -> None:
    """A sync handler hangs 20 s; SIGTERM with a 1 s grace period; a second worker is running.

    The stopping worker keeps the run's lease until the process is gone, and
    goes (a hard exit) without waiting for the thread; only then may the other
    worker run the attempt.
    """
    await publish_shard_count(redis_standalone, 1)
    common = (
        *("--queue", queue, "--handler", "tests.handlers:exclusive", "--shards", "1"),
        *("--reclaim-idle", "1", "--lease-ttl", "3", "--grace-period", "1"),
    )
    first = spawn("--consumer", "first", *common)
    (task,) = tasks(queue, 1, input={"first_sleep": 20})
    await publish(redis_standalone, [task], shards=1)
    eventually_sync(lambda: events(log, "started"), within=30)
    spawn("--consumer", "second", *common)

    first.proc.send_signal(signal.SIGTERM)
    await eventually(lambda: _runs_done(log, task.task_id, 1), within=60)

    assert not events(log, "overlap"), "the attempt ran twice at once"
    assert first.proc.poll() == 0, first.stderr  # gone, before its 20 s run returned
    assert events(log, "started") == {task.task_id: 2}
    (stream,) = queue_streams([queue], 1)
    assert await redis_standalone.xlen(stream) == 0


async def _runs_done(log: sync_redis.Redis, task_id: str, count: int) -> bool:
    return events(log, "done").get(task_id, 0) >= count


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("no_such_module:run", "cannot import handler module 'no_such_module'"),
        ("tests.handlers:missing", "module 'tests.handlers' has no attribute 'missing'"),
        ("tests.handlers", "handler must look like 'module:function'"),
    ],
)
def test_a_bad_handler_path_is_one_clear_line(
    spawn: Callable[..., WorkerProcess], handler: str, message: str
) -> None:
    worker = spawn("--queue", "q", "--handler", handler)
    assert worker.wait() == 2
    lines = worker.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("dispatcher worker: ")
    assert message in lines[0]


def test_bad_worker_settings_are_one_clear_line(spawn: Callable[..., WorkerProcess]) -> None:
    worker = spawn("--queue", "a.b", "--handler", "tests.handlers:slow")
    assert worker.wait() == 2
    (line,) = worker.stderr.strip().splitlines()
    assert "invalid queue name 'a.b'" in line


@pytest.mark.parametrize("raised", ["exit", "interrupt"])
async def test_a_handler_raising_systemexit_or_keyboardinterrupt_is_a_failed_run(
    redis_standalone: RedisClient,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
    raised: str,
) -> None:
    """``SystemExit``/``KeyboardInterrupt`` from an async handler, at once or after a wait:
    failed runs, dead-lettered after max runs, while the worker goes on handling the rest."""
    await publish_shard_count(redis_standalone, 1)
    worker = spawn(
        *("--queue", queue, "--handler", "tests.handlers:raises", "--consumer", "stoic"),
        *("--shards", "1", "--concurrency", "2", "--reclaim-idle", "1", "--max-runs", "2"),
    )
    at_once = tasks(queue, 1, input={"raise": raised})
    after_a_wait = tasks(queue, 1, input={"raise": raised, "wait": True})
    healthy = tasks(queue, 4)
    await publish(redis_standalone, [*at_once, *after_a_wait], shards=1)
    await publish(redis_standalone, healthy, shards=1)

    async def settled() -> bool:
        dead = await redis_standalone.xlen(dead_letter_stream(queue))
        return dead >= 2 and await _all_done(log, healthy)

    await eventually(settled, within=60, what="two dead letters, the healthy tasks done")

    assert worker.proc.poll() is None, worker.stderr  # still running
    letters = await redis_standalone.xrange(dead_letter_stream(queue))
    assert {fields["task_id"] for _, fields in letters} == {
        at_once[0].task_id,
        after_a_wait[0].task_id,
    }
    name = "SystemExit: 3" if raised == "exit" else "KeyboardInterrupt"
    for _, fields in letters:
        assert fields["runs"] == "2"
        assert fields["error"].startswith("failed 2 runs (max runs 2); last error: " + name)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.stderr


async def test_sigterm_past_the_grace_period_exits_though_handler_threads_run_on(
    redis_standalone: RedisClient,
    queue: str,
    spawn: Callable[..., WorkerProcess],
    log: sync_redis.Redis,
) -> None:
    """An async handler waits for a 600 s thread of the loop's default executor; SIGTERM
    with a 1 s grace period: the process names the abandoned task and exits."""
    await publish_shard_count(redis_standalone, 1)
    worker = spawn(
        *("--queue", queue, "--handler", "tests.handlers:offloaded", "--consumer", "leaky"),
        *("--shards", "1", "--grace-period", "1"),
    )
    (task,) = tasks(queue, 1, input={"sleep": 600})
    await publish(redis_standalone, [task], shards=1)
    eventually_sync(lambda: events(log, "started"), within=30)

    worker.proc.send_signal(signal.SIGTERM)

    assert worker.wait(timeout=60) == 0, worker.stderr
    assert task.task_id in worker.stderr  # named as abandoned
    assert not events(log, "done")
    (stream,) = queue_streams([queue], 1)
    assert await redis_standalone.xlen(stream) == 1  # kept pending for another worker
