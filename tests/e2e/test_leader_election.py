"""Leader election against the real API server: two candidates in this process, short terms.

``LeaseElector`` instances (``dispatcher.controller.lease_election``) with a 4 s Lease run
here against the local cluster's API server (the admin's kubeconfig, or a ServiceAccount's
token under the chart's Lease Role): one of two leads; a released Lease passes to the other; a
leader whose Lease another holder took stops its running pass at once; a leader that can no
longer renew (its RoleBinding removed) steps down before the Lease expires; the Lease is owned
by the operator's Deployment (and labelled as the operator's), none is created without it, and
it goes with it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.controller.api_connection import KubeClient
from dispatcher.controller.leadership import Leadership, NotLeading
from dispatcher.controller.lease_election import LEASE_LABELS, LeaseConfig, LeaseElector
from tests.e2e.cluster_objects import get
from tests.fix_live_operator import LiveNamespace
from tests.waiting import eventually
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

NS = "od-lease"
SHORT = {"duration": 4.0, "renew_every": 0.5, "renew_deadline": 2.5, "retry_every": 0.2}


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> str:
    cluster.run_status("kubectl", "create", "namespace", NS)
    return NS


@dataclass
class Candidate:
    """One elector running in this loop, and its leadership."""

    elector: LeaseElector
    leadership: Leadership
    task: asyncio.Task[None]

    async def stop(self) -> None:
        """As on SIGTERM: stop electing, then release the Lease."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.elector.release()


@asynccontextmanager
async def candidate(name: str, lease: str, *, kubeconfig: Path) -> AsyncIterator[Candidate]:
    leadership = Leadership()
    config = LeaseConfig(name=lease, namespace=NS, identity=name, **SHORT)
    client = await KubeClient.connect(str(kubeconfig))
    elector = LeaseElector(config, client=client, leadership=leadership)
    running = Candidate(elector, leadership, asyncio.create_task(elector.run()))
    try:
        yield running
    finally:
        await running.stop()
        await client.close()


def lease_spec(cluster: Cluster, name: str) -> dict[str, object]:
    spec: dict[str, object] = get(cluster, "lease", name, namespace=NS)["spec"]
    return spec


def leads(*leaderships: Leadership) -> Callable[[], list[int]]:
    def which() -> list[int]:
        return [i for i, found in enumerate(leaderships) if found.leading]

    return which


async def test_one_of_two_leads_and_a_released_lease_passes_to_the_other(
    cluster: Cluster, namespace: str
) -> None:
    async with (
        candidate("a", "pass", kubeconfig=cluster.kubeconfig) as a,
        candidate("b", "pass", kubeconfig=cluster.kubeconfig) as b,
    ):
        both = (a.leadership, b.leadership)
        (first,) = await eventually(leads(*both), within=30, what="a leader")
        await asyncio.sleep(2 * SHORT["duration"])  # two whole terms: the same one leads
        assert leads(*both)() == [first]
        names, candidates = ("a", "b"), (a, b)
        assert lease_spec(cluster, "pass")["holderIdentity"] == names[first]
        await candidates[first].stop()
        await eventually(lambda: leads(*both)() == [1 - first], within=30, what="the other")
        spec = lease_spec(cluster, "pass")
        assert spec["holderIdentity"] == names[1 - first]
        assert spec["leaseTransitions"] == 1


async def test_a_leader_whose_lease_was_taken_stops_its_pass_at_once(
    cluster: Cluster, namespace: str
) -> None:
    async with candidate("a", "taken", kubeconfig=cluster.kubeconfig) as running_a:
        a = running_a.leadership
        await eventually(lambda: a.leading, within=30, what="a leads")
        started = asyncio.Event()

        async def endless_pass() -> None:
            started.set()
            await asyncio.Event().wait()

        running = asyncio.create_task(a.run(endless_pass()))
        await started.wait()
        found = get(cluster, "lease", "taken", namespace=NS)
        found["spec"]["holderIdentity"] = "intruder"
        cluster.run("kubectl", "replace", "-f", "-", stdin=json.dumps(found))
        await eventually(lambda: running.done(), within=30, what="the pass stopped")
        with pytest.raises(NotLeading):
            await running
        assert not a.leading
        assert lease_spec(cluster, "taken")["holderIdentity"] == "intruder"


