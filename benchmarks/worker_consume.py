"""Worker consume rate: ``python -m benchmarks.worker_consume [--messages N] [--rounds 5]``.

What it measures: how many messages per second ``dispatcher worker`` settles
with a no-op handler (``noop`` below), at 1 and 2 processes, against
a bare consumer in the same run: one XREADGROUP loop per shard stream and a
pipelined XACK+XDEL per batch, no parsing, no dedup keys, no metrics. The gap
is the price of what the worker adds per message (parse, lease + done-mark
round trips, handler task, ack).

How: a private redis-server on a free port; per round and variant a fresh
queue of 4 shards is filled with the whole backlog first (fields exactly as
the enqueuer writes them), then the consumers start. The rate is taken while
the backlog drains, from 5 % consumed to empty, so process start-up does not
count. Variants run interleaved per round; each figure is the median of the
rounds. The default backlog (200k) keeps the bare loop draining for about a
second: at 20k it drained in 0.2 s and its figure swung by a factor of 2.5.
The load average before and after is recorded, since another process on the
machine skews every variant. Prints a markdown table and writes
``benchmarks/results/worker_consume.md``.

``--limits`` adds the workers with queue limits set on the queue that never
bind (``LOOSE_LIMITS``), beside the ones without; ``--out FILE`` writes the
table elsewhere. ``--baseline DIR`` adds the same worker variants run from another checkout
(say ``git worktree add /tmp/before <commit>``), interleaved with the others
in every round: a before/after comparison under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.env import BenchEnv, RedisProcess
from benchmarks.workload import ROOT, Around, cpu_seconds_of, dispatch, load_average
from dispatcher.models import TaskMessage, payload_fields
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream import (
    RedisStreamPublisher,
    publish_shard_count,
    queue_streams,
    shard_for,
    task_stream,
)
from dispatcher.stream.limit_keys import QueueLimits, write_limits
from dispatcher.stream.naming import WORKER_GROUP

GROUP = WORKER_GROUP
# Queue limits that never bind at the rates measured here: what limits cost when not binding.
LOOSE_LIMITS = QueueLimits(max_in_flight=1_000_000, rate=1_000_000, burst=1_000_000)
RESULT = ROOT / "benchmarks" / "results" / "worker_consume.md"
SHARDS = 4

# A variant drains a queue: its rate (msgs/s) and the CPU its worker processes
# spent per message meanwhile (us; None when not measured).
# msgs/s; consumer CPU us/msg (None: not measured); Redis CPU us/msg
Sample = tuple[float, float | None, float]
Variant = Callable[[RedisClient, str, str, int], Awaitable[Sample]]


async def noop(message: TaskMessage) -> None:
    """The handler of the worker under test: nothing, so only the worker's own work counts."""


async def publish(client: RedisClient, queue: str, count: int) -> None:
    """``count`` realistic dispatches on ``queue``'s shards, fields as the enqueuer writes them."""
    publisher = RedisStreamPublisher(client, group=GROUP)
    body = dispatch("t", queue).payload()
    for start in range(0, count, 1000):
        entries = []
        for n in range(start, min(count, start + 1000)):
            task_id = f"{queue}-{n}"
            fields = payload_fields(json.dumps(body | {"task_id": task_id}), str(n))
            entries.append((task_stream(queue, shard_for(task_id, SHARDS)), fields))
        results = await publisher.publish_many(entries)
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]


async def backlog(client: RedisClient, queue: str) -> int:
    pipe = client.pipeline(transaction=False)
    for stream in queue_streams([queue], SHARDS):
        pipe.xlen(stream)
    return sum(await pipe.execute())


async def wait_backlog(client: RedisClient, queue: str, *, at_most: float) -> int:
    while True:
        left = await backlog(client, queue)
        if left <= at_most:
            return left
        await asyncio.sleep(0.005)


