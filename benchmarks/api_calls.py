"""API calls per pass per dispatcher in a steady state, counted on the operator's client (#32).

``python -m benchmarks.api_calls [--dispatchers 5] [--seconds 60]`` starts the local control
plane (``tools.cluster``: etcd, kube-apiserver, controller-manager, kubelet),
a PostgreSQL and a Redis of its own, then runs the real operator in this process against
them, once per variant, each in a namespace of its own with ``--dispatchers`` idle
dispatchers (no replicas, no migration Job: nothing changes). Once every dispatcher is
``Ready``, it counts for ``--seconds`` the requests of the operator's ``KubeClient`` by verb
and the passes (``dispatcher_operator_reconciles_total``), and prints requests per pass per
dispatcher, the passes' own and those of the caches' relists and watches apart.

The intervals are the defaults scaled down together, so the ratios (and thus the calls per
pass) are the defaults': a pass every second instead of 15 s, Secrets kept 4 s instead of
60 s, a relist every 20 s instead of 300 s. Variants, side by side:

- ``cached``: this operator as it ships (Secrets read once per ``secret_ttl``);
- ``no-secret-cache``: every pass reads its Secrets (``secret_ttl=0``), as before #32.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
from prometheus_client import CollectorRegistry

from dispatcher.controller.api_connection import KubeClient
from dispatcher.controller.handlers import register
from dispatcher.controller.loops import Operator
from dispatcher.controller.operator_config import OperatorConfig
from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from tests.operator_kit import kopf_running
from tools.cluster import Cluster, start, stop

SCALE = 15.0  # the default pass interval over the benchmark's
PASSES = "dispatcher_operator_reconciles_total"
STREAMS = ("list", "watch")  # the caches' requests; the rest are the passes'


def dispatcher(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "dispatch.composer.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "shards": 2,
            "migrate": False,
            "postgres": {"secretRef": {"name": "pg", "key": "url"}},
            "redis": {"secretRef": {"name": "rd", "key": "url"}},
            "enqueuer": {"replicas": 0},
            "queues": [{"name": "emails", "handler": "app.tasks:send", "minReplicas": 0}],
        },
    }


def prepare(cluster: Cluster, namespace: str, *, urls: dict[str, str], dispatchers: int) -> None:
    cluster.run("kubectl", "create", "namespace", namespace)
    for name, url in urls.items():
        data = base64.b64encode(url.encode()).decode()
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                  "data": {"url": data}}  # fmt: skip
        cluster.run("kubectl", "-n", namespace, "apply", "-f", "-", stdin=json.dumps(secret))
    for i in range(dispatchers):
        body = json.dumps(dispatcher(f"d{i}", namespace))
        cluster.run("kubectl", "-n", namespace, "apply", "-f", "-", stdin=body)


@contextlib.asynccontextmanager
async def operator_in(
    cluster: Cluster, namespace: str, config: OperatorConfig, registry: CollectorRegistry
) -> AsyncIterator[Operator]:
    client = await KubeClient.connect(str(cluster.kubeconfig))
    kopf_registry = kopf.OperatorRegistry()
    running = register(kopf_registry, Operator(config, client=client, registry=registry))
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kopf.on.login(registry=kopf_registry)(kopf.login_with_kubeconfig)
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    async with kopf_running(kopf_registry, settings, namespace=namespace, seconds=60):
        yield running


async def measure(
    cluster: Cluster, namespace: str, *, secret_ttl: float, seconds: float, dispatchers: int
) -> tuple[Counter[str], float]:
    """The client's requests by verb within the window, and the passes in it."""
    config = OperatorConfig(
        autoscale_interval=15.0 / SCALE, secret_ttl=secret_ttl, resync_interval=300.0 / SCALE
    )
    registry = CollectorRegistry()
    async with operator_in(cluster, namespace, config, registry) as operator:
        deadline = time.monotonic() + 300
        while not all(_ready(operator, (namespace, f"d{i}")) for i in range(dispatchers)):
            if time.monotonic() > deadline:
                raise SystemExit(f"the dispatchers in {namespace} did not become Ready")
            await asyncio.sleep(1)
        await asyncio.sleep(2 * 15.0 / SCALE)  # the pass that saw Ready has written its status
        assert operator.client is not None
        calls, passes = Counter(operator.client.calls), _passes(registry)
        await asyncio.sleep(seconds)
        return Counter(operator.client.calls) - calls, _passes(registry) - passes


def _ready(operator: Operator, key: tuple[str, str]) -> bool:
    status = (operator.dispatchers.get(key) or {}).get("status") or {}
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _passes(registry: CollectorRegistry) -> float:
    return sum(
        registry.get_sample_value(PASSES, {"outcome": o}) or 0.0
        for o in ("applied", "failed", "migrating")
    )


def report(name: str, calls: Counter[str], passes: float) -> str:
    own = sum(n for verb, n in calls.items() if verb not in STREAMS)
    streams = sum(n for verb, n in calls.items() if verb in STREAMS)
    verbs = ", ".join(f"{verb} {n}" for verb, n in sorted(calls.items())) or "none"
    per = (own + streams) / passes if passes else float("nan")
    return (
        f"{name:>16}: {passes:.0f} passes; requests {verbs}; per pass per dispatcher: "
        f"{own / passes:.3f} by the passes + {streams / passes:.3f} by the caches = {per:.3f}"
    )


async def run(cluster: Cluster, args: argparse.Namespace, urls: dict[str, str]) -> list[str]:
    lines = []
    for name, ttl in (("cached", 60.0 / SCALE), ("no-secret-cache", 0.0)):
        namespace = f"bench-{name}"
        prepare(cluster, namespace, urls=urls, dispatchers=args.dispatchers)
        calls, passes = await measure(
            cluster, namespace, secret_ttl=ttl, seconds=args.seconds, dispatchers=args.dispatchers
        )
        lines.append(report(name, calls, passes))
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_calls", description=__doc__)
    parser.add_argument("--dispatchers", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="od-bench-api-"))
    postgres = PostgresProcess(Path(tempfile.mkdtemp(prefix="od-bench-api-pg-")))
    redis = RedisProcess(workdir / "redis")
    try:
        cluster = start(workdir / "cluster")
        postgres.start()
        redis.start()
        cluster.run("kubectl", "apply", "--server-side", "-f", "crds/outboxdispatchers.yaml")
        time.sleep(5)  # kubectl wait fails on a CRD the API server has not given a status yet
        cluster.run("kubectl", "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/outboxdispatchers.dispatch.composer.dev")  # fmt: skip
        urls = {"pg": postgres.url(), "rd": redis.url}
        asyncio.run(run(cluster, args, urls))
        print(f"load average at the end: {os.getloadavg()}")
    finally:
        redis.kill()
        postgres.stop()
        stop(workdir / "cluster")
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(postgres.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
