"""What one idle claim costs the enqueuer, piece by piece: ``python -m benchmarks.claim_cost``.

At idle every dispatch is one claim of one row (the notification carries
nothing). This times, on one connection of the enqueuer's pool, each piece of
that claim with one row waiting: a plain round trip (``SELECT 1``), the claim's
statement sent by a sync connection, the same as ``BatchClaims`` begins it (prepared
once per session), ``BatchClaims.claim_batch`` up to the rows in hand
(journal task started), and the settlement. Medians in ms over ``--samples``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

import psycopg

from benchmarks.env import bench_env, machine_facts
from dispatcher.outbox.claim import PREPARE, ClaimStatement
from dispatcher.outbox.repository import OutboxRepository, enqueuer_pool
from tests.data import insert_rows


def _ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def measure(db_url: str, samples: int) -> dict[str, float]:
    pool = enqueuer_pool(db_url, max_size=2)
    await pool.open(wait=True)
    repo = OutboxRepository(pool)
    times: dict[str, list[float]] = {
        "round trip (SELECT 1)": [],
        "claim statement, sync": [],
        "claim statement, ClaimStatement.begin": [],
        "claim_batch, rows in hand": [],
        "settlement": [],
    }
    claim = ClaimStatement(limit=100, hold_for=30.0)
    with psycopg.connect(db_url, autocommit=True) as sync:
        for statement in PREPARE:
            sync.execute(statement)

        def one_row() -> None:
            sync.execute("DELETE FROM outbox")
            insert_rows(db_url, 1, queue="cost", prefix=f"c{uuid.uuid4().hex[:8]}-")

        for _ in range(samples):
            one_row()
            started = time.perf_counter()
            cur = sync.cursor()
            cur.execute(claim.batch)
            while cur.nextset():
                pass
            times["claim statement, sync"].append(time.perf_counter() - started)
            sync.execute("ROLLBACK")
        async with pool.connection() as conn:
            await repo.claims._begin(conn, claim, probe=False)  # prepares them on this session
            await conn.rollback()
            for _ in range(samples):
                started = time.perf_counter()
                await conn.execute("SELECT 1")
                times["round trip (SELECT 1)"].append(time.perf_counter() - started)
                one_row()
                started = time.perf_counter()
                await repo.claims._begin(conn, claim, probe=False)
                times["claim statement, ClaimStatement.begin"].append(time.perf_counter() - started)
                await conn.rollback()
        for _ in range(samples):
            one_row()
            started = time.perf_counter()
            async with repo.claims.claim_batch(100, hold_for=30.0) as batch:
                times["claim_batch, rows in hand"].append(time.perf_counter() - started)
                if batch.journal is not None:
                    await batch.journal
                started = time.perf_counter()
                await batch.settle(batch.ids, [], [])
                times["settlement"].append(time.perf_counter() - started)
    await repo.aclose()
    await pool.close()
    return {name: _ms(values[samples // 10 :]) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    print(machine_facts())
    with bench_env() as env:
        results: dict[str, Any] = asyncio.run(measure(env.db_url, args.samples))
    print(f"one idle claim of one row, medians of {args.samples}, load {os.getloadavg()}")
    for name, ms in results.items():
        print(f"  {name:40} {ms:6.3f} ms")


if __name__ == "__main__":
    main()
