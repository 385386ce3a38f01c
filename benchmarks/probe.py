"""The idle probe: commit -> visible, measured from outside the product.

A probe commits one realistic dispatch (``workload.dispatch``, 433-byte payload)
at a time through the public ``enqueue_dispatch`` on its own connection, 20 ms
after the previous one became visible. Two receivers run in threads of the
probe's process, each on its own connection:

- a reader blocked on XREAD over every shard stream of the probe's queue
  (an entry is matched to its dispatch by ``outbox_id``);
- a plain LISTEN session on the trigger's channel (the NOTIFY receipt floor:
  nothing can publish sooner than PostgreSQL tells a listener).

Each sample is timed twice: from the moment the INSERT is sent (what an
application waits through: INSERT, COMMIT and its WAL flush, then the relay)
and from the moment COMMIT returned (``write``: the time between the two).
The relay under test runs as its own process: ``dispatcher enqueuer`` with its
defaults, or the pipelined reference relay of ``benchmarks.baselines``.

``duplicates`` runs the same probe for many dispatches with one or two
enqueuer processes and counts the stream entries per ``outbox_id``.
"""

from __future__ import annotations

import contextlib
import queue as queues
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis as sync_redis

from benchmarks import insert_bench
from benchmarks.env import BenchEnv
from benchmarks.workload import (
    Around,
    CpuMeter,
    dispatch,
    enqueuer_command,
    processes,
    relay_command,
    tiny_dispatch,
)
from dispatcher.outbox import enqueue_dispatch
from dispatcher.stream import DEFAULT_SHARDS, SHARDS_KEY, queue_streams

GAP = 0.02  # idle time between one dispatch becoming visible and the next INSERT
SAMPLES = 300
WARMUP = 10  # connections, prepared statements, the relay's first poll
CHANNEL = "outbox_new"
TIMEOUT = 10.0
# How long after its entry reached the stream a dispatch's notification may still come: it
# was sent before the relay could publish, but the listening thread may be scheduled late.
NOTIFY_LAG = 0.5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@dataclass
class Receivers:
    """Arrival times (``perf_counter``) of stream entries by outbox id, and of notifications."""

    redis_url: str
    db_url: str
    streams: list[str]
    entries: dict[str, list[float]] = field(default_factory=dict)
    notified: queues.Queue[float] = field(default_factory=queues.Queue)
    arrived: threading.Condition = field(default_factory=threading.Condition)
    stop: threading.Event = field(default_factory=threading.Event)

    def read_streams(self) -> None:
        client = sync_redis.Redis.from_url(self.redis_url, decode_responses=True)
        last = dict.fromkeys(self.streams, "0-0")
        while not self.stop.is_set():
            reply = client.xread(last, block=200)  # type: ignore[arg-type]
            now = time.perf_counter()
            with self.arrived:
                for stream, items in reply or []:
                    for entry_id, fields in items:
                        last[stream] = entry_id
                        self.entries.setdefault(fields.get("outbox_id", ""), []).append(now)
                self.arrived.notify_all()
        client.close()

    def listen(self) -> None:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            while not self.stop.is_set():
                for _ in conn.notifies(timeout=0.2):
                    self.notified.put(time.perf_counter())

    def seen(self, outbox_id: str, timeout: float) -> float:
        deadline = time.perf_counter() + timeout
        with self.arrived:
            while outbox_id not in self.entries:
                if not self.arrived.wait(deadline - time.perf_counter()):
                    raise RuntimeError(f"dispatch {outbox_id} not in a stream after {timeout} s")
            return self.entries[outbox_id][0]


@contextlib.contextmanager
def receivers(env: BenchEnv, queue: str) -> Iterator[Receivers]:
    r = Receivers(env.redis_url, env.db_url, queue_streams([queue], DEFAULT_SHARDS))
    threads = [threading.Thread(target=r.read_streams), threading.Thread(target=r.listen)]
    for t in threads:
        t.start()
    try:
        yield r
    finally:
        r.stop.set()
        for t in threads:
            t.join()


def _summary(name: str, values: list[float]) -> dict[str, float]:
    return {f"p50_{name}_ms": statistics.median(values), f"p99_{name}_ms": percentile(values, 99)}


