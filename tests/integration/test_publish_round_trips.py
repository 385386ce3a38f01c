"""``publish_many`` is one network round trip per Redis node, counted two ways.

A connection subclass counts the writes the client makes to each node (one
pipelined write is one round trip), and the servers' own ``INFO
commandstats`` confirm that all 1,000 XADDs arrived. Both run against the
suite's own servers, so no other client adds noise.
"""

from __future__ import annotations

import collections
from typing import Any, ClassVar

from redis.asyncio import Connection, ConnectionPool, Redis, RedisCluster

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.stream import RedisStreamPublisher, queue_streams, shard_for, task_stream
from tests.redis_cluster import RedisClusterProcess

N = 1000


class CountingConnection(Connection):
    sends: ClassVar[collections.Counter[int]] = collections.Counter()

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends[int(self.port)] += 1
        await super().send_packed_command(command, check_health)


def xadd_calls(server: RedisProcess) -> int:
    for line in server.cli("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_xadd:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def entries(queue: str, shards: int) -> list[tuple[str, dict[str, str]]]:
    ids = [f"task-{i}" for i in range(N)]
    return [(task_stream(queue, shard_for(t, shards)), {"task_id": t}) for t in ids]


async def test_standalone_batch_is_one_round_trip(redis_process: RedisProcess) -> None:
    pool = ConnectionPool(
        port=redis_process.port,
        connection_class=CountingConnection,
        decode_responses=True,
        health_check_interval=0,
    )
    client = Redis(connection_pool=pool)
    await client.ping()
    CountingConnection.sends.clear()

    results = await RedisStreamPublisher(client).publish_many(entries("rt", 4))

    assert all(r.ok for r in results)
    assert CountingConnection.sends == {redis_process.port: 1}
    assert xadd_calls(redis_process) == N
    await client.aclose()


async def test_cluster_batch_is_one_round_trip_per_node(
    redis_cluster_process: RedisClusterProcess, queue: str
) -> None:
    client = RedisCluster(
        host="127.0.0.1",
        port=redis_cluster_process.nodes[0].port,
        decode_responses=True,
        health_check_interval=0,
    )
    await client.initialize()
    for node in client.get_nodes():  # RedisCluster takes no connection_class; its nodes do
        await node.disconnect()
        node._connections.clear()
        node._free.clear()
        node.connection_class = CountingConnection
    owners = {client.get_node_from_key(s).port for s in queue_streams([queue], 8)}
    publisher = RedisStreamPublisher(client)
    await publisher.publish_many([(s, {"warm": "up"}) for s in queue_streams([queue], 8)])
    before = sum(xadd_calls(n) for n in redis_cluster_process.nodes)
    CountingConnection.sends.clear()

    results = await publisher.publish_many(entries(queue, 8))

    assert all(r.ok for r in results)
    assert dict(CountingConnection.sends) == dict.fromkeys(owners, 1)
    assert len(owners) > 1
    assert sum(xadd_calls(n) for n in redis_cluster_process.nodes) - before == N
    await client.aclose()