async def drain_rate(
    client: RedisClient,
    queue: str,
    total: int,
    *,
    pids: list[int] | None = None,
    around: Around | None = None,
) -> Sample:
    """Messages/s from 5 % consumed until the backlog is empty, CPU us/msg of ``pids``
    and of the Redis server (its ``process_id``: the benchmark's own, on this machine).

    CPU time (user + system, from /proc) is much less skewed than the rate
    when other processes compete for the cores. ``around`` (a profiler) is
    entered with ``pids`` over the same window.
    """
    server = [int((await client.info("server"))["process_id"])]
    left = await wait_backlog(client, queue, at_most=total * 0.95)
    with around(pids or []) if around else contextlib.nullcontext():
        started, cpu_started = time.perf_counter(), cpu_seconds_of(pids or [])
        redis_started = cpu_seconds_of(server)
        await wait_backlog(client, queue, at_most=0)
        rate = left / (time.perf_counter() - started)
        cpu = (cpu_seconds_of(pids) - cpu_started) / left * 1e6 if pids else None
        redis_cpu = (cpu_seconds_of(server) - redis_started) / left * 1e6
    return rate, cpu, redis_cpu


async def bare(client: RedisClient, url: str, queue: str, total: int) -> Sample:
    """The floor: XREADGROUP per shard, XACK+XDEL pipelined per batch."""

    async def loop(stream: str) -> None:
        while True:
            reply = await client.xreadgroup(GROUP, "bare", {stream: ">"}, count=100, block=100)
            ids = [entry_id for _s, entries in reply or [] for entry_id, _f in entries]
            if ids:
                pipe = client.pipeline(transaction=False)
                pipe.xack(stream, GROUP, *ids)
                pipe.xdel(stream, *ids)
                await pipe.execute()

    loops = [asyncio.create_task(loop(s)) for s in queue_streams([queue], SHARDS)]
    try:
        # Its CPU is this process's, the backlog polling included (well under 1 us/msg).
        return await drain_rate(client, queue, total, pids=[os.getpid()])
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)


def workers(
    processes: int,
    *,
    root: Path = ROOT,
    around: Around | None = None,
    limits: QueueLimits | None = None,
) -> Variant:
    """``processes`` worker processes of the checkout at ``root`` (``-m`` imports from there);
    ``around`` (a profiler) is entered with their pids while they drain; ``limits`` are
    the queue's (``composer:limits:{<queue>}``), set before they start."""

    async def run(client: RedisClient, url: str, queue: str, total: int) -> Sample:
        if limits is not None:
            await write_limits(client, queue, limits)
        procs = [
            await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "dispatcher.cli", "worker", "--queue", queue),
                *("--handler", "benchmarks.worker_consume:noop"),
                *("--consumer", f"bench-{i}", "--redis-url", url, "--log-level", "WARNING"),
                cwd=root,
                stdout=subprocess.DEVNULL,
            )
            for i in range(processes)
        ]
        pids = [p.pid for p in procs]
        try:
            return await drain_rate(client, queue, total, pids=pids, around=around)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 60)

    return run


LIMITED_1 = "dispatcher worker, 1 process, queue limits set (not binding)"
LIMITED_2 = "dispatcher worker, 2 processes, queue limits set (not binding)"
VARIANTS: dict[str, Variant] = {
    "bare XREADGROUP + XACK/XDEL (1 process)": bare,
    "dispatcher worker, 1 process": workers(1),
    "dispatcher worker, 2 processes": workers(2),
}


async def one_round(client: RedisClient, url: str, variant: Variant, messages: int) -> Sample:
    queue = f"bench{uuid.uuid4().hex[:8]}"
    await publish(client, queue, messages)
    sample = await variant(client, url, queue, messages)
    await client.delete(*queue_streams([queue], SHARDS))
    return sample


def figure(variant: Variant, messages: int) -> Callable[[BenchEnv], Awaitable[dict[str, float]]]:
    """``variant`` as a variant of ``benchmarks.run``'s worker figure (the bench's own Redis)."""

    async def run(env: BenchEnv) -> dict[str, float]:
        client = connect_redis(env.redis_url)
        try:
            await publish_shard_count(client, SHARDS)
            rate, cpu, redis_cpu = await one_round(client, env.redis_url, variant, messages)
            await client.flushdb()  # the round's dedup keys and leases
            return {"cpu_us_per_msg": cpu or 0.0, "redis_us_per_msg": redis_cpu, "msgs_per_s": rate}
        finally:
            await client.aclose()

    return run


