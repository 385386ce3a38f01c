"""The console over a big backlog: ``python -m benchmarks.console_load [--entries 1000000]``.

What it measures, with one queue of ``--entries`` entries (4 shards, a consumer
group holding 1,000 of them pending), ``--dead`` dead letters in its
``workflow.dead`` stream, as many rows in ``outbox_dlq`` and ``--keys``
attempt keys (the keyspace a SCAN for new streams walks):

- how long each JSON endpoint takes (median of ``--rounds``): the first
  overview (a SCAN and a sample), a cached overview, the first page of dead
  letters, a page deep in them (by cursor), the first page of ``outbox_dlq``;
- a run's lookup (a search of bounded steps): its first request, and every step of a
  whole search (how many, and how long each) for a run with 100 attempt keys and no rows,
  and for a run with ``--dead`` rows in ``outbox_dlq`` (each step stops at 500 of them);
- how long headless Chromium (Debian's, as the browser tests drive it) takes
  from navigation to the queues drawn and to the first page of dead letters
  drawn (``performance.mark`` of the page itself);
- the CPU Redis spends (its ``INFO cpu``, user + sys) over ``--window`` seconds
  with the console's page open and polling at the default 2 s refresh, against
  the same window with no console running: the difference over the window is
  what the console adds.

Private PostgreSQL and redis-server on free ports; ``dispatcher console`` as a
process (the CLI). Writes ``benchmarks/results/console_load.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import redis as sync_redis

from benchmarks.workload import ROOT, load_average
from dispatcher.console.run_search import CHUNK, SCAN_COUNT, SCAN_STEPS
from dispatcher.demo.throwaway import PostgresProcess, RedisProcess, free_port
from dispatcher.outbox.schema import migrate
from dispatcher.stream.naming import SHARDS_KEY, dead_letter_stream, task_stream
from tests.chromium import chromium

RESULT = ROOT / "benchmarks" / "results" / "console_load.md"
QUEUE, SHARDS, GROUP = "big", 4, "workers"
FIELDS = {
    "task_id": "t",
    "run_id": "run-bench",
    "workflow_id": "wf",
    "workflow_version": "1",
    "node_id": "n",
    "node_type": "http",
    "attempt": "1",
    "input": '{"order": 12345, "items": [1, 2, 3]}',
    "outbox_id": "0",
}
DEAD = {"error": "ValueError: no such customer", "delivery_count": "5", "runs": "5"}


def fill_redis(r: sync_redis.Redis, *, entries: int, dead: int, keys: int) -> None:
    r.set(SHARDS_KEY, SHARDS)
    batch = 5000
    for start in range(0, entries, batch):
        pipe = r.pipeline(transaction=False)
        for n in range(start, min(start + batch, entries)):
            pipe.xadd(task_stream(QUEUE, n % SHARDS), {**FIELDS, "task_id": f"t{n}"})
        pipe.execute()
    for shard in range(SHARDS):
        r.xgroup_create(task_stream(QUEUE, shard), GROUP, id="0")
        r.xreadgroup(GROUP, "worker-1", {task_stream(QUEUE, shard): ">"}, count=250)
    for start in range(0, dead, batch):
        pipe = r.pipeline(transaction=False)
        for n in range(start, min(start + batch, dead)):
            source = task_stream(QUEUE, n % SHARDS)
            fields = {**FIELDS, **DEAD, "task_id": f"d{n}", "source_stream": source}
            pipe.xadd(dead_letter_stream(QUEUE), {**fields, "source_id": f"{n}-0"})
        pipe.execute()
    for start in range(0, keys, batch):
        pipe = r.pipeline(transaction=False)
        for n in range(start, min(start + batch, keys)):
            pipe.set(f"dispatcher:attempt:run-{n // 100}:t{n}:1", "done")
        pipe.execute()


async def _migrate(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn)


def fill_postgres(url: str, *, dead: int) -> None:
    asyncio.run(_migrate(url))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_dlq (id, task_id, stream, payload, attempts, last_error, moved_at)"
            " SELECT 'row-' || g, 't' || g, 'workflow.tasks.big', '{\"run_id\": \"r\"}', 6,"
            "        'publish failed', now() - g * interval '1 second'"
            "   FROM generate_series(1, %s) g",
            (dead,),
        )
        conn.execute("ANALYZE outbox_dlq")


def redis_cpu(r: sync_redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def get(url: str) -> tuple[float, Any]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return time.perf_counter() - started, json.loads(body) if body[:1] in b"{[" else None


def start_console(db_url: str, redis_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                *("-m", "dispatcher.cli", "console", "--port", str(port)),
                *("--database-url", db_url, "--redis-url", redis_url),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the console did not answer: {log.read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM; the seconds the console took to exit."""
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return time.perf_counter() - started


