"""End to end on a kind cluster: images, chart, operator, migration, dispatch, autoscale, shards.

Where ``docker`` (with a running engine), ``kind``, ``helm`` and ``kubectl`` exist, ``make e2e``
(or this module under pytest) creates a kind cluster, builds the three images and loads them
into it, runs PostgreSQL and Redis in the cluster, ``helm install``s the chart with an
``OutboxDispatcher`` using the images just built, waits for the operator's migration Job,
commits 1,000 dispatches through a port-forward to PostgreSQL and checks every one was handled
(each has its worker's done mark in Redis), raises a queue's backlog and sees its workers scale,
changes the shard count, then ``helm uninstall``s and sees nothing of the release left.

Elsewhere the cluster test skips with its reason, and the pure parts still run: the manifests
it would apply (the backing services and the chart with its values) are rendered and validated
here, so the test cannot rot unseen.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dispatcher.controller.model import OutboxDispatcherSpec
from dispatcher.demo.throwaway import free_port
from tests.chart import CHART, CRD, K8S_VERSION, render
from tests.dockerfile import stages
from tests.e2e.cluster_objects import condition_status
from tests.e2e.leftovers import leftovers
from tests.waiting import eventually_sync

ROOT = Path(__file__).resolve().parents[2]
BACKING = Path(__file__).resolve().parent / "manifests" / "backing.yaml"
CLUSTER = os.environ.get("E2E_CLUSTER", "outbox-dispatcher-e2e")
TAG = "e2e"
IMAGES = ("operator", "enqueuer", "worker")
RELEASE, NAMESPACE, DATA = "outbox-dispatcher", "outbox-dispatcher", "e2e-data"
DISPATCHER = "e2e"
TASKS = 1000
TOOLS = ("docker", "kind", "helm", "kubectl")


def image(component: str) -> str:
    return f"outbox-dispatcher-{component}:{TAG}"


def chart_values() -> dict[str, Any]:
    """What the test installs: the chart, an OutboxDispatcher on the e2e images, two queues."""
    return {
        "operator": {
            "image": {"repository": "outbox-dispatcher-operator", "tag": TAG},
            "workloadImages": {"enqueuer": image("enqueuer"), "worker": image("worker")},
            "autoscaleInterval": 5,
            "logLevel": "DEBUG",
        },
        "rbac": {"secretNames": ["dispatcher-postgres", "dispatcher-redis"]},
        "dispatcher": {
            "enabled": True,
            "name": DISPATCHER,
            "spec": {
                "shards": 4,
                "queues": [
                    # A real handler of the stock image: prints the task, then it is acked.
                    {"name": "default", "handler": "builtins:print", "maxReplicas": 3},
                    # A handler that always fails (int(TaskMessage)): entries stay in the stream,
                    # so its backlog holds while the autoscaler adds workers.
                    {
                        "name": "burst",
                        "handler": "builtins:int",
                        "minReplicas": 1,
                        "maxReplicas": 3,
                        "targetBacklogPerReplica": 50,
                        "maxDeliveries": 1000,
                        "reclaimIdleSeconds": 3600,
                    },
                ],
            },
        },
    }


def secrets() -> list[dict[str, Any]]:
    """The Secrets the OutboxDispatcher references, pointing at the in-cluster services."""
    urls = {
        "dispatcher-postgres": f"postgresql://postgres:e2e@postgres.{DATA}.svc:5432/outbox",
        "dispatcher-redis": f"redis://redis.{DATA}.svc:6379/0",
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "type": "Opaque",
            "stringData": {"url": url},
        }
        for name, url in urls.items()
    ]


def backing() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(BACKING.read_text()) if doc]


# -- pure parts: run everywhere ----------------------------------------------------------------


def test_the_manifests_the_e2e_applies_are_valid() -> None:
    for obj in [*backing(), *secrets()]:
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True), obj["metadata"]
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    objects = render(chart_values(), name=RELEASE, namespace=NAMESPACE)
    kinds = sorted(o["kind"] for o in objects)
    assert "OutboxDispatcher" in kinds
    for obj in objects:
        if obj["kind"] == "OutboxDispatcher":
            jsonschema.validate(obj, schema)
            OutboxDispatcherSpec.model_validate(obj["spec"])
        else:
            assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_e2e_deploys_only_the_images_it_builds_and_loads() -> None:
    objects = render(chart_values(), name=RELEASE, namespace=NAMESPACE)
    (cr,) = (o for o in objects if o["kind"] == "OutboxDispatcher")
    (operator,) = (o for o in objects if o["kind"] == "Deployment")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    # The dispatcher's pods (and its migration Job) run the images the operator is given.
    assert "image" not in cr["spec"].get("enqueuer", {})
    assert all("image" not in q for q in cr["spec"]["queues"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    used = {container["image"], env["DISPATCHER_ENQUEUER_IMAGE"], env["DISPATCHER_WORKER_IMAGE"]}
    assert used == {image(c) for c in IMAGES}
    referenced = {ref for s in secrets() for ref in [s["metadata"]["name"]]}
    spec = OutboxDispatcherSpec.model_validate(cr["spec"])
    assert {spec.postgres.secret_ref.name, spec.redis.secret_for("worker").name} <= referenced
    assert set(IMAGES) <= set(stages()), "a component the Dockerfile has no target for"


# -- the cluster run ---------------------------------------------------------------------------


def _missing_tools() -> str | None:
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"kind end-to-end needs {', '.join(TOOLS)}; not found: {', '.join(absent)}"
    engine = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=60)
    if engine.returncode != 0:
        return "kind end-to-end needs a running Docker engine (`docker info` failed)"
    return None


def run(*args: str, stdin: str | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        list(args), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def kubectl(*args: str, stdin: str | None = None) -> str:
    return run("kubectl", "--context", f"kind-{CLUSTER}", *args, stdin=stdin)


def _get(kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
    command = ["kubectl", "--context", f"kind-{CLUSTER}", "-n", namespace, "get", kind, name]
    done = subprocess.run(
        [*command, "-o", "json"], capture_output=True, text=True, check=False, timeout=60
    )
    return json.loads(done.stdout) if done.returncode == 0 else None


@contextlib.contextmanager
def port_forward(namespace: str, service: str, port: int) -> Iterator[int]:
    local = free_port()
    process = subprocess.Popen(
        [
            "kubectl",
            *("--context", f"kind-{CLUSTER}", "-n", namespace, "port-forward"),
            *(f"svc/{service}", f"{local}:{port}"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", local)) == 0

        eventually_sync(listening, within=60, interval=2, what=f"port-forward to {service}")
        yield local
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    reason = _missing_tools()
    if reason is not None:
        pytest.skip(reason)
    run("kind", "create", "cluster", "--name", CLUSTER, "--wait", "120s", timeout=900)
    try:
        for component in IMAGES:
            run(
                "docker",
                "build",
                "--target",
                component,
                "-t",
                image(component),
                str(ROOT),
                timeout=1800,
            )
            run("kind", "load", "docker-image", image(component), "--name", CLUSTER)
        yield CLUSTER
    finally:
        if not os.environ.get("E2E_KEEP_CLUSTER"):
            run("kind", "delete", "cluster", "--name", CLUSTER)


def _install() -> None:
    kubectl("create", "namespace", DATA)
    kubectl("-n", DATA, "apply", "-f", str(BACKING))
    for name in ("postgres", "redis"):
        kubectl("-n", DATA, "rollout", "status", f"deployment/{name}", "--timeout=300s")
    kubectl("create", "namespace", NAMESPACE)
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(secrets()))
    values = yaml.safe_dump(chart_values())
    helm = ("helm", "--kube-context", f"kind-{CLUSTER}")
    run(
        *helm,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--wait",
        "--timeout",
        "5m",
        "--values",
        "-",
        stdin=values,
    )


def _commit(tasks: int, *, queue: str, shards: int) -> list[str]:
    """Commit ``tasks`` dispatches through a port-forward; return their task ids."""
    import psycopg

    from dispatcher import TaskDispatch, enqueue_dispatch

    ids = [f"e2e-{queue}-{uuid.uuid4().hex[:12]}" for _ in range(tasks)]
    with (
        port_forward(DATA, "postgres", 5432) as port,
        psycopg.connect(f"postgresql://postgres:e2e@127.0.0.1:{port}/outbox") as conn,
    ):
        for task_id in ids:
            dispatch = TaskDispatch(
                task_id=task_id,
                run_id="e2e",
                workflow_id="wf",
                workflow_version=1,
                node_id="n",
                node_type="t",
                queue=queue,
            )
            enqueue_dispatch(conn, dispatch, shards=shards)
        conn.commit()
    return ids


@pytest.mark.kind
def test_kind_end_to_end(cluster: str) -> None:
    import redis

    from dispatcher.stream.naming import SHARDS_KEY
    from dispatcher.worker import attempt_key

    _install()
    # The operator migrated first (its Job), then started the enqueuer.
    cr = eventually_sync(
        lambda: condition_status(_get("obd", DISPATCHER) or {}, "Migrated") == "True",
        within=300,
        interval=2,
        what="Migrated",
    )
    assert cr
    eventually_sync(
        lambda: _get("deployment", f"{DISPATCHER}-enqueuer"),
        within=300,
        interval=2,
        what="enqueuer",
    )
    kubectl(
        "-n", NAMESPACE, "rollout", "status", f"deployment/{DISPATCHER}-enqueuer", "--timeout=300s"
    )

    ids = _commit(TASKS, queue="default", shards=4)
    with port_forward(DATA, "redis", 6379) as port:
        client = redis.Redis(port=port, decode_responses=True)

        def handled() -> bool:
            return sum(client.exists(attempt_key(f"e2e:{t}:1")) for t in ids) == TASKS

        eventually_sync(handled, within=600, interval=2, what=f"{TASKS} dispatches handled")

        # Backlog on the failing queue: the autoscaler adds workers (target 50 per replica).
        _commit(400, queue="burst", shards=int(client.get(SHARDS_KEY) or 4))

        def scaled() -> bool:
            found = _get("deployment", f"{DISPATCHER}-worker-burst") or {}
            return int(found.get("spec", {}).get("replicas") or 0) > 1

        eventually_sync(scaled, within=300, interval=2, what="burst workers scaled up")

        # More shards: the operator publishes the new count.
        kubectl(
            "-n",
            NAMESPACE,
            "patch",
            "obd",
            DISPATCHER,
            "--type",
            "merge",
            "-p",
            json.dumps({"spec": {"shards": 8}}),
        )
        eventually_sync(
            lambda: client.get(SHARDS_KEY) == "8", within=300, interval=2, what="shards = 8"
        )
        eventually_sync(
            lambda: ((_get("obd", DISPATCHER) or {}).get("status") or {}).get("shards") == 8,
            within=300,
            interval=2,
            what="status.shards",
        )

    run(
        "helm",
        "--kube-context",
        f"kind-{CLUSTER}",
        "uninstall",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--wait",
    )

    def nothing_left() -> bool:
        # The Secrets are the user's (the test's), not the release's.
        mine = {("Secret", s["metadata"]["name"]) for s in secrets()}
        assert leftovers(kubectl, NAMESPACE, besides=mine) == [], "left after helm uninstall"
        return True

    eventually_sync(nothing_left, within=300, interval=2, ignoring=(AssertionError,))