def chosen_variants(
    baseline: Path | None, *, single: bool, limits: bool = False
) -> dict[str, Variant]:
    """The variants to run: with the baseline's beside ours, with queue limits set (not
    binding) beside none, and maybe without 2 processes."""
    found = dict(VARIANTS)
    if limits:
        found[LIMITED_1] = workers(1, limits=LOOSE_LIMITS)
        found[LIMITED_2] = workers(2, limits=LOOSE_LIMITS)
    if baseline is not None:
        found["baseline worker, 1 process"] = workers(1, root=baseline)
        found["baseline worker, 2 processes"] = workers(2, root=baseline)
    if single:
        found = {name: v for name, v in found.items() if "2 processes" not in name}
    return found


async def measure(
    url: str, *, messages: int, rounds: int, variants: dict[str, Variant]
) -> dict[str, list[Sample]]:
    client = connect_redis(url)
    await publish_shard_count(client, SHARDS)
    rates: dict[str, list[Sample]] = {name: [] for name in variants}
    try:
        for r in range(rounds):
            for name, variant in variants.items():
                print(f"round {r + 1}/{rounds}: {name} ...", file=sys.stderr, flush=True)
                rates[name].append(await one_round(client, url, variant, messages))
                rate, cpu, redis_cpu = rates[name][-1]
                print(
                    f"  {rate:,.0f} msgs/s, cpu {cpu or 0:.1f} us/msg, Redis {redis_cpu:.1f}",
                    file=sys.stderr,
                )
                await client.flushdb()  # dedup keys of the round
                await publish_shard_count(client, SHARDS)
    finally:
        await client.aclose()
    return rates


def render(
    samples: dict[str, list[Sample]], *, messages: int, rounds: int, load: tuple[str, str]
) -> str:
    floor = statistics.median(rate for rate, _, _ in next(iter(samples.values())))
    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split(" ")[2].removeprefix("v=")  # fmt: skip
    lines = [
        "# Worker consume rate",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores; Python "
        f"{platform.python_version()}; redis-server {redis_version} (own process, loopback)",
        f"- backlog: {messages} messages over {SHARDS} shards, no-op async handler, "
        f"worker with its defaults; rate from 5 % consumed to empty",
        f"- {rounds} rounds, variants interleaved; median (min-max) msgs/s; consumer CPU "
        "(user + system of its processes over the same window) per message",
        f"- load average (1/5/15 min) before: {load[0]}; after: {load[1]}",
        f"- reproduce: `.venv/bin/python -m benchmarks.worker_consume {' '.join(sys.argv[1:])}`",
        "",
        "| variant | msgs/s (median) | min-max | vs bare | consumer CPU us/msg (median, min-max) "
        "| Redis CPU us/msg (median, min-max) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, found in samples.items():
        rates = [rate for rate, _, _ in found]
        cpus = [cpu for _, cpu, _ in found if cpu is not None]
        median = statistics.median(rates)
        lines.append(
            f"| {name} | {median:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} "
            f"| {median / floor:.2f}x | {_spread(cpus)} | {_spread([r for _, _, r in found])} |"
        )
    return "\n".join(lines) + "\n"


def _spread(values: list[float]) -> str:
    """``median (min-max)`` to one decimal, or ``-`` for none."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout to run as well")
    parser.add_argument("--single", action="store_true", help="1-process variants only")
    parser.add_argument(
        "--limits", action="store_true", help="also the workers with queue limits, not binding"
    )
    parser.add_argument("--out", type=Path, default=RESULT, help="the markdown file written")
    args = parser.parse_args()
    variants = chosen_variants(args.baseline, single=args.single, limits=args.limits)
    workdir = Path(tempfile.mkdtemp(prefix="od-bench-worker-"))
    server = RedisProcess(workdir / "redis").start()
    before = load_average()
    try:
        rates = asyncio.run(
            measure(server.url, messages=args.messages, rounds=args.rounds, variants=variants)
        )
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    load = (before, load_average())
    table = render(rates, messages=args.messages, rounds=args.rounds, load=load)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)


if __name__ == "__main__":
    main()
