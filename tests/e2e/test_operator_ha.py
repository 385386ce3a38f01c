"""End to end on the local cluster: two operator replicas, one Redis database per
dispatcher, every namespace.

The chart is installed with ``operator.replicas=2`` and ``operator.watchAllNamespaces=true``
(a ClusterRole; leader election is on by default). In order, sharing that installation:
exactly one replica acts, the holder of the Lease (every Event the operator posts names it);
after ``kill -9`` of its process the other replica holds the Lease within 20 s and acts; a
leader deleted gracefully (SIGTERM) releases the Lease and the other takes it;
a second dispatcher on the first one's Redis database is ``Degraded=RedisConflict`` with a
Warning Event and writes nothing (the shard count stays the owner's), and the owner's deletion
releases the marker to it; a dispatcher in a second namespace is reconciled. The dispatchers run no
Pods (no migration, no enqueuer replica, queues scaled from zero): only the operators do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from dispatcher.stream.naming import SHARDS_KEY, SHARDS_OWNER_KEY
from tests.e2e.cluster_objects import condition, condition_status, events_in, get, kubectl
from tests.waiting import eventually_sync
from tools.cluster import HOST_IP, Cluster
from tools.cluster.binaries import ROOT

pytestmark = pytest.mark.timeout(900)

NS, OTHER_NS, RELEASE = "od-ha", "od-ha-other", "ha"
OPERATOR = f"{RELEASE}-outbox-dispatcher-operator"  # the Deployment, and the Lease's name
CRD = ROOT / "crds" / "outboxdispatchers.yaml"
COMPONENT = "outbox-dispatcher-operator"  # the Events' reportingComponent


def holder(cluster: Cluster) -> str | None:
    spec = get(cluster, "lease", OPERATOR, namespace=NS).get("spec") or {}
    return spec.get("holderIdentity")


def operator_pods(cluster: Cluster) -> list[str]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
    listing = kubectl(cluster, "-n", NS, "get", "pods", "-l", selector, "-o", "json")
    pods = json.loads(listing)["items"]
    return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))


def our_events(cluster: Cluster, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
    events = events_in(cluster, namespace, reason=reason)
    return [e for e in events if e.get("reportingComponent") == COMPONENT]


def dispatcher(name: str, namespace: str, *, shards: int, redis_secret: str) -> str:
    """A dispatcher that runs no Pod: no migration, no enqueuer replica, a queue from zero."""
    return json.dumps(
        {
            "apiVersion": "dispatch.composer.dev/v1alpha1",
            "kind": "OutboxDispatcher",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "shards": shards,
                "migrate": False,
                "postgres": {"secretRef": {"name": "pg", "key": "url"}},
                "redis": {"secretRef": {"name": redis_secret, "key": "url"}},
                "enqueuer": {"replicas": 0},
                "queues": [
                    {"name": "q", "handler": "builtins:print", "minReplicas": 0, "maxReplicas": 1}
                ],
            },
        }
    )


def secret(cluster: Cluster, namespace: str, name: str, url: str) -> None:
    kubectl(cluster, "-n", namespace, "create", "secret", "generic", name,
            f"--from-literal=url={url.replace('127.0.0.1', HOST_IP)}")  # fmt: skip


@pytest.fixture(scope="module")
def urls(cluster_postgres: PostgresProcess, cluster_redis: RedisProcess) -> dict[str, str]:
    """A database, and two Redis databases of the session's Redis (flushed first)."""
    found = {"pg": cluster_postgres.create_database("ha")}
    for name, db in (("redis", 11), ("redis-other", 12)):
        found[name] = f"{cluster_redis.url.rsplit('/', 1)[0]}/{db}"
        redis.Redis.from_url(found[name]).flushdb()
    return found


