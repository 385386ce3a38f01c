"""What a dispatcher owns is labelled as its own, and ``kubectl get obd`` shows all of it.

On the real API server (``tests.fix_live_operator``: the operator in the test's loop, a
namespace per test). Up to #41 the operator labelled a dispatcher's objects
``app.kubernetes.io/instance=<dispatcher>``, the Helm release's key; now
``dispatch.composer.dev/dispatcher``. A Deployment's selector is immutable (the API server
refuses a change, as checked here), so an upgraded operator deletes a Deployment with the
old selector and creates it again, and a budget too (an apply would keep keys another field
manager owns). And the printer
columns read status fields the operator writes: every queue, ready workers, the backlog.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dispatcher.controller.identity import DISPATCHER_LABEL, Owner
from dispatcher.controller.model import OutboxDispatcherSpec
from dispatcher.controller.render import build_worker_deployment, build_worker_pdb
from tests.e2e.live_dispatcher import NAME, get, idle, until
from tests.fix_live_operator import LiveNamespace, running_live_operator

pytestmark = pytest.mark.timeout(300)

INSTANCE = "app.kubernetes.io/instance"
OLD_SELECTOR = {
    "app.kubernetes.io/name": "outbox-dispatcher",
    INSTANCE: NAME,
    "app.kubernetes.io/component": "worker",
    "dispatch.composer.dev/queue": "emails",
}


def labelled_the_old_way(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the operator rendered before #41: ``instance`` where ``dispatcher`` is now."""
    labels = {**OLD_SELECTOR, "app.kubernetes.io/part-of": "outbox-dispatcher",
              "app.kubernetes.io/managed-by": "outbox-dispatcher-operator"}  # fmt: skip
    manifest["metadata"]["labels"] = labels
    manifest["spec"]["selector"] = {"matchLabels": OLD_SELECTOR}
    if "template" in manifest["spec"]:
        manifest["spec"]["template"]["metadata"]["labels"] = labels
    return manifest


def relabelled(found: dict[str, Any] | None) -> bool:
    meta, spec = (found or {}).get("metadata") or {}, (found or {}).get("spec") or {}
    labels = meta.get("labels") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    return (
        labels.get(DISPATCHER_LABEL) == NAME
        and selector.get(DISPATCHER_LABEL) == NAME
        and INSTANCE not in labels
        and INSTANCE not in selector
    )


async def test_a_deployment_with_the_old_selector_is_created_again_with_the_new_one(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    cr = idle(live)
    await asyncio.to_thread(live.apply, cr)
    created = await get(live, "obd", NAME)
    assert created is not None
    owner = Owner(name=NAME, namespace=live.name, uid=created["metadata"]["uid"])
    spec = OutboxDispatcherSpec.model_validate(cr["spec"])
    emails = spec.queues[0]
    old = labelled_the_old_way(build_worker_deployment(spec, emails, owner=owner, replicas=0))
    budget = build_worker_pdb(emails, owner=owner)
    assert budget is not None
    # Applied as the earlier operator applied them: server-side, under its field manager.
    for manifest in (old, labelled_the_old_way(budget)):
        await asyncio.to_thread(
            live.kubectl, "apply", "--server-side", "--field-manager=outbox-dispatcher-operator",
            "-f", "-", stdin=json.dumps(manifest),
        )  # fmt: skip
    before = await get(live, "deployment", "orders-worker-emails")
    assert before is not None
    # What the operator must cope with: the API server refuses a changed selector.
    moved = json.dumps({"spec": {"selector": {"matchLabels": {DISPATCHER_LABEL: NAME}}}})
    with pytest.raises(RuntimeError, match="immutable"):
        await asyncio.to_thread(
            live.kubectl, "patch", "deployment", "orders-worker-emails", "-p", moved
        )

    async with running_live_operator(live):

        async def replaced() -> dict[str, Any] | None:
            found = await get(live, "deployment", "orders-worker-emails")
            return found if relabelled(found) else None

        after = await until(replaced)
        await until(lambda: _relabelled(live, "pdb", "orders-worker-emails"))
    assert after["metadata"]["uid"] != before["metadata"]["uid"]  # deleted, created again
    template = after["spec"]["template"]["metadata"]["labels"]
    assert after["spec"]["selector"]["matchLabels"].items() <= template.items()


async def _relabelled(live: LiveNamespace, kind: str, name: str) -> bool:
    return relabelled(await get(live, kind, name))


async def test_kubectl_get_shows_every_queue_ready_workers_and_the_backlog(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    await asyncio.to_thread(live.apply, idle(live))  # queues emails and invoices, no pods
    async with running_live_operator(live):

        async def printed() -> str | None:
            table = await asyncio.to_thread(live.kubectl, "get", "obd", NAME, "--no-headers")
            return table if "emails,invoices" in table else None

        table = await until(printed)
        wide = await asyncio.to_thread(live.kubectl, "get", "obd", NAME, "-o", "wide")
    header = wide.splitlines()[0].split()
    assert header == [
        "NAME", "SHARDS", "QUEUES", "WORKERS", "BACKLOG", "READY",
        "ENQUEUERS", "PENDING", "REASON", "AGE",
    ]  # fmt: skip
    row = dict(zip(header, wide.splitlines()[1].split(), strict=True))
    assert (row["QUEUES"], row["WORKERS"], row["BACKLOG"]) == ("emails,invoices", "0/0", "0")
    assert (row["ENQUEUERS"], row["PENDING"]) == ("0/0", "0")
    assert table.split()[:5] == [NAME, "2", "emails,invoices", "0/0", "0"]
