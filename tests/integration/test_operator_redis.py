"""What the operator asks Redis per pass: one pipelined round trip, exact numbers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from dispatcher.controller.redis_access import WORKER_GROUP, measure
from dispatcher.stream.naming import SHARDS_KEY, task_stream


class CountingConnection(Connection):
    """A real connection that counts its writes: each write is one round trip."""

    writes = 0

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        CountingConnection.writes += 1
        await super().send_packed_command(command, check_health)


@pytest.fixture
async def counted(redis_url: str) -> Any:
    client = Redis.from_url(redis_url, decode_responses=True, connection_class=CountingConnection)
    await client.ping()  # connect (and any handshake) before counting
    CountingConnection.writes = 0
    yield client
    await client.aclose()


async def test_ten_queues_of_sixteen_shards_are_measured_in_one_round_trip(counted: Any) -> None:
    queues = [f"q{i}" for i in range(10)]
    await counted.set(SHARDS_KEY, "16")
    for n in range(30):
        await counted.xadd(task_stream("q3", n % 16), {"task_id": str(n)})
    await counted.xgroup_create(task_stream("q3", 5), WORKER_GROUP, id="0")
    await counted.xreadgroup(WORKER_GROUP, "w", {task_stream("q3", 5): ">"}, count=1)
    CountingConnection.writes = 0

    found = await measure(counted, queues=queues, shards=16)

    assert CountingConnection.writes == 1
    assert found.published == 16
    assert found.queue("q3") == (30, 1)
    assert found.queue("q7") == (0, 0)


async def test_a_count_set_by_hand_above_the_expected_one_is_read_in_full(counted: Any) -> None:
    await counted.set(SHARDS_KEY, "8")
    await counted.xadd(task_stream("q", 6), {"task_id": "t"})
    CountingConnection.writes = 0

    found = await measure(counted, queues=["q"], shards=4)

    assert CountingConnection.writes == 2  # one more, only because the count was unexpected
    assert (found.published, found.shards, found.queue("q")) == (8, 8, (1, 0))
