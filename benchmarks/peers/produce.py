"""The producer of the Python systems: an application inserting tasks in its transactions.

``python -m benchmarks.peers.produce SYSTEM URL TASKS PER_COMMIT GAP_MS PREFIX COMMIT_LOG``
(SYSTEM: ours, procrastinate or celery; URL: the database, or Redis for Celery). As
``riverbench produce``: it connects, prints ``ready``, waits for a line on stdin, commits
PER_COMMIT tasks at a time (GAP_MS idle before each commit), writes ``<task> <unix ns>`` per
task (when its commit returned) to COMMIT_LOG, prints ``done`` and exits when stdin closes, so
its PostgreSQL backend lives until the harness has read the CPU it spent. Celery has no
transaction: a "commit" is PER_COMMIT ``delay`` calls.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

QUEUE = "peers"


def _ours(url: str) -> Callable[[list[str]], None]:
    import psycopg

    from dispatcher.models import TaskDispatch
    from dispatcher.outbox import enqueue_dispatch

    conn = psycopg.connect(url, application_name="peers-producer")

    def commit(tasks: list[str]) -> None:
        with conn.pipeline():  # the inserts of a transaction in one round trip, as InsertMany
            for task in tasks:
                enqueue_dispatch(conn, TaskDispatch(task_id=task, run_id="r", workflow_id="w",
                    workflow_version=1, node_id="n", node_type="noop", queue=QUEUE))  # fmt: skip
        conn.commit()

    return commit


def _celery(url: str) -> Callable[[list[str]], None]:
    from benchmarks.peers.celery_app import app, noop

    app.conf.broker_url = url
    noop.delay("warm-connection")  # connect now, not inside the first measured "commit"

    def commit(tasks: list[str]) -> None:
        for task in tasks:
            noop.delay(task)

    return commit


def _run(commit: Callable[[list[str]], Any], args: list[str]) -> None:
    tasks, per_commit, gap_ms, prefix, log = int(args[0]), int(args[1]), int(args[2]), *args[3:5]
    print("ready", flush=True)
    sys.stdin.readline()
    lines = []
    for start in range(0, tasks, per_commit):
        if gap_ms:
            time.sleep(gap_ms / 1000)
        batch = [f"{prefix}-{i}" for i in range(start, min(start + per_commit, tasks))]
        commit(batch)
        now = time.time_ns()
        lines.extend(f"{task} {now}\n" for task in batch)
    with open(log, "w") as out:
        out.writelines(lines)
    print("done", flush=True)
    sys.stdin.read()


async def _procrastinate(url: str, args: list[str]) -> None:
    import psycopg

    from benchmarks.peers.pc_app import app, noop

    async with app.open_async():
        session = await psycopg.AsyncConnection.connect(url, application_name="peers-producer")
        loop = asyncio.get_running_loop()

        async def commit(tasks: list[str]) -> None:
            deferrer = noop.configure(connection=session)
            if len(tasks) == 1:
                await deferrer.defer_async(task=tasks[0])
            else:
                await deferrer.batch_defer_async(*({"task": t} for t in tasks))
            await session.commit()

        def sync_commit(tasks: list[str]) -> None:
            asyncio.run_coroutine_threadsafe(commit(tasks), loop).result()

        await asyncio.to_thread(_run, sync_commit, args)
        await session.close()


def main(argv: list[str]) -> None:
    system, url, rest = argv[0], argv[1], argv[2:]
    if system == "procrastinate":
        asyncio.run(_procrastinate(url, rest))
    else:
        _run({"ours": _ours, "celery": _celery}[system](url), rest)


if __name__ == "__main__":
    main(sys.argv[1:])
