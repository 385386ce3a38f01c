"""The local Kubernetes cluster (``tools.cluster``): the only place tests start it.

``cluster`` is session-scoped: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the real node (containerd, kubelet, kube-proxy, running the
project's images) start once (the binaries and images come from the caches that
``tools/cluster/build.sh`` and ``tools/images/build.sh`` fill; ``make e2e`` and
``.ci/run`` build them first) and stop when the session ends, leaving nothing on
the machine. Its files stay in the temp directory it names,
for a look at the logs after a failure. ``cluster_postgres`` and
``cluster_redis`` are servers of the suite's kind that also listen on the
bridge's host address, where the Pods reach them. ``crd`` is the CRD of this tree applied
there (server-side) and established.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatcher.controller.crd import CRD_PATH
from dispatcher.controller.model import DEFAULT_VERSION_TAG
from dispatcher.controller.resource import API_GROUP, PLURAL
from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from tests.waiting import eventually_sync
from tools.cluster import HOST_IP, Cluster, start, stop
from tools.cluster.leftovers import inventory


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    state_dir = Path(tempfile.mkdtemp(prefix="od-cluster-"))
    try:
        running = start(state_dir, owner=os.getpid())
    except RuntimeError as exc:
        pytest.fail(f"the local cluster did not start: {exc}")
    print(f"\nlocal cluster: {running.server}, files in {state_dir}")
    try:
        yield running
    finally:
        stop(state_dir)
        shutil.rmtree(state_dir / "etcd", ignore_errors=True)
    # The session leaves the machine as it found it (docs/local-cluster.md lists what a node
    # leaves by default): an error of the last test's teardown otherwise.
    left = inventory(state_dir)
    assert not left, f"the local cluster left on the machine: {left}"


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> str:
    """The ``OutboxDispatcher`` CRD of this tree, served by the cluster; its name.

    Applied for each module that asks (idempotent): an earlier test may have uninstalled it
    as the README says (``test_control_plane`` does), then this waits for that deletion to
    finish before applying it again.
    """
    name = f"{PLURAL}.{API_GROUP}"

    def live() -> dict[str, Any] | None:
        found = cluster.run("kubectl", "get", "crd", name, "-o", "json", "--ignore-not-found")
        return json.loads(found) if found.strip() else None

    def not_terminating() -> bool:
        current = live()
        return current is None or "deletionTimestamp" not in current["metadata"]

    eventually_sync(not_terminating, within=120, interval=0.5, what=f"CRD {name} deleted")
    cluster.run("kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))

    def established() -> bool:
        conditions = ((live() or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    eventually_sync(established, within=60, interval=0.5, what=f"CRD {name} established")
    return name


@pytest.fixture(scope="session")
def cluster_postgres(cluster: Cluster) -> Iterator[PostgresProcess]:
    """A PostgreSQL on loopback and on the bridge, trusting the Pods' addresses."""
    workdir = Path(tempfile.mkdtemp(prefix="od-cluster-pg-"))
    server = PostgresProcess(workdir, f"listen_addresses = '127.0.0.1,{HOST_IP}'")
    server.start()
    try:
        with (server.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {HOST_IP}/16 trust\n")
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute("SELECT pg_reload_conf()")
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster_redis(cluster: Cluster) -> Iterator[RedisProcess]:
    """A Redis (AOF on) on loopback and on the bridge."""
    workdir = Path(tempfile.mkdtemp(prefix="od-cluster-redis-"))
    server = RedisProcess(
        workdir, "--bind", "127.0.0.1", HOST_IP, "--protected-mode", "no", "--appendonly", "yes"
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def handler_image(cluster: Cluster) -> str:
    """The e2e handler image (``tests/e2e/handler_image``), built FROM the worker image as
    docs/kubernetes.md tells users to build theirs, and loaded into the node; its name."""
    name = "localhost/outbox-dispatcher-e2e-handlers:1"
    context = Path(__file__).parent / "e2e" / "handler_image"
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
    subprocess.run(
        ["buildah", "bud", "--quiet", "--layers", "--network", "host",
         "--build-arg", f"WORKER_IMAGE=localhost/outbox-dispatcher-worker:{DEFAULT_VERSION_TAG}",
         "-t", name, str(context)],
        check=True, env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    archive = cluster.state_dir / "e2e-handlers.tar"
    subprocess.run(
        ["buildah", "push", "--quiet", name, f"docker-archive:{archive}:{name}"],
        check=True, env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    cluster.import_image(archive)
    return name
