"""The process kubelet on the local cluster: its Node, a Pod's env, exit codes, deletion.

These run on every machine where the suite runs (root, ``ip``, ``openssl``, the
binaries that ``tools/cluster/build.sh`` builds): the cluster fixture fails
loudly instead of skipping.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dispatcher._testing.cluster import Cluster
from dispatcher._testing.waiting import eventually_sync

pytestmark = pytest.mark.timeout(900)

NS = "kubelet-test"
PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)), flush=True)"


def field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> Iterator[str]:
    cluster.run("kubectl", "create", "namespace", NS)
    # Pods are refused until the service account controller made the namespace's default one.
    eventually_sync(
        lambda: cluster.run_status("kubectl", "-n", NS, "get", "serviceaccount", "default") == 0,
        within=60,
        interval=0.2,
        what="the default ServiceAccount",
    )
    yield NS
    # The cluster lives as long as the session: leave no Pod running in it.
    cluster.run("kubectl", "delete", "namespace", NS, "--wait=true", "--timeout=120s")


def _pod(cluster: Cluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        cluster.run("kubectl", "-n", NS, "get", "pod", name, "-o", "json")
    )
    return found


def _apply(cluster: Cluster, *objects: dict[str, Any]) -> None:
    cluster.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def test_the_node_is_ready(cluster: Cluster) -> None:
    listing = cluster.run("kubectl", "get", "nodes", "--no-headers")
    assert listing.split()[:2] == ["local", "Ready"], listing


def test_a_container_gets_the_env_a_kubelet_gives(cluster: Cluster, namespace: str) -> None:
    data = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": NS},
            "stringData": {"url": "postgresql://u:p@h/db", "TOKEN": "t0k"},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": NS},
            "data": {"level": "DEBUG", "COLOR": "blue"},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "runner", "namespace": NS},
        },
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "env", "namespace": NS},
        "spec": {
            "serviceAccountName": "runner",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "ignored:latest",
                    "command": ["python", "-c", PRINT_ENV],
                    "envFrom": [
                        {"secretRef": {"name": "creds"}},
                        {"configMapRef": {"name": "settings"}, "prefix": "CM_"},
                    ],
                    "env": [
                        {"name": "PLAIN", "value": "v-$(POD_NAME)"},
                        {"name": "POD_NAME", **field("metadata.name")},
                        {"name": "POD_NAMESPACE", **field("metadata.namespace")},
                        {"name": "POD_IP", **field("status.podIP")},
                        {"name": "NODE", **field("spec.nodeName")},
                        {"name": "ACCOUNT", **field("spec.serviceAccountName")},
                        {
                            "name": "DB",
                            "valueFrom": {"secretKeyRef": {"name": "creds", "key": "url"}},
                        },
                        {
                            "name": "LEVEL",
                            "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}},
                        },
                        {"name": "LATE", "value": "$(POD_NAME)"},
                    ],
                }
            ],
        },
    }
    _apply(cluster, *data, pod)
    done = eventually_sync(
        lambda: _pod(cluster, "env")["status"].get("phase") == "Succeeded",
        within=120,
        interval=0.5,
        what="env pod Succeeded",
    )
    assert done
    status = _pod(cluster, "env")["status"]
    env = json.loads(cluster.container_log(NS, "env", "main"))
    assert env["DB"] == "postgresql://u:p@h/db"
    assert env["TOKEN"] == "t0k"  # envFrom a Secret
    assert (env["CM_level"], env["CM_COLOR"]) == ("DEBUG", "blue")  # envFrom with a prefix
    assert env["LEVEL"] == "DEBUG"
    assert (env["POD_NAME"], env["POD_NAMESPACE"]) == ("env", NS)
    assert env["POD_IP"] == status["podIP"]
    assert env["POD_IP"].startswith("10.213.")
    assert (env["NODE"], env["ACCOUNT"]) == ("local", "runner")
    assert env["PLAIN"] == "v-$(POD_NAME)"  # defined later: left as written, as a kubelet does
    assert env["LATE"] == "env"
    # The suite's PYTHONPATH (a checkout before the venv's install) is the Pods' too.
    assert env.get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    # The Pod's ServiceAccount token: the Pod acts as system:serviceaccount:NS:runner.
    review = cluster.run(
        "kubectl", "--kubeconfig", env["KUBECONFIG"], "auth", "whoami", "-o", "json"
    )
    assert (
        json.loads(review)["status"]["userInfo"]["username"] == f"system:serviceaccount:{NS}:runner"
    )


def test_a_pod_that_exits_non_zero_fails_with_its_exit_code(
    cluster: Cluster, namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fails", "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["python", "-c", "print('exiting with 3'); raise SystemExit(3)"],
                }
            ],
        },
    }
    _apply(cluster, pod)
    eventually_sync(
        lambda: _pod(cluster, "fails")["status"].get("phase") == "Failed",
        within=120,
        interval=0.5,
        what="Failed",
    )
    (container,) = _pod(cluster, "fails")["status"]["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 3
    # kubectl logs: the API server asks the kubelet, as it would a real one.
    assert cluster.run("kubectl", "-n", NS, "logs", "fails") == "exiting with 3\n"


def test_readiness_and_graceful_deletion(cluster: Cluster, namespace: str) -> None:
    # Serves /ready on 8080 (the same port every Pod may use: each has its own network
    # namespace), and on SIGTERM writes a mark before it exits.
    server = (
        "import http.server, signal, sys\n"
        "def bye(*_):\n"
        "    print('got SIGTERM', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if self.path == '/ready' else 404); self.end_headers()\n"
        "http.server.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n"
    )
    names = [f"web-{uuid.uuid4().hex[:4]}" for _ in range(2)]
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "terminationGracePeriodSeconds": 20,
                "containers": [
                    {
                        "name": "web",
                        "image": "x",
                        "command": ["python", "-c", server],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {
                            "httpGet": {"path": "/ready", "port": "http"},
                            "periodSeconds": 1,
                        },
                    }
                ],
            },
        }
        for name in names
    ]
    _apply(cluster, *pods)
    for name in names:
        cluster.run(
            "kubectl", "-n", NS, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s"
        )
    cluster.run("kubectl", "-n", NS, "delete", "pod", names[0], "--wait=true", "--timeout=60s")
    assert "got SIGTERM" in cluster.container_log(NS, names[0], "web")
    assert _pod(cluster, names[1])["status"]["phase"] == "Running"


def test_a_failed_liveness_probe_restarts_the_container(cluster: Cluster, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "unlive", "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": [
                        "python",
                        "-c",
                        "import time; print('up', flush=True); time.sleep(600)",
                    ],
                    # Nothing listens on 9 in the Pod's namespace: the probe fails.
                    "livenessProbe": {
                        "tcpSocket": {"port": 9},
                        "periodSeconds": 1,
                        "failureThreshold": 2,
                    },
                }
            ],
        },
    }
    _apply(cluster, pod)

    def restarted() -> bool:
        statuses = _pod(cluster, "unlive")["status"].get("containerStatuses") or []
        return (
            bool(statuses)
            and statuses[0]["restartCount"] >= 1
            and "running" in statuses[0]["state"]
        )

    eventually_sync(restarted, within=120, interval=0.5, what="restarted after its liveness probe")
    assert cluster.container_log(NS, "unlive", "main").count("up") >= 2
    (status,) = _pod(cluster, "unlive")["status"]["containerStatuses"]
    assert status["lastState"]["terminated"]["exitCode"] == 143  # 128 + SIGTERM
    cluster.run("kubectl", "-n", NS, "delete", "pod", "unlive", "--wait=true", "--timeout=60s")
