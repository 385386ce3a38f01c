"""End to end on the local cluster: the CRD, the chart, a dispatcher, 1,000 dispatches.

Runs wherever the suite runs (no Docker: the cluster of ``tests/fix_cluster.py``, whose real
node runs the project's images with containerd and runc). In order,
as a user would: the CRD applied client-side and server-side; the chart installed with
``helm install`` as the README says (the operator runs as its ServiceAccount under the
chart's RBAC); the Secrets and ``deploy/example`` applied with ``kubectl``; the migration
Job, the enqueuer and the worker run as Pods (``kubectl get obd`` shows them); the release's
labels and the dispatcher's select apart; 1,000 dispatches committed on the host are
handled by the worker containers (each one's done mark in Redis, none lost); what only a node
shows (the image's user, a read-only root, the memory limit, a liveness restart, a graceful
stop finishing the task in hand, an unschedulable queue); a spec change (a handler of the
handler image) reaches the Pods; a backlog scales the workers; the shard count follows the
spec; deleting the dispatcher removes what it owned; ``helm uninstall`` leaves nothing of the
release in any namespaced kind the API server serves (the operator's Lease goes with its
owner); then the kustomize install (``deploy/base``: Pod Security "restricted" enforced)
runs the same dispatcher and is deleted as the README says. The tests share that one
installation, in order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis

from dispatcher import TaskDispatch, enqueue_dispatch
from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from dispatcher.stream.limit_keys import limits_key
from dispatcher.stream.naming import SHARDS_KEY
from dispatcher.worker import attempt_key
from tests.e2e.cluster_objects import condition, condition_status, for_pods, get, kubectl
from tests.e2e.leftovers import leftovers
from tests.waiting import eventually_sync
from tools.cluster import Cluster
from tools.cluster.binaries import ROOT

pytestmark = pytest.mark.timeout(900)

NS = RELEASE = "outbox-dispatcher"
NAME = "example"  # deploy/example's OutboxDispatcher
CRD = ROOT / "crds" / "outboxdispatchers.yaml"
CRD_NAME = "outboxdispatchers.dispatch.composer.dev"
RUN_ID = "e2e"


@dataclass(frozen=True)
class Backends:
    """The dispatcher's database and Redis: URLs from the host and from the Pods."""

    database_url: str
    redis_url: str

    def for_pods(self, url: str) -> str:
        return for_pods(url)


@pytest.fixture(scope="module")
def backends(cluster_postgres: PostgresProcess, cluster_redis: RedisProcess) -> Backends:
    return Backends(
        database_url=cluster_postgres.create_database("e2e"), redis_url=cluster_redis.url
    )


def commit(
    url: str, tasks: int, *, queue: str = "default", input: dict[str, Any] | None = None
) -> list[str]:
    """Commit ``tasks`` dispatches in one transaction on the host; return their task ids."""
    ids = [f"e2e-{uuid.uuid4().hex[:12]}" for _ in range(tasks)]
    with psycopg.connect(url) as conn:
        for task_id in ids:
            dispatch = TaskDispatch(
                task_id=task_id,
                run_id=RUN_ID,
                workflow_id="wf",
                workflow_version=1,
                node_id="n",
                node_type="t",
                queue=queue,
                input=json.dumps(input or {}),
            )
            enqueue_dispatch(conn, dispatch)
    return ids


def wait_handled(url: str, ids: list[str], *, within: float = 300) -> None:
    """Every task's done mark (written by a worker after its handler returned) is in Redis."""
    client = redis.Redis.from_url(url)
    keys = [attempt_key(f"{RUN_ID}:{task_id}:1") for task_id in ids]

    def lost() -> int:
        return len(keys) - sum(client.exists(*keys[i : i + 500]) for i in range(0, len(keys), 500))

    eventually_sync(lambda: lost() == 0, within=within, interval=1, what=f"{len(ids)} handled")


def test_the_crd_applies_client_side_and_server_side(cluster: Cluster) -> None:
    kubectl(cluster, "apply", "-f", str(CRD))
    kubectl(cluster, "apply", "--server-side", "-f", str(CRD))
    kubectl(cluster, "wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    managers = json.loads(
        kubectl(cluster, "get", "crd", CRD_NAME, "-o", "json", "--show-managed-fields")
    )
    fields = {m["manager"] for m in managers["metadata"]["managedFields"]}
    assert "kubectl" in fields  # the server-side apply's manager


