"""The shard count changed live, up and down, under continuous load: nothing stranded.

Several queues, two workers, one enqueuer whose Redis link is blackholed for
a moment before each change so rows fail their first publish and sit in
RETRY, every seventh task due 3 s after its commit, and every fifth written
as an application built for an older release does (``shards=8``). The count
goes 4 -> 8 -> 2 -> 5 with ``dispatcher shards set``, each run to its exit.
Then: every committed task handled, every shard stream of every queue empty,
the same two worker processes still running, and after the last change only
shards 0..4 got new entries.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psycopg

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.stream import parse_task_stream
from tests.faults.checker import shard_streams
from tests.faults.harness import ROOT, Pipeline, scale
from tests.faults.load import LoadSpec
from tests.fix_proxy import TcpProxy
from tests.waiting import eventually_sync

QUEUES = 3


def _outbox(p: Pipeline, status: str) -> int:
    with psycopg.connect(p.db_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE status = %s", (status,)).fetchone()
    return int(row[0]) if row else 0


def _shards_set(p: Pipeline, count: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": p.redis_url, "DATABASE_URL": p.db_url}
    return subprocess.run(
        [
            sys.executable,
            *("-m", "dispatcher.cli", "shards", "set", str(count)),
            *("--progress-every", "1"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _fail_some_publishes(p: Pipeline, proxy: TcpProxy) -> None:
    """Blackhole the enqueuer's Redis until some rows failed their publish and are in RETRY."""
    proxy.blackhole()
    try:
        eventually_sync(lambda: _outbox(p, "RETRY") > 0, within=60)
    finally:
        proxy.heal()
    p.fault("publish failed (blackhole) -> RETRY rows")


def _entries_added(redis: Any, queues: list[str]) -> dict[str, int]:
    """XINFO STREAM entries-added of every shard stream: grows with every XADD, never shrinks."""
    return {s: int(redis.xinfo_stream(s)["entries-added"]) for s in shard_streams(redis, queues)}


def test_shard_count_changed_up_and_down_under_load(
    pipeline: Callable[..., Pipeline], proxied_redis: tuple[RedisProcess, TcpProxy]
) -> None:
    s = scale()
    redis, proxy = proxied_redis
    p = pipeline(redis.url)
    queues = [p.queue, *(f"{p.queue}-{n}" for n in range(1, QUEUES))]
    also = [flag for q in queues[1:] for flag in ("--queue", q)]
    p.enqueuer(redis_url=proxy.url())
    workers = [p.worker(*also), p.worker(*also)]
    pids = [w.pid for w in workers]
    load = p.start_load(
        LoadSpec(
            tasks=1_000_000,
            rate=s.rate / 2,
            queues=QUEUES,
            not_before_every=7,
            legacy_shards_every=5,
            backoff_seconds=2,
        )
    )
    for count in (8, 2, 5):
        eventually_sync(lambda: p.handled() > 0, within=60)
        _fail_some_publishes(p, proxy)
        done = _shards_set(p, count)
        print(done.stdout)  # shown with -s: the progress of each change
        assert done.returncode == 0, done.stdout + done.stderr
        assert "applied" in done.stdout, done.stdout
        p.fault(f"dispatcher shards set {count}")
    after_last = _entries_added(p.redis, queues)
    handled_at_last = p.handled()
    p.progress(by=s.tasks + 1, within=s.drain_within)
    load.stop()  # the load ran through every change; now let the pipeline drain
    p.verify(within=s.drain_within)

    assert [w.pid for w in workers] == pids
    assert all(w.alive() for w in workers), p._logs()  # never restarted
    final = _entries_added(p.redis, queues)
    grew = {stream for stream, n in final.items() if n > after_last.get(stream, 0)}
    assert grew, "no entries published after the last change"
    assert {parse_task_stream(stream)[1] for stream in grew} <= set(range(5)), grew
    assert {parse_task_stream(stream)[0] for stream in grew} == set(queues)
    assert p.handled() > handled_at_last