@pytest.fixture(scope="module")
def installed(cluster: Cluster, urls: dict[str, str]) -> Iterator[None]:
    kubectl(cluster, "apply", "--server-side", "-f", str(CRD))
    eventually_sync(  # kubectl wait fails, rather than waits, before the first condition
        lambda: kubectl(cluster, "wait", "--for=condition=Established",
                        "crd/outboxdispatchers.dispatch.composer.dev", "--timeout=60s"),
        within=60,
        interval=1,
        ignoring=(RuntimeError,),
        what="the CRD established",
    )  # fmt: skip
    try:
        cluster.run(
            "helm", "install", RELEASE, str(ROOT / "charts" / "outbox-dispatcher"),
            "--namespace", NS, "--create-namespace", "--skip-crds",
            "--set", "operator.replicas=2,operator.watchAllNamespaces=true",
        )  # fmt: skip
        yield
    finally:
        for namespace in (NS, OTHER_NS):
            cluster.run_status("kubectl", "-n", namespace, "delete", "obd", "--all", "--wait=true")
        cluster.run_status("helm", "-n", NS, "uninstall", RELEASE, "--wait")
        cluster.run_status("kubectl", "delete", "namespace", NS, OTHER_NS, "--wait=false")


def test_two_operator_replicas_run_and_only_the_leases_holder_acts(
    cluster: Cluster, urls: dict[str, str], installed: None
) -> None:
    kubectl(cluster, "-n", NS, "rollout", "status", f"deployment/{OPERATOR}", "--timeout=180s")
    pods = operator_pods(cluster)
    assert len(pods) == 2, pods
    eventually_sync(
        lambda: holder(cluster) in pods,
        within=60,
        interval=1,
        ignoring=(RuntimeError,),  # no Lease yet
        what="a Lease holder",
    )
    for name, key in (("pg", "pg"), ("rd", "redis")):
        secret(cluster, NS, name, urls[key])
    kubectl(cluster, "apply", "-f", "-", stdin=dispatcher("one", NS, shards=2, redis_secret="rd"))
    eventually_sync(
        lambda: (get(cluster, "obd", "one", namespace=NS).get("status") or {}).get("shards") == 2,
        within=120,
        interval=1,
        what="status.shards = 2",
    )
    kubectl(cluster, "-n", NS, "patch", "obd", "one", "--type=merge", "-p",
            '{"spec": {"shards": 3}}')  # fmt: skip
    client = redis.Redis.from_url(urls["redis"], decode_responses=True)
    eventually_sync(lambda: client.get(SHARDS_KEY) == "3", within=60, interval=1, what="3 shards")
    leader = holder(cluster)
    published = our_events(cluster, NS, "ShardsPublished")
    assert {e.get("reportingInstance") for e in our_events(cluster, NS)} == {leader}, published
    messages = sorted(e["message"] for e in published)
    assert messages == [f"{SHARDS_KEY} = 2", f"{SHARDS_KEY} = 3"], published  # each once


def test_after_kill_9_of_the_leader_the_other_replica_takes_over(
    cluster: Cluster, urls: dict[str, str], installed: None
) -> None:
    leader = holder(cluster)
    assert leader is not None
    (standby,) = [p for p in operator_pods(cluster) if p != leader]
    pids = cluster.container_pids(NS, leader, "operator")
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    eventually_sync(
        lambda: holder(cluster) == standby, within=20, interval=0.25, what="the standby leads"
    )
    print(f"the standby held the Lease {time.monotonic() - killed:.1f} s after kill -9")
    kubectl(cluster, "-n", NS, "patch", "obd", "one", "--type=merge", "-p",
            '{"spec": {"shards": 4}}')  # fmt: skip
    client = redis.Redis.from_url(urls["redis"], decode_responses=True)
    eventually_sync(lambda: client.get(SHARDS_KEY) == "4", within=60, interval=1, what="4 shards")
    (event,) = [e for e in our_events(cluster, NS, "ShardsPublished") if e["message"].endswith("4")]
    assert event["reportingInstance"] == standby
    assert holder(cluster) == standby  # the restarted container did not take it back


