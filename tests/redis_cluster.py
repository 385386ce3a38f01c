"""A Redis Cluster of throwaway Redis processes on loopback, for the tests and benchmarks."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dispatcher.demo.throwaway import RedisProcess, redis_binary
from tests.waiting import eventually_sync

__all__ = ["RedisClusterProcess"]


class RedisClusterProcess:
    """A Redis Cluster of ``masters`` masters (and ``replicas`` per master) on loopback."""

    def __init__(self, workdir: Path, *, masters: int = 3, replicas: int = 0) -> None:
        cluster = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        self.nodes = [
            RedisProcess(workdir / f"node{i}", *cluster, "--cluster-node-timeout", "2000")
            for i in range(masters * (1 + replicas))
        ]
        self.replicas = replicas

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterProcess:
        for node in self.nodes:
            node.start()
        nodes = [f"127.0.0.1:{n.port}" for n in self.nodes]
        replicas = ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        subprocess.run(
            [redis_binary("redis-cli"), "--cluster", "create", *nodes, *replicas],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        for node in self.nodes:
            eventually_sync(node.cluster_ok, within=30)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
