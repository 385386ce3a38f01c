"""Worker-side faults under concurrent load: scenarios 8 and 9.

Worker processes SIGKILLed in the middle of their handlers (their entries are
reclaimed by the others), and poison tasks mixed into normal ones (dead-
lettered after ``--max-runs`` runs; every normal task still handled).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.stream.naming import dead_letter_stream
from tests.faults.harness import Pipeline, scale
from tests.faults.load import LoadSpec


def test_workers_sigkilled_mid_handler(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    p.enqueuer()
    workers = [p.worker(name="w0"), p.worker(name="w1")]
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate / 2, task_input={"sleep": 0.05}))
    rng = random.Random(8)
    for n in range(s.rounds):
        p.progress()
        victim = workers.pop(rng.randrange(len(workers)))
        victim.kill()  # handlers are sleeping inside it: they never finish
        p.fault("worker SIGKILL")
        workers.append(p.worker(name=f"w{n + 2}"))
    # A run that returned just before the kill, and was not yet marked done, may run again.
    p.verify(within=s.drain_within, duplicates_allowed=True)


def test_poison_tasks_among_normal_ones(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    p.enqueuer()
    p.worker("--max-runs", "3", "--reclaim-idle", "0.5")
    load = p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate, poison_every=25))
    report = p.verify(within=s.drain_within)
    dead = {f["task_id"] for _id, f in p.redis.xrange(dead_letter_stream(p.queue))}
    assert dead == load.poison, "exactly the poison tasks are dead-lettered"
    assert report.handled == report.committed - len(load.poison)
    errors = [f["error"] for _id, f in p.redis.xrange(dead_letter_stream(p.queue))]
    assert all("PoisonTask" in e or "max runs" in e for e in errors), errors[:3]