def test_a_leader_deleted_gracefully_releases_the_lease_to_the_other(
    cluster: Cluster, installed: None
) -> None:
    leader = holder(cluster)
    assert leader is not None
    (standby,) = [p for p in operator_pods(cluster) if p != leader]
    # Its log, followed until the container ends (a deleted Pod's log is gone with it).
    following = subprocess.Popen(
        [str(cluster.bin_dir / "kubectl"), "-n", NS, "logs", "-f", leader, "-c", "operator"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env(),
    )  # fmt: skip
    kubectl(cluster, "-n", NS, "delete", "pod", leader, "--wait=true")  # SIGTERM, then gone
    log, _ = following.communicate(timeout=60)
    assert "released" in log
    eventually_sync(
        lambda: holder(cluster) == standby, within=30, interval=0.25, what="the other leads"
    )
    kubectl(cluster, "-n", NS, "rollout", "status", f"deployment/{OPERATOR}", "--timeout=180s")


def test_a_second_dispatcher_on_the_same_redis_database_is_degraded_and_writes_nothing(
    cluster: Cluster, urls: dict[str, str], installed: None
) -> None:
    client = redis.Redis.from_url(urls["redis"], decode_responses=True)
    owner = json.loads(client.get(SHARDS_OWNER_KEY) or "{}")
    uid = get(cluster, "obd", "one", namespace=NS)["metadata"]["uid"]
    assert owner == {"namespace": NS, "name": "one", "uid": uid}
    kubectl(cluster, "apply", "-f", "-", stdin=dispatcher("two", NS, shards=7, redis_secret="rd"))

    def degraded() -> dict[str, Any] | None:
        found = condition(get(cluster, "obd", "two", namespace=NS), "Degraded")
        return found if found is not None and found["status"] == "True" else None

    eventually_sync(lambda: degraded() is not None, within=120, interval=1, what="two Degraded")
    found = degraded()
    assert found is not None
    assert found["reason"] == "RedisConflict", found
    assert f"OutboxDispatcher {NS}/one" in found["message"]
    assert condition_status(get(cluster, "obd", "one", namespace=NS), "Degraded") == "False"
    (warning,) = our_events(cluster, NS, "RedisConflict")
    assert warning["type"] == "Warning"
    assert warning["involvedObject"]["name"] == "two"
    assert client.get(SHARDS_KEY) == "4"  # the owner's count, not 7
    assert (get(cluster, "obd", "two", namespace=NS).get("status") or {}).get("shards") is None
    two = cluster.run_status("kubectl", "-n", NS, "get", "deployment", "two-worker-q")
    assert two != 0  # nothing rendered for it either
    kubectl(cluster, "-n", NS, "delete", "obd", "one", "--wait=true")

    # The owner's deletion releases the marker and wakes the dispatcher it kept out: now it
    # owns the database and its count is published.
    def taken() -> bool:
        marker = json.loads(client.get(SHARDS_OWNER_KEY) or "{}")
        return marker.get("name") == "two" and client.get(SHARDS_KEY) == "7"

    eventually_sync(taken, within=60, interval=1, what="two owns the database")
    eventually_sync(
        lambda: (
            (condition(get(cluster, "obd", "two", namespace=NS), "Degraded") or {}).get("status")
            == "False"
        ),
        within=60,
        interval=1,
        what="two no longer Degraded",
    )


def test_a_dispatcher_in_another_namespace_is_reconciled(
    cluster: Cluster, urls: dict[str, str], installed: None
) -> None:
    kubectl(cluster, "create", "namespace", OTHER_NS)
    secret(cluster, OTHER_NS, "pg", urls["pg"])
    secret(cluster, OTHER_NS, "rd", urls["redis-other"])
    kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        stdin=dispatcher("three", OTHER_NS, shards=5, redis_secret="rd"),
    )
    eventually_sync(
        lambda: (
            condition_status(get(cluster, "obd", "three", namespace=OTHER_NS), "Ready") == "True"
        ),
        within=120,
        interval=1,
        what="three Ready",
    )
    client = redis.Redis.from_url(urls["redis-other"], decode_responses=True)
    assert client.get(SHARDS_KEY) == "5"
    deployment = get(cluster, "deployment", "three-worker-q", namespace=OTHER_NS)
    assert deployment["metadata"]["ownerReferences"][0]["name"] == "three"
    instances = {e.get("reportingInstance") for e in our_events(cluster, OTHER_NS)}
    assert instances == {holder(cluster)}