def test_helm_install_runs_the_operator_as_its_service_account(cluster: Cluster) -> None:
    # As the README says it.
    cluster.run(
        "helm", "install", RELEASE, str(ROOT / "charts" / "outbox-dispatcher"),
        "--namespace", NS, "--create-namespace",
    )  # fmt: skip
    kubectl(
        cluster, "-n", NS, "rollout", "status", f"deployment/{RELEASE}-operator", "--timeout=180s"
    )
    pods = json.loads(kubectl(cluster, "-n", NS, "get", "pods", "-o", "json"))["items"]
    (operator,) = [p for p in pods if p["metadata"]["name"].startswith(f"{RELEASE}-operator-")]
    assert operator["spec"]["serviceAccountName"] == f"{RELEASE}-operator"
    # Ready by its readiness probe: kopf started and the CRD served (Operator.ready).
    (container,) = operator["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics",
                                                      "scheme": "HTTP"}  # fmt: skip
    assert condition_status(operator, "Ready") == "True"
    # Live on the same port (the CRD served, and served at start), with its metrics beside.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics",
                                                     "scheme": "HTTP"}  # fmt: skip
    fetch = (
        "import urllib.request as u; "
        "print(*(u.urlopen('http://127.0.0.1:9090' + p).status for p in "
        "('/healthz', '/readyz', '/metrics')))"
    )
    answers = kubectl(cluster, "-n", NS, "exec", operator["metadata"]["name"], "--",
                      "python", "-c", fetch)  # fmt: skip
    assert answers.split() == ["200", "200", "200"]
    # Its token is the ServiceAccount's, and the chart's Role is all it may do.
    account = f"system:serviceaccount:{NS}:{RELEASE}-operator"
    token = kubectl(cluster, "-n", NS, "exec", operator["metadata"]["name"], "--", "cat",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token")  # fmt: skip
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token.strip()}
    as_pod = cluster.state_dir / "operator-pod.kubeconfig"
    as_pod.write_text(json.dumps(config))
    whoami = json.loads(
        kubectl(cluster, "--kubeconfig", str(as_pod), "auth", "whoami", "-o", "json")
    )
    assert whoami["status"]["userInfo"]["username"] == account
    assert kubectl(cluster, "auth", "can-i", "patch", "outboxdispatchers/status", "-n", NS,
                   "--as", account).strip() == "yes"  # fmt: skip
    denied = cluster.run_status("kubectl", "auth", "can-i", "list", "secrets", "-n", "default",
                                "--as", account)  # fmt: skip
    assert denied != 0


