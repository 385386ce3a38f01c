"""AOF checked while the enqueuer runs: turned off, it is said once; with --require-aof the
enqueuer stops publishing (rows stay PENDING) until AOF is back.

A Redis of the test's own (``CONFIG SET appendonly`` changes the server) and a real
enqueuer on the test's loop; the watch reads ``INFO persistence`` every 5 s.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream import publish_shard_count
from tests.data import insert_rows
from tests.enqueuers import make_enqueuer, running
from tests.outbox_rows import outbox_status
from tests.waiting import eventually

OFF = "Redis runs without AOF now"


@pytest.fixture
async def aof_client(aof_redis: RedisProcess) -> AsyncIterator[RedisClient]:
    client = connect_redis(aof_redis.url)
    await publish_shard_count(client, 1)
    yield client
    await client.aclose()


def _said(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("require", [True, False], ids=["require-aof", "warn-only"])
async def test_aof_turned_off_while_running_is_said_and_with_require_stops_publishing(
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    aof_client: RedisClient,
    require: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    enqueuer = make_enqueuer(pool, aof_client, poll_interval=0.05)
    enqueuer.durability.require = require
    async with running(enqueuer):
        insert_rows(outbox_db_url, 3, queue="q", shards=1, prefix="before-")
        await eventually(lambda: not outbox_status(outbox_db_url), within=20)
        await aof_client.config_set("appendonly", "no")
        await eventually(lambda: _said(caplog, OFF), within=20, what="AOF off said")
        insert_rows(outbox_db_url, 3, queue="q", shards=1, prefix="during-")
        if require:
            # Held: still PENDING after two more readings of the watch.
            with pytest.raises(AssertionError):
                await eventually(lambda: not outbox_status(outbox_db_url), within=11)
            assert outbox_status(outbox_db_url) == {"PENDING": 3}
            await aof_client.config_set("appendonly", "yes")
        await eventually(lambda: not outbox_status(outbox_db_url), within=20)
    assert await aof_client.xlen("workflow.tasks.q.0") == 6
    assert _said(caplog, OFF) == 1, "said once"
    assert ("publishing stopped" in caplog.text) is require
    assert ("Redis runs with AOF again" in caplog.text) is require