async def test_a_leader_that_cannot_renew_steps_down_before_its_lease_expires(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Its RoleBinding removed, every renewal is refused (403): it stops at the deadline,
    while the record it wrote last is still valid for any peer."""
    cluster.run("kubectl", "-n", NS, "create", "serviceaccount", "elector")
    rules = ["--verb=get,create,update", "--resource=leases.coordination.k8s.io"]
    cluster.run("kubectl", "-n", NS, "create", "role", "elector", *rules)
    cluster.run("kubectl", "-n", NS, "create", "rolebinding", "elector", "--role=elector",
                f"--serviceaccount={NS}:elector")  # fmt: skip
    token = cluster.run("kubectl", "-n", NS, "create", "token", "elector").strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    admin["users"] = [{"name": "elector", "user": {"token": token}}]
    for context in admin["contexts"]:
        context["context"]["user"] = "elector"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(admin))
    async with candidate("a", "refused", kubeconfig=kubeconfig) as running_a:
        a = running_a.leadership
        await eventually(lambda: a.leading, within=30, what="a leads")
        cluster.run("kubectl", "-n", NS, "delete", "rolebinding", "elector")
        await eventually(lambda: not a.leading, within=30, what="a stepped down")
        renewed = lease_spec(cluster, "refused")
        assert renewed["holderIdentity"] == "a"  # it could not even release it


def lease(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return LiveNamespace(cluster, NS).get("lease", name)


async def test_the_lease_belongs_to_the_operators_deployment_and_goes_with_it(
    cluster: Cluster, namespace: str
) -> None:
    """``helm uninstall`` deletes the operator's Deployment: the garbage collector then deletes
    the Lease it owns, and a replica still stopping creates none."""
    client = await KubeClient.connect(str(cluster.kubeconfig))
    # Terms long enough that the steps below are never late for a renewal.
    long = {"duration": 120.0, "renew_deadline": 100.0}
    electors = [
        LeaseElector(
            LeaseConfig(name=name, namespace=NS, identity="a", owner="od-operator", **long),
            client=client,
            leadership=Leadership(),
        )
        for name in ("owned", "older")
    ]
    try:
        assert not await electors[0].step()  # the Deployment is not there (yet, or any more)
        assert lease(cluster, "owned") is None
        cluster.run("kubectl", "-n", NS, "create", "deployment", "od-operator",
                    "--image=outbox-dispatcher-operator:0", "--replicas=0")  # fmt: skip
        uid = get(cluster, "deployment", "od-operator", namespace=NS)["metadata"]["uid"]
        # A Lease an earlier version created: no owner, no labels.
        older = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": "older", "namespace": NS}, "spec": {}}  # fmt: skip
        cluster.run("kubectl", "create", "-f", "-", stdin=json.dumps(older))
        for elector in electors:
            assert await elector.step()  # created / taken: leading
        for name in ("owned", "older"):
            meta = (lease(cluster, name) or {})["metadata"]
            assert [(r["kind"], r["name"], r["uid"]) for r in meta["ownerReferences"]] == [
                ("Deployment", "od-operator", uid)
            ]
            assert meta["labels"] == LEASE_LABELS
        for elector in electors:
            assert await elector.step()  # renewed: the reference stays
        assert len((lease(cluster, "owned") or {})["metadata"]["ownerReferences"]) == 1
        cluster.run("kubectl", "-n", NS, "delete", "deployment", "od-operator")
        await eventually(
            lambda: lease(cluster, "owned") is None and lease(cluster, "older") is None,
            within=60,
            what="the Leases collected with their owner",
        )
    finally:
        await client.close()