def endpoint_times(base: str, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}

    def timed(name: str, path: str) -> Any:
        spent, body = get(base + path)
        times.setdefault(name, []).append(spent * 1000)
        return body

    timed("first overview (SCAN + sample)", "/api/overview")
    for _ in range(rounds):
        timed("overview (the last sample)", "/api/overview")
        page = timed("dead letters, first page", f"/api/dead-letters?queue={QUEUE}&limit=50")
        for _ in range(20):  # 1,000 entries deep
            page = get(base + f"/api/dead-letters?queue={QUEUE}&limit=50&before={page['next']}")[1]
        timed(
            "dead letters, a page 1,000 deep",
            f"/api/dead-letters?queue={QUEUE}&limit=50&before={page['next']}",
        )
        timed("outbox_dlq, first page", "/api/dead-letters?limit=50")
        timed("the page (index.html)", "/")
    return times


def run_search(base: str, run_id: str) -> tuple[list[float], int]:
    """Every step of one whole search for ``run_id``: ms each, and what it found."""
    steps: list[float] = []
    found = 0
    cursor: str | None = None
    while True:
        query = urllib.parse.urlencode({"run_id": run_id, **({"cursor": cursor} if cursor else {})})
        spent, doc = get(f"{base}/api/run?{query}")
        steps.append(spent * 1000)
        found += len(doc["attempts"]) + len(doc["outbox"]) + len(doc["outbox_dlq"])
        cursor = doc["next"]
        if cursor is None:
            return steps, found


def run_rows(base: str, rounds: int) -> list[str]:
    """Lines of the run lookup's table: first request over ``rounds``, then one whole search."""
    lines = []
    for what, run_id in (
        ("100 attempt keys, no rows", "run-7"),
        ("all of outbox_dlq's rows", "r"),
    ):
        firsts = [run_search_first(base, run_id) for _ in range(rounds)]
        steps, found = run_search(base, run_id)
        lines.append(
            f"| {what} | {statistics.median(firsts):.1f} | {max(firsts):.1f} | {len(steps)} "
            f"| {found:,} | {statistics.median(steps):.1f} | {max(steps):.1f} |"
        )
    return lines


def run_search_first(base: str, run_id: str) -> float:
    spent, _ = get(f"{base}/api/run?{urllib.parse.urlencode({'run_id': run_id})}")
    return spent * 1000


