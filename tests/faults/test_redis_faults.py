"""Redis-side faults under concurrent load: scenarios 5, 6, 10 and 13.

Redis killed and restarted with AOF (``appendfsync always``) and paused with
``CLIENT PAUSE``; the network to Redis blackholed (longer than several publish
retries), slowed and reset through the ``TcpProxy``; and a Redis Cluster
master killed, its replica promoted: with ``--wait-replicas 1`` rows stay in the
outbox until a replica has them (lost 0); with 0 the loss window is measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.stream import queue_streams
from tests.faults.harness import Pipeline, scale
from tests.faults.load import LoadSpec
from tests.fix_proxy import TcpProxy
from tests.redis_cluster import RedisClusterProcess
from tests.waiting import eventually_sync


def test_redis_restarted_with_aof_and_paused(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    redis = own_redis("--appendonly", "yes", "--appendfsync", "always")
    p = pipeline(redis.url)
    p.enqueuer()
    p.worker()
    p.worker()
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate / 2))
    for _ in range(max(1, s.rounds // 2)):
        p.progress()
        redis.kill()  # SIGKILL: only what AOF fsynced survives
        redis.start()
        p.fault("redis SIGKILL + restart (AOF)")
        p.progress()
        redis.cli("CLIENT", "PAUSE", "2000", "ALL")
        p.fault("CLIENT PAUSE 2000 ALL")
    # Handlers that returned while Redis was gone could not write their done mark: they run
    # again after the reclaim (at-least-once). Counted in the report, not zero here.
    p.verify(within=s.drain_within, duplicates_allowed=True)


def test_redis_blackholed_past_several_retries_then_slowed_and_reset(
    pipeline: Callable[..., Pipeline], proxied_redis: tuple[RedisProcess, TcpProxy]
) -> None:
    s = scale()
    redis, proxy = proxied_redis
    p = pipeline(redis.url)  # the checker's view; the pipeline talks through the proxy
    p.enqueuer(redis_url=proxy.url())
    p.worker(redis_url=proxy.url())
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate / 2))
    for _ in range(max(1, s.rounds // 3)):
        p.progress()
        proxy.blackhole()
        p.fault("blackhole 5 s (publish timeout 1 s)")
        time.sleep(5)  # the fault's length: several publish timeouts and retries
        proxy.heal()
        p.progress()
        proxy.latency(0.05)
        p.fault("50 ms latency for 2 s")
        time.sleep(2)
        proxy.heal()
        p.fault("connections reset", proxy.reset())
    p.verify(within=s.drain_within, duplicates_allowed=True)  # as above: done marks lost


def test_cluster_master_killed_replica_promoted_with_wait_replicas(
    pipeline: Callable[..., Pipeline], own_cluster: Callable[..., RedisClusterProcess]
) -> None:
    s = scale()
    cluster = own_cluster(replicas=1)
    p = pipeline(cluster.url, cluster=True)
    p.enqueuer("--wait-replicas", "1")
    p.worker()
    p.worker()
    load = p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate / 2))
    p.progress()

    victim, _ = _fail_over_a_lagging_master(cluster, p)
    # The new master has no replica: WAIT 1 cannot be met, its rows stay in the outbox.
    eventually_sync(lambda: _retrying(p.db_url) > 0 or load.done, within=30)
    p.fault("rows kept unreplicated (RETRY)", _retrying(p.db_url))
    victim.start()  # rejoins as the new master's replica; WAIT 1 succeeds again
    eventually_sync(lambda: victim.cli("ROLE").startswith("slave"), within=60)
    p.verify(within=s.drain_within, duplicates_allowed=True)


def test_cluster_master_killed_without_wait_replicas_reports_what_was_lost(
    pipeline: Callable[..., Pipeline], own_cluster: Callable[..., RedisClusterProcess]
) -> None:
    """The trade of ``--wait-replicas 0``, measured on the same fault as the scenario above.

    The master acks entries its replica does not have yet, the enqueuer deletes their rows,
    the master dies: entries no worker had read by then are gone. Workers start after the
    failover (a backlog, as after a deploy), so the whole lag window shows in ``lost``.
    Nothing else may go wrong: no unexpected task, nothing left behind.
    """
    s = scale()
    cluster = own_cluster(replicas=1)
    p = pipeline(cluster.url, cluster=True)
    p.enqueuer()
    # Three times the usual task count, so the load is still writing when the replica lags.
    load = p.start_load(LoadSpec(tasks=3 * s.tasks, rate=s.rate / 2))
    eventually_sync(lambda: load.attempted >= 20 or load.done, within=60)
    victim, _ = _fail_over_a_lagging_master(cluster, p)
    victim.start()
    eventually_sync(lambda: victim.cli("ROLE").startswith("slave"), within=60)
    p.worker()
    p.worker()
    report = p.verify(within=s.drain_within, duplicates_allowed=True, loss_allowed=True)
    assert report.lost, "entries acked during the replica's lag should have died with the master"


def _fail_over_a_lagging_master(
    cluster: RedisClusterProcess, p: Pipeline, lag: float = 1.5
) -> tuple[RedisProcess, RedisProcess]:
    """Make a stream master's replica lag for ``lag`` s under load, kill the master, let the
    replica (missing what the master acked meanwhile) be promoted. Returns both.

    Freezing the replica alone makes no lag on loopback: the kernel keeps delivering the
    replication stream into its socket buffer, which it reads on waking. A 32 MB write
    first fills that buffer, so what the master acks afterwards waits in the master's
    own memory and dies with it.
    """
    victim = _master_of_a_stream(cluster, p)
    replica = _replica_of(cluster, victim)
    stream = next(
        s for s in queue_streams([p.queue], 4) if p.redis.get_node_from_key(s).port == victim.port
    )
    replica.pause()
    p.redis.set(f"{{{stream}}}:ballast", "x" * (32 << 20))
    added = _entries_added(p, stream)
    p.fault(f"replica lagging {lag} s")
    time.sleep(lag)  # the fault's length: the master keeps acking writes nobody replicates
    # On a loaded machine the enqueuer can publish nothing to this stream within ``lag``: the
    # window then holds no entry and the scenario tests nothing. Keep lagging until it does.
    eventually_sync(lambda: _entries_added(p, stream) >= added + 5, within=60)
    victim.kill()
    replica.resume()
    p.fault("cluster master SIGKILL")
    eventually_sync(lambda: replica.cli("ROLE").startswith("master"), within=60)
    eventually_sync(lambda: "cluster_state:ok" in replica.cli("CLUSTER", "INFO"), within=60)
    p.fault("replica promoted")
    return victim, replica


def _entries_added(p: Pipeline, stream: str) -> int:
    """Entries ever added to ``stream`` (monotonic: XDEL by workers does not lower it)."""
    if not p.redis.exists(stream):
        return 0
    return int(p.redis.xinfo_stream(stream)["entries-added"])


def _retrying(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE status = 'RETRY'").fetchone()
    return int(row[0]) if row else 0


def _master_of_a_stream(cluster: RedisClusterProcess, p: Pipeline) -> RedisProcess:
    """A master that holds one of the queue's shard streams (not the bootstrap node)."""
    ports = {p.redis.get_node_from_key(stream).port for stream in queue_streams([p.queue], 4)}
    masters = [n for n in cluster.nodes if n.cli("ROLE").startswith("master")]
    preferred = [n for n in masters if n.port in ports and n is not cluster.nodes[0]]
    return (preferred or [n for n in masters if n is not cluster.nodes[0]])[0]


def _replica_of(cluster: RedisClusterProcess, master: RedisProcess) -> RedisProcess:
    for node in cluster.nodes:
        role = node.cli("ROLE").splitlines()
        if role[0] == "slave" and int(role[2]) == master.port:
            return node
    raise AssertionError(f"no replica of {master.port}")