def probe(
    env: BenchEnv,
    queue: str,
    r: Receivers,
    *,
    samples: int,
    clock: str,
    pids: list[int],
    tiny: bool = False,
    around: Around | None = None,
    prelude: Callable[[], None] | None = None,
) -> dict[str, float]:
    """``samples`` dispatches, one at a time; latencies to the stream or to the notification.

    ``not_notified_pct``: the share of dispatches whose INSERT sent no notification (the
    trigger notifies only while an enqueuer is idle); the floor leaves them out. Also the
    CPU per dispatch of the relay's process (``pids``) and of every PostgreSQL
    backend (the probe's and the receivers' included, alike in every variant).
    ``tiny``: the earlier harness's ~150-byte payload instead of the realistic one.
    ``around`` (a profiler) is entered with ``pids`` over the measured dispatches.
    ``prelude`` runs once the relay is up, before the first dispatch measured.
    """
    from_insert: list[float] = []
    from_commit: list[float] = []
    writes: list[float] = []
    silent = 0
    with psycopg.connect(env.db_url) as conn, contextlib.ExitStack() as stack:
        # Until the relay is up: its first poll publishes what was committed before it listened.
        r.seen(_send(conn, queue)[0], 60.0)
        if prelude:
            prelude()
        for i in range(WARMUP + samples):
            if i == WARMUP:
                if around:
                    stack.enter_context(around(pids))
                meter = CpuMeter(env.db_url, product=set(pids), redis_pid=env.redis_pid)
            time.sleep(GAP)
            while not r.notified.empty():
                r.notified.get_nowait()
            outbox_id, sent, acked = _send(conn, queue, tiny=tiny)
            visible = r.seen(outbox_id, TIMEOUT)
            try:
                notified = r.notified.get(timeout=NOTIFY_LAG)
            except queues.Empty:  # the trigger did not NOTIFY: no enqueuer was idle
                silent += i >= WARMUP
                if clock == "notify":
                    continue
            if clock == "notify":
                visible = notified
            if i >= WARMUP:
                from_insert.append((visible - sent) * 1000)
                from_commit.append((visible - acked) * 1000)
                writes.append((acked - sent) * 1000)
    spent = meter.spent()
    return (
        _summary("insert", from_insert)
        | _summary("commit", from_commit)
        | {
            "p50_write_ms": statistics.median(writes),
            "not_notified_pct": silent * 100 / samples,
            "product_us_per_dispatch": spent["product"] / samples * 1e6,
            "postgres_us_per_dispatch": spent["postgres"] / samples * 1e6,
        }
    )


def _send(
    conn: psycopg.Connection[Any], queue: str, tiny: bool = False
) -> tuple[str, float, float]:
    task_id = str(uuid.uuid4())
    d = tiny_dispatch(task_id, queue) if tiny else dispatch(task_id, queue)
    sent = time.perf_counter()
    outbox_id = enqueue_dispatch(conn, d)
    conn.commit()
    return outbox_id, sent, time.perf_counter()


def _fresh_queue(env: BenchEnv) -> str:
    client = sync_redis.Redis.from_url(env.redis_url)
    client.set(SHARDS_KEY, str(DEFAULT_SHARDS))
    client.close()
    return f"idle{uuid.uuid4().hex[:6]}"


def idle_enqueuer(
    env: BenchEnv,
    samples: int = SAMPLES,
    clock: str = "stream",
    tiny: bool = False,
    around: Around | None = None,
    garbage: int = 0,
) -> dict[str, float]:
    """The enqueuer process (defaults); ``clock`` "notify" times the plain LISTEN session.

    ``garbage``: that many notifications on the channel with payloads nobody should trust
    (``null``, JSON that names rows and streams, random text), sent once the enqueuer is up.
    """
    queue = _fresh_queue(env)
    with (
        processes([enqueuer_command(env.db_url, env.redis_url)]) as procs,
        receivers(env, queue) as r,
    ):
        pids = [p.pid for p in procs]
        return probe(
            env,
            queue,
            r,
            samples=samples,
            clock=clock,
            pids=pids,
            tiny=tiny,
            around=around,
            prelude=(lambda: forge_notifications(env.db_url, garbage)) if garbage else None,
        )


def forge_notifications(db_url: str, count: int) -> None:
    """``count`` notifications on the channel that are not the trigger's (empty) one."""
    rng = random.Random(count)
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i in range(count):
            payload = (
                "null",
                f'["forged-{i}", "workflow.tasks.bench.{i % 4}", "t"]\n{{"input": "{{}}"}}',
                "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(1, 300))),
            )[i % 3]
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))


def idle_relay(env: BenchEnv, samples: int = SAMPLES) -> dict[str, float]:
    """The pipelined reference relay; its wake-up is a NOTIFY on every insert statement."""
    queue = _fresh_queue(env)
    insert_bench.set_trigger(env.db_url, "spec trigger")
    try:
        with (
            processes([relay_command(env.db_url, env.redis_url)]) as procs,
            receivers(env, queue) as r,
        ):
            return probe(env, queue, r, samples=samples, clock="stream", pids=[procs[0].pid])
    finally:
        insert_bench.set_trigger(env.db_url, insert_bench.PROJECT)


def duplicates(env: BenchEnv, enqueuers: int, dispatches: int = 10_000) -> dict[str, float]:
    """Stream entries per outbox id over ``dispatches`` idle dispatches, ``enqueuers`` processes."""
    queue = _fresh_queue(env)
    command = enqueuer_command(env.db_url, env.redis_url)
    with processes([command] * enqueuers), receivers(env, queue) as r:
        with psycopg.connect(env.db_url) as conn:
            r.seen(_send(conn, queue)[0], 60.0)
            sent = []
            for _ in range(dispatches):
                time.sleep(GAP)
                outbox_id = _send(conn, queue)[0]
                r.seen(outbox_id, TIMEOUT)
                sent.append(outbox_id)
        time.sleep(2.0)  # a late duplicate (another enqueuer's poll) lands meanwhile
        with r.arrived:
            counts = Counter({i: len(r.entries.get(i, [])) for i in sent})
    extra = sum(n - 1 for n in counts.values() if n > 1)
    return {
        "dispatches": float(dispatches),
        "duplicates": float(extra),
        "per_10k": extra * 10_000 / dispatches,
    }