def test_the_example_dispatcher_becomes_ready(cluster: Cluster, backends: Backends) -> None:
    for secret, url in (("dispatcher-postgres", backends.database_url),
                        ("dispatcher-redis", backends.redis_url)):  # fmt: skip
        kubectl(cluster, "-n", NS, "create", "secret", "generic", secret,
                f"--from-literal=url={backends.for_pods(url)}")  # fmt: skip
    kubectl(cluster, "apply", "-k", str(ROOT / "deploy" / "example"))

    def ready() -> bool:
        return condition_status(get(cluster, "obd", NAME, namespace=NS), "Ready") == "True"

    eventually_sync(ready, within=300, interval=2, what="the OutboxDispatcher Ready")
    listing = kubectl(cluster, "-n", NS, "get", "obd", "--no-headers")
    # NAME SHARDS QUEUES WORKERS (ready/wanted) BACKLOG READY AGE
    assert listing.split()[:6] == [NAME, "4", "default", "1/1", "0", "True"], listing
    assert condition_status(get(cluster, "obd", NAME, namespace=NS), "Migrated") == "True"
    # The migration ran as a Job's Pod: `dispatcher migrate`, to completion.
    jobs = json.loads(kubectl(cluster, "-n", NS, "get", "jobs", "-o", "json"))["items"]
    (job,) = [j for j in jobs if j["metadata"]["name"].startswith(f"{NAME}-migrate")]
    assert job["status"].get("succeeded") == 1
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    with psycopg.connect(backends.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_schema_version").fetchone()[0] >= 10  # type: ignore[index]
    for deployment in (f"{NAME}-enqueuer", f"{NAME}-worker-default"):
        kubectl(
            cluster, "-n", NS, "rollout", "status", f"deployment/{deployment}", "--timeout=180s"
        )
    # The Events it posted (the shard count written, at least) name the pod that posted them.
    pods = json.loads(kubectl(cluster, "-n", NS, "get", "pods", "-o", "json"))["items"]
    (operator,) = [
        p["metadata"]["name"]
        for p in pods
        if p["metadata"]["name"].startswith(f"{RELEASE}-operator-")
    ]
    events = json.loads(kubectl(cluster, "-n", NS, "get", "events", "-o", "json"))["items"]
    ours = [e for e in events if e.get("reportingComponent") == "outbox-dispatcher-operator"]
    assert "ShardsPublished" in {e["reason"] for e in ours}, [e["reason"] for e in ours]
    assert {e.get("reportingInstance") for e in ours} == {operator}


def test_the_release_and_the_dispatcher_are_selected_apart(cluster: Cluster) -> None:
    """The release's label (``instance``, Helm's) never selects what the operator made, and the
    dispatcher's (``dispatch.composer.dev/dispatcher``) never selects the release's objects:
    Deployments, the ReplicaSets and Pods their controllers made, budgets, Jobs, RBAC, Lease."""
    kinds = ("deployments,replicasets,pods,jobs,poddisruptionbudgets,serviceaccounts,roles,"
             "rolebindings,leases")  # fmt: skip

    def selected(selector: str) -> list[dict[str, Any]]:
        found = kubectl(cluster, "-n", NS, "get", kinds, "-l", selector, "-o", "json")
        items: list[dict[str, Any]] = json.loads(found)["items"]
        return items

    release = selected(f"app.kubernetes.io/instance={RELEASE}")
    dispatcher = selected(f"dispatch.composer.dev/dispatcher={NAME}")
    made = selected("app.kubernetes.io/managed-by=outbox-dispatcher-operator")
    by_helm = selected("app.kubernetes.io/managed-by=Helm")
    names = {kind: {f"{o['kind']}/{o['metadata']['name']}" for o in found}
             for kind, found in (("release", release), ("dispatcher", dispatcher),
                                 ("made", made), ("helm", by_helm))}  # fmt: skip
    assert f"Deployment/{RELEASE}-operator" in names["release"]
    owned = {f"Deployment/{NAME}-enqueuer", f"Deployment/{NAME}-worker-default"}
    assert owned <= names["dispatcher"]
    assert any(n.startswith(f"Pod/{NAME}-worker-default-") for n in names["dispatcher"])
    assert names["release"] & names["dispatcher"] == set()
    assert names["release"] & names["made"] == set()
    assert names["dispatcher"] & names["helm"] == set()
    assert names["helm"] <= names["release"]
    assert names["dispatcher"] <= names["made"]


def test_1000_dispatches_are_handled_by_the_worker_pods(
    cluster: Cluster, backends: Backends
) -> None:
    ids = commit(backends.database_url, 1000)
    wait_handled(backends.redis_url, ids)


def worker_pod(cluster: Cluster, queue: str) -> dict[str, Any]:
    """The one running Pod of a queue's workers."""
    selector = f"app.kubernetes.io/component=worker,dispatch.composer.dev/queue={queue}"
    pods = json.loads(kubectl(cluster, "-n", NS, "get", "pods", "-l", selector, "-o", "json"))
    running = [p for p in pods["items"] if p["status"].get("phase") == "Running"
               and "deletionTimestamp" not in p["metadata"]]  # fmt: skip
    assert len(running) == 1, [p["metadata"]["name"] for p in pods["items"]]
    return running[0]


def set_queue(cluster: Cluster, queue: dict[str, Any]) -> None:
    """Add ``queue`` to the example dispatcher, or replace the queue of its name."""
    queues = [
        q
        for q in get(cluster, "obd", NAME, namespace=NS)["spec"]["queues"]
        if q["name"] != queue["name"]
    ]
    patch = json.dumps({"spec": {"queues": [*queues, queue]}})
    kubectl(cluster, "-n", NS, "patch", "obd", NAME, "--type=merge", "-p", patch)


def test_a_worker_container_is_the_images_user_on_a_read_only_root_within_its_memory_limit(
    cluster: Cluster,
) -> None:
    pod = worker_pod(cluster, "default")["metadata"]["name"]

    def run(*argv: str) -> tuple[int, str]:
        done = subprocess.run(
            [str(cluster.bin_dir / "kubectl"), "-n", NS, "exec", pod, "--", *argv],
            capture_output=True, text=True, env=cluster.env(), check=False, timeout=60,
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    assert run("id", "-u") == (0, "10001\n")  # the Dockerfile's numeric USER
    status, said = run("sh", "-c", "echo x > /written")
    assert status != 0, said
    assert "Read-only file system" in said, said
    # deploy/example asks 256Mi for the default queue's workers: the kernel's limit says so.
    status, limit = run(
        "sh", "-c", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max"
        " 2>/dev/null",
    )  # fmt: skip
    assert str(256 * 1024 * 1024) in limit.split(), limit


def test_a_failing_liveness_probe_restarts_the_worker_container(cluster: Cluster) -> None:
    pod = worker_pod(cluster, "default")
    name = pod["metadata"]["name"]
    (before,) = [s["restartCount"] for s in pod["status"]["containerStatuses"]]
    # Frozen, the worker answers no probe: the kubelet must restart the container.
    for pid in cluster.container_pids(NS, name, "worker"):
        os.kill(pid, signal.SIGSTOP)

    def restarted() -> bool:
        found = get(cluster, "pod", name, namespace=NS)
        (status,) = found["status"]["containerStatuses"]
        return int(status["restartCount"]) > before and bool(status.get("ready"))

    eventually_sync(restarted, within=240, interval=2, what=f"{name} restarted by liveness")
    events = json.loads(kubectl(cluster, "-n", NS, "get", "events", "-o", "json",
                                f"--field-selector=involvedObject.name={name}"))  # fmt: skip
    assert any("Liveness probe failed" in e.get("message", "") for e in events["items"])


def test_a_deleted_worker_pod_finishes_the_task_in_hand_within_its_grace(
    cluster: Cluster, backends: Backends, handler_image: str
) -> None:
    set_queue(cluster, {"name": "slow", "image": handler_image, "handler": "e2e_handlers:slow",
                        "minReplicas": 1, "maxReplicas": 1})  # fmt: skip
    eventually_sync(
        lambda: cluster.run_status("kubectl", "-n", NS, "rollout", "status",
                                   f"deployment/{NAME}-worker-slow", "--timeout=5s") == 0,
        within=240, interval=2, what="the slow queue's worker",
    )  # fmt: skip
    client = redis.Redis.from_url(backends.redis_url, decode_responses=True)
    (task,) = commit(backends.database_url, 1, queue="slow", input={"seconds": 10})
    eventually_sync(lambda: client.get(f"e2e:runs:{task}") == "1", within=120, interval=0.5,
                    what="the slow task started")  # fmt: skip
    pod = worker_pod(cluster, "slow")["metadata"]["name"]
    kubectl(cluster, "-n", NS, "delete", "pod", pod, "--wait=false")  # SIGTERM, grace runs
    eventually_sync(lambda: client.get(f"e2e:done:{task}") == "1", within=120, interval=0.5,
                    what="the task in hand finished")  # fmt: skip
    # The replacement worker starts and finds nothing to run again.
    eventually_sync(lambda: worker_pod(cluster, "slow")["metadata"]["name"] != pod, within=240,
                    interval=2, ignoring=(AssertionError,), what="the new slow worker")  # fmt: skip
    wait_handled(backends.redis_url, [task])
    assert client.get(f"e2e:runs:{task}") == "1"


def test_an_unschedulable_queue_stays_pending_and_the_status_says_why(cluster: Cluster) -> None:
    set_queue(cluster, {"name": "nowhere", "handler": "builtins:print", "minReplicas": 1,
                        "maxReplicas": 1, "nodeSelector": {"disk": "none-such"}})  # fmt: skip

    def says_why() -> str | None:
        found = condition(get(cluster, "obd", NAME, namespace=NS), "Ready") or {}
        if found.get("status") == "False" and "Unschedulable" in found["reason"]:
            return str(found.get("message", ""))
        return None

    eventually_sync(lambda: says_why() is not None, within=240, interval=2,
                    what="Ready=False naming the unschedulable Pods")  # fmt: skip
    message = str(says_why())
    assert f"{NAME}-worker-nowhere" in message, message
    assert "node" in message, message
    selector = "dispatch.composer.dev/queue=nowhere"
    pods = json.loads(kubectl(cluster, "-n", NS, "get", "pods", "-l", selector, "-o", "json"))
    assert {p["status"]["phase"] for p in pods["items"]} == {"Pending"}
    queues = [q for q in get(cluster, "obd", NAME, namespace=NS)["spec"]["queues"]
              if q["name"] not in ("nowhere", "slow")]  # fmt: skip
    kubectl(cluster, "-n", NS, "patch", "obd", NAME, "--type=merge", "-p",
            json.dumps({"spec": {"queues": queues}}))  # fmt: skip


def test_a_spec_change_reaches_the_pods(
    cluster: Cluster, backends: Backends, handler_image: str
) -> None:
    handler = "e2e_handlers:noop"
    queues = get(cluster, "obd", NAME, namespace=NS)["spec"]["queues"]
    changed = {**queues[0], "image": handler_image, "handler": handler, "concurrency": 4}
    patch = {"spec": {"queues": [changed]}}
    kubectl(cluster, "-n", NS, "patch", "obd", NAME, "--type=merge", "-p", json.dumps(patch))
    deployment = f"deployment/{NAME}-worker-default"

    def rolled_out() -> bool:
        found = get(cluster, "deployment", f"{NAME}-worker-default", namespace=NS)
        args = found["spec"]["template"]["spec"]["containers"][0]["args"]
        return any(handler in arg for arg in args)

    eventually_sync(rolled_out, within=120, interval=1, what="the worker template changed")
    kubectl(cluster, "-n", NS, "rollout", "status", deployment, "--timeout=180s")
    ids = commit(backends.database_url, 100)
    wait_handled(backends.redis_url, ids)


def test_a_backlog_scales_the_workers_and_the_shard_count_follows_the_spec(
    cluster: Cluster, backends: Backends
) -> None:
    # A queue whose handler always fails (int(TaskMessage)): its entries stay, so its backlog
    # holds while the autoscaler adds workers (50 per replica).
    burst = {
        "name": "burst",
        "handler": "builtins:int",
        "minReplicas": 1,
        "maxReplicas": 3,
        "targetBacklogPerReplica": 50,
        "maxRuns": 1000,
        "reclaimIdleSeconds": 3600,
    }
    queues = get(cluster, "obd", NAME, namespace=NS)["spec"]["queues"]
    patch = {"spec": {"queues": [*queues, burst]}}
    kubectl(cluster, "-n", NS, "patch", "obd", NAME, "--type=merge", "-p", json.dumps(patch))
    eventually_sync(
        lambda: (
            cluster.run_status("kubectl", "-n", NS, "get", "deployment", f"{NAME}-worker-burst")
            == 0
        ),
        within=120,
        interval=1,
        what="the burst queue's workers",
    )
    commit(backends.database_url, 400, queue="burst")

    def scaled() -> bool:
        found = get(cluster, "deployment", f"{NAME}-worker-burst", namespace=NS)
        return int(found["spec"].get("replicas") or 0) > 1

    eventually_sync(scaled, within=300, interval=2, what="burst workers scaled up")
    kubectl(
        cluster, "-n", NS, "patch", "obd", NAME, "--type=merge", "-p", '{"spec": {"shards": 8}}'
    )
    client = redis.Redis.from_url(backends.redis_url, decode_responses=True)
    eventually_sync(
        lambda: client.get(SHARDS_KEY) == "8", within=120, interval=1, what="8 shards in Redis"
    )
    eventually_sync(
        lambda: (get(cluster, "obd", NAME, namespace=NS).get("status") or {}).get("shards") == 8,
        within=120,
        interval=1,
        what="status.shards = 8",
    )


def test_queue_limits_in_the_spec_reach_redis_and_change_live(
    cluster: Cluster, backends: Backends
) -> None:
    client = redis.Redis.from_url(backends.redis_url, decode_responses=True)
    key = limits_key("default")

    def limit(limits: dict[str, Any]) -> None:
        queues = get(cluster, "obd", NAME, namespace=NS)["spec"]["queues"]
        limited = [{**q, "limits": limits} if q["name"] == "default" else q for q in queues]
        patch = json.dumps({"spec": {"queues": limited}})
        kubectl(cluster, "-n", NS, "patch", "obd", NAME, "--type=merge", "-p", patch)

    def holds(expected: dict[str, Any]) -> bool:
        raw = client.get(key)
        return raw is not None and json.loads(str(raw)) == expected

    limit({"maxInFlight": 3})
    eventually_sync(lambda: holds({"max_in_flight": 3}), within=120, interval=1, what=key)
    limit({"maxInFlight": 5, "rate": 10, "burst": 2})
    expected = {"max_in_flight": 5, "rate": 10.0, "burst": 2}
    eventually_sync(lambda: holds(expected), within=120, interval=1, what="the change")
    client.set(key, json.dumps({"max_in_flight": 100}))  # by hand: the operator owns them
    eventually_sync(lambda: holds(expected), within=120, interval=1, what="put back")
    limit({})
    eventually_sync(lambda: holds({}), within=120, interval=1, what="no limits")


def test_the_api_server_refuses_nonsense_queue_limits(cluster: Cluster) -> None:
    for limits, says in [
        ({"burst": 5}, "burst requires rate"),
        ({"maxInFlight": -1}, "maxInFlight"),
        ({"rate": -2, "burst": 1}, "rate"),
    ]:
        bad = get(
            cluster, "obd", NAME, namespace=NS
        )  # the example, as another resource with these limits
        bad["metadata"] = {"name": "bad-limits", "namespace": NS}
        bad.pop("status", None)
        bad["spec"]["queues"][0]["limits"] = limits
        with pytest.raises(RuntimeError, match=says):
            kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(bad))


def test_deleting_the_dispatcher_removes_what_it_owned(cluster: Cluster) -> None:
    kubectl(cluster, "delete", "-k", str(ROOT / "deploy" / "example"), "--wait=true")
    selector = f"dispatch.composer.dev/dispatcher={NAME}"

    def gone() -> bool:
        owned = kubectl(cluster, "-n", NS, "get", "deployments,replicasets,pods", "-l", selector,
                        "-o", "name")  # fmt: skip
        return not owned.strip()

    eventually_sync(gone, within=180, interval=2, what="the dispatcher's objects collected")


def test_helm_uninstall_leaves_nothing_of_ours(cluster: Cluster) -> None:
    """Every namespaced kind the API server serves is listed (the operator's Lease too)."""
    kubectl(cluster, "-n", NS, "delete", "secret", "dispatcher-postgres", "dispatcher-redis")
    assert get(cluster, "lease", f"{RELEASE}-operator", namespace=NS)["metadata"]["ownerReferences"]
    cluster.run("helm", "-n", NS, "uninstall", RELEASE, "--wait")

    def nothing_left() -> bool:
        left = leftovers(lambda *args: kubectl(cluster, *args), NS)
        assert left == [], "left after helm uninstall"
        return True

    eventually_sync(nothing_left, within=180, interval=2, ignoring=(AssertionError,))


def test_the_kustomize_install_meets_pod_security_restricted(
    cluster: Cluster, backends: Backends
) -> None:
    # deploy/base labels the namespace Pod Security "restricted" (enforced by the API server's
    # admission): the operator's Pod and every Pod it renders must be admitted.
    kubectl(cluster, "apply", "-k", str(ROOT / "deploy" / "base"))
    labels = json.loads(kubectl(cluster, "get", "namespace", NS, "-o", "json"))["metadata"][
        "labels"
    ]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    kubectl(
        cluster, "-n", NS, "rollout", "status", f"deployment/{RELEASE}-operator", "--timeout=180s"
    )
    for secret, url in (("dispatcher-postgres", backends.database_url),
                        ("dispatcher-redis", backends.redis_url)):  # fmt: skip
        kubectl(cluster, "-n", NS, "create", "secret", "generic", secret,
                f"--from-literal=url={backends.for_pods(url)}")  # fmt: skip
    kubectl(cluster, "apply", "-k", str(ROOT / "deploy" / "example"))
    eventually_sync(
        lambda: condition_status(get(cluster, "obd", NAME, namespace=NS), "Ready") == "True",
        within=300,
        interval=2,
        what="the OutboxDispatcher Ready under restricted Pod Security",
    )
    ids = commit(backends.database_url, 100)
    wait_handled(backends.redis_url, ids)
    # As the README's uninstall says: the namespace, the CRD and all in them go.
    kubectl(cluster, "delete", "-k", str(ROOT / "deploy" / "example"), "--wait=true")
    kubectl(cluster, "delete", "-k", str(ROOT / "deploy" / "base"), "--wait=true", "--timeout=300s")
    assert cluster.run_status("kubectl", "get", "namespace", NS) != 0
    assert cluster.run_status("kubectl", "get", "crd", CRD_NAME) != 0
