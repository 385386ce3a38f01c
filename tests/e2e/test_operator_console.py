"""The chart's web console on the real node: its Pod and Service, the status naming its URL,
and the page reached through ``kubectl port-forward`` as docs/console.md says.

A release of its own (namespace ``od-console``) with the chart's
OutboxDispatcher and ``console.enabled=true``, over a database and a Redis database of its
own: the console container runs from the enqueuer image as the chart renders it (non-root,
read-only root), the dispatcher's ``status.consoleUrl`` names the console's Service, and the
numbers its API serves through the port-forward are the servers' (the shard count the
operator wrote, the outbox's rows due later). Its operator logs at DEBUG: no line of it holds
a Secret's value, its base64 or the database password. ``helm uninstall`` removes it.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from dispatcher import TaskDispatch, enqueue_dispatch
from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from tests.e2e.cluster_objects import for_pods, get, kubectl
from tests.waiting import eventually_sync
from tools.cluster import Cluster
from tools.cluster.binaries import ROOT

pytestmark = pytest.mark.timeout(900)

NS = RELEASE = "od-console"
NAME = "orders"
SHARDS = 3  # not the chart's default, so the page's figure is the operator's write
PASSWORD = f"pw-{uuid.uuid4().hex}"
RD_PASSWORD = f"rd-{uuid.uuid4().hex}"
COMPONENT = "app.kubernetes.io/component=console"  # the console's objects


@pytest.fixture(scope="module")
def release(
    cluster: Cluster, cluster_postgres: PostgresProcess, cluster_redis: RedisProcess
) -> Iterator[str]:
    """The release installed; the database URL (from the host). Uninstalled after."""
    database = cluster_postgres.create_database("console")
    # A password in the URL (the server trusts the bridge, so any works): what must not leak.
    database = database.replace("@", f":{PASSWORD}@", 1)
    redis_url = redis_with_password(cluster_redis)
    cluster.run("kubectl", "create", "namespace", NS)
    for secret, url in (("dispatcher-postgres", database), ("dispatcher-redis", redis_url)):
        kubectl(cluster, "-n", NS, "create", "secret", "generic", secret,
                f"--from-literal=url={for_pods(url)}")  # fmt: skip
    kubectl(cluster, "-n", NS, "create", "secret", "generic", "console-token",
            f"--from-literal=token={uuid.uuid4().hex}")  # fmt: skip
    cluster.run(
        "helm", "install", RELEASE, str(ROOT / "charts" / "outbox-dispatcher"), "--namespace", NS,
        "--set", "operator.logLevel=DEBUG",
        "--set", "dispatcher.enabled=true", "--set", f"dispatcher.name={NAME}",
        "--set", f"dispatcher.spec.shards={SHARDS}",
        "--set", "console.enabled=true", "--set", "console.token.secretRef.name=console-token",
    )  # fmt: skip
    try:
        yield database
    finally:
        cluster.run("helm", "-n", NS, "uninstall", RELEASE, "--wait")
        cluster.run("kubectl", "delete", "namespace", NS, "--wait=true", "--timeout=180s")


def redis_with_password(redis: RedisProcess) -> str:
    """The Redis the release uses: a database of its own, as ``default`` with a password
    (the server's default user has none, so any works): what must not leak either."""
    url = redis.url.rsplit("/", 1)[0] + "/5"
    return url.replace("redis://", f"redis://default:{RD_PASSWORD}@", 1)


def console_deployment(cluster: Cluster) -> dict[str, Any]:
    listed = kubectl(cluster, "-n", NS, "get", "deployments", "-l", COMPONENT, "-o", "json")
    found = json.loads(listed)["items"]
    (deployment,) = found
    return dict(deployment)


def test_the_dispatchers_status_names_the_consoles_service(cluster: Cluster, release: str) -> None:
    def url() -> str | None:
        obd = get(cluster, "obd", NAME, namespace=NS)
        return (obd.get("status") or {}).get("consoleUrl")

    eventually_sync(lambda: url() is not None, within=300, interval=2, what="status.consoleUrl")
    name = console_deployment(cluster)["metadata"]["name"]
    service = get(cluster, "service", name, namespace=NS)
    port = service["spec"]["ports"][0]["port"]
    assert url() == f"http://{name}.{NS}.svc:{port}/"


def test_the_console_runs_from_the_enqueuer_image_as_a_non_root_user(
    cluster: Cluster, release: str
) -> None:
    name = console_deployment(cluster)["metadata"]["name"]
    kubectl(cluster, "-n", NS, "rollout", "status", f"deployment/{name}", "--timeout=300s")
    listed = kubectl(cluster, "-n", NS, "get", "pods", "-l", COMPONENT, "-o", "json")
    pods = json.loads(listed)["items"]
    (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    (container,) = pod["spec"]["containers"]
    assert container["image"].rsplit("/", 1)[-1].startswith("outbox-dispatcher-enqueuer:")
    pod_name = pod["metadata"]["name"]
    assert kubectl(cluster, "-n", NS, "exec", pod_name, "--", "id", "-u").strip() != "0"
    wrote = cluster.run_status(
        "kubectl", "-n", NS, "exec", pod_name, "--", "sh", "-c", "echo x > /probe"
    )
    assert wrote != 0  # a read-only root


def test_the_page_and_its_numbers_come_through_kubectl_port_forward(
    cluster: Cluster, release: str
) -> None:
    name = console_deployment(cluster)["metadata"]["name"]
    kubectl(cluster, "-n", NS, "rollout", "status", f"deployment/{name}", "--timeout=300s")
    pending = 7
    with psycopg.connect(release) as conn:  # due in an hour: they stay in the outbox
        for _ in range(pending):
            dispatch = TaskDispatch(
                task_id=f"later-{uuid.uuid4().hex[:8]}", run_id="console", workflow_id="wf",
                workflow_version=1, node_id="n", node_type="t", queue="default", input="{}",
            )  # fmt: skip
            enqueue_dispatch(conn, dispatch, datetime.now(UTC) + timedelta(hours=1))
    # As docs/console.md says: kubectl port-forward svc/<name> <local>:80 (here: any port).
    forward = subprocess.Popen(
        [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "-n", NS,
         "port-forward", f"svc/{name}", ":80"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        first = forward.stdout.readline()
        found = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) ->", first)
        assert found, first
        base = f"http://127.0.0.1:{found.group(1)}"
        with urllib.request.urlopen(base + "/", timeout=30) as page:
            assert page.status == 200
            assert "outbox-dispatcher" in page.read().decode().lower()

        def sample() -> dict[str, Any] | None:
            with urllib.request.urlopen(base + "/api/overview", timeout=30) as answer:
                found: dict[str, Any] | None = json.load(answer)["sample"]
            return found

        def shown() -> bool:
            now = sample()
            return (
                now is not None
                and now["shard_count"] == SHARDS
                and (now["outbox"]["due_later"] == pending)
            )

        eventually_sync(shown, within=120, interval=2, what="the servers' numbers on the page")
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def test_the_operator_at_debug_logs_no_secret_value(
    cluster: Cluster, release: str, cluster_redis: RedisProcess
) -> None:
    """docs/security.md: Secret values are never logged, at any level: neither URL (whole,
    quoted or base64 as the Secret holds it) nor either password."""
    eventually_sync(
        lambda: "ShardsPublished" in kubectl(cluster, "-n", NS, "get", "events"),
        within=300, interval=2, what="the shard count written (both Secrets read)",
    )  # fmt: skip
    logs = kubectl(
        cluster, "-n", NS, "logs", "deployment/" + operator_deployment(cluster), "--tail=-1"
    )
    assert '"level": "debug"' in logs  # the level the release asked for (JSON lines)
    for url in (for_pods(release), for_pods(redis_with_password(cluster_redis))):
        for form in (url, quote(url, safe=""), base64.b64encode(url.encode()).decode()):
            assert form not in logs, f"{form[:16]}... logged"
    assert PASSWORD not in logs
    assert RD_PASSWORD not in logs


def operator_deployment(cluster: Cluster) -> str:
    found = json.loads(kubectl(cluster, "-n", NS, "get", "deployments", "-o", "json"))["items"]
    (name,) = [d["metadata"]["name"] for d in found if d["metadata"]["name"].endswith("-operator")]
    return str(name)