def browser(driver: Any, base: str, rounds: int) -> tuple[list[float], list[float]]:
    """Navigation to the queues drawn, and to the dead letters drawn (ms, the page's marks)."""
    queues: list[float] = []
    dead: list[float] = []
    for view, found in (("#overview", queues), ("#dead", dead)):
        name = "console:sample-shown" if view == "#overview" else "console:dead-shown"
        script = (
            f"const m = performance.getEntriesByName('{name}');"
            " return m.length ? m[0].startTime : null;"
        )
        for _ in range(rounds):
            driver.get("about:blank")
            driver.get(base + "/" + view)
            for _ in range(600):
                at = driver.execute_script(script)
                if at is not None:
                    found.append(float(at))
                    break
                time.sleep(0.05)
    driver.get(base + "/#overview")  # left open: it polls
    return queues, dead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=10)
    # Two of the console's SCANs for new streams (one a minute) fall in it.
    parser.add_argument("--window", type=float, default=120.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="od-bench-console-"))
    workdir.chmod(0o755)
    pg = PostgresProcess(workdir / "pg").start()
    redis_proc = RedisProcess(workdir / "redis").start()
    r = sync_redis.Redis.from_url(redis_proc.url, decode_responses=True)
    console: subprocess.Popen[bytes] | None = None
    before = load_average()
    try:
        started = time.perf_counter()
        fill_redis(r, entries=args.entries, dead=args.dead, keys=args.keys)
        fill_postgres(pg.url(), dead=args.dead)
        print(f"filled in {time.perf_counter() - started:.0f} s; keyspace {r.dbsize()} keys")
        time.sleep(2)
        cpu0 = redis_cpu(r)
        time.sleep(args.window)
        idle_cpu = redis_cpu(r) - cpu0

        port = free_port()
        console = start_console(pg.url(), redis_proc.url, port, workdir / "console.log")
        base = f"http://127.0.0.1:{port}"
        times = endpoint_times(base, args.rounds)
        runs = run_rows(base, args.rounds)
        with chromium() as driver:
            queues_ms, dead_ms = browser(driver, base, args.rounds)
            time.sleep(5)  # the page open on the overview, polling at 2 s
            cpu0 = redis_cpu(r)
            time.sleep(args.window)
            console_cpu = redis_cpu(r) - cpu0
        stopped = stop(console)
    finally:
        if console is not None and console.poll() is None:
            print((workdir / "console.log").read_text()[-4000:])
            console.kill()
        r.close()
        redis_proc.kill()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    after = load_average()
    added = (console_cpu - idle_cpu) / args.window * 100
    command = " ".join(["python -m benchmarks.console_load", *sys.argv[1:]])
    run_lines = "\n".join(runs)
    rows = "\n".join(
        f"| {name} | {statistics.median(ms):.1f} | {max(ms):.1f} |" for name, ms in times.items()
    )
    text = f"""# The console over a big backlog

`{command}`: one queue of {args.entries:,} entries on {SHARDS} shards (1,000 pending),
{args.dead:,} dead letters in `workflow.dead.{QUEUE}` and {args.dead:,} rows in `outbox_dlq`,
{args.keys:,} attempt keys; load average before {before}, after {after} (2 cores).

JSON endpoints (ms, over HTTP on loopback; {args.rounds} rounds):

| request | median | max |
|---|---|---|
{rows}

A run's lookup, `/api/run` (ms; a search of bounded steps: each request reads {CHUNK:,}
rows of `outbox` and of `outbox_dlq` by key and makes {SCAN_STEPS} `SCAN ... COUNT {SCAN_COUNT}`
calls; the first request over {args.rounds} rounds, then one whole search step by step):

| run | first request, median | max | steps to complete | found | per step, median | max |
|---|---|---|---|---|---|---|
{run_lines}

Headless Chromium, navigation to the view drawn (ms, `performance.mark` of the page;
{args.rounds} loads each): queues {statistics.median(queues_ms):.0f} median,
{max(queues_ms):.0f} max; dead letters {statistics.median(dead_ms):.0f} median,
{max(dead_ms):.0f} max.

Redis CPU over {args.window:.0f} s: {idle_cpu:.3f} s with no console, {console_cpu:.3f} s with the
page open and polling at the default 2 s refresh: the console adds **{added:.2f} %** of one core
(its SCAN for new streams, every 60 s, included). SIGTERM to exit: {stopped:.2f} s.
"""
    print(text)
    RESULT.write_text(text)


if __name__ == "__main__":
    main()
