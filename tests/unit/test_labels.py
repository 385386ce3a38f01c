"""The release's labels and a dispatcher's labels never select each other's objects.

The chart's objects carry Helm's labels (``app.kubernetes.io/instance=<release>``,
``managed-by=Helm``, ``helm.sh/chart``); what the operator renders for a dispatcher carries
``dispatch.composer.dev/dispatcher=<name>`` and ``managed-by=outbox-dispatcher-operator``,
and no ``instance``. Rendered here with the release and the dispatcher under one name (the
case that mixed them): apart from the application's own ``name``, ``part-of`` and
``version``, which say what both are part of, no label of one side is on the other, and
no selector either side uses matches the other side's objects or pods.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from dispatcher.controller.identity import DISPATCHER_LABEL, MANAGED_BY, Owner
from dispatcher.controller.model import OutboxDispatcherSpec
from dispatcher.controller.render import (
    build_enqueuer_deployment,
    build_enqueuer_pdb,
    build_migration_job,
    build_worker_deployment,
    build_worker_pdb,
)
from tests.chart import VALUE_SETS, render

NAME = "orders"  # the release and the dispatcher
SHARED = {"app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/version"}


def release_objects() -> list[dict[str, Any]]:
    """What ``helm install orders`` creates, with every value set that adds objects."""
    found = []
    for values in ("with-dispatcher", "monitoring", "multi-namespace", "all-namespaces-ha"):
        found += render(VALUE_SETS[values], name=NAME)
    return found


def dispatcher_objects() -> list[dict[str, Any]]:
    """What the operator creates for the ``OutboxDispatcher`` named ``orders``."""
    (cr,) = (o for o in render(VALUE_SETS["with-dispatcher"], name=NAME)
             if o["kind"] == "OutboxDispatcher")  # fmt: skip
    assert cr["metadata"]["name"] == NAME
    spec = OutboxDispatcherSpec.model_validate(cr["spec"])
    owner = Owner(name=NAME, namespace=cr["metadata"]["namespace"], uid="u-1")
    found = [build_enqueuer_deployment(spec, owner=owner), build_enqueuer_pdb(owner)]
    found.append(build_migration_job(spec, owner=owner))
    for queue in spec.queues:
        found.append(build_worker_deployment(spec, queue, owner=owner, replicas=2))
        found.append(build_worker_pdb(queue, owner=owner) or {})
    return [o for o in found if o]


def labelled(objects: list[dict[str, Any]]) -> Iterator[tuple[str, Mapping[str, str]]]:
    """Each object's labels, and those of the pods its template makes."""
    for obj in objects:
        what = f"{obj['kind']}/{obj['metadata']['name']}"
        yield what, obj["metadata"].get("labels") or {}
        template = (obj.get("spec") or {}).get("template")
        if template is not None:
            yield f"pods of {what}", template["metadata"].get("labels") or {}


def selectors(objects: list[dict[str, Any]]) -> Iterator[tuple[str, Mapping[str, str]]]:
    """The label selectors the objects use; not the PodMonitor's, which is there to select
    the dispatchers' pods (by ``managed-by`` of the operator)."""
    for obj in objects:
        if obj["kind"] == "PodMonitor":
            continue
        spec = obj.get("spec") or {}
        selector = spec.get("selector")
        if isinstance(selector, dict) and "matchLabels" in selector:
            yield f"{obj['kind']}/{obj['metadata']['name']}", selector["matchLabels"]
        elif isinstance(selector, dict) and obj["kind"] == "Service":
            yield f"Service/{obj['metadata']['name']}", selector


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return selector.items() <= labels.items()


def own_pairs(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {
        (key, value)
        for _, labels in labelled(objects)
        for key, value in labels.items()
        if key not in SHARED
    }


def test_the_release_and_a_dispatcher_of_the_same_name_share_no_label_but_the_apps() -> None:
    release, dispatcher = release_objects(), dispatcher_objects()
    assert own_pairs(release) & own_pairs(dispatcher) == set()
    # What a person selects by: the release, or the dispatcher (and who manages it).
    for _, labels in labelled(release):
        assert labels.get("app.kubernetes.io/instance") == NAME
        assert DISPATCHER_LABEL not in labels
    for _, labels in labelled(dispatcher):
        assert labels[DISPATCHER_LABEL] == NAME
        assert labels["app.kubernetes.io/managed-by"] == MANAGED_BY
        assert "app.kubernetes.io/instance" not in labels


def test_no_selector_of_one_side_matches_an_object_or_pod_of_the_other() -> None:
    release, dispatcher = release_objects(), dispatcher_objects()
    by_release = [*selectors(release), ("the release", {"app.kubernetes.io/instance": NAME})]
    by_release.append(("Helm's", {"app.kubernetes.io/managed-by": "Helm"}))
    by_dispatcher = [*selectors(dispatcher), ("the dispatcher", {DISPATCHER_LABEL: NAME})]
    by_dispatcher.append(("the operator's", {"app.kubernetes.io/managed-by": MANAGED_BY}))
    for used, theirs in ((by_release, dispatcher), (by_dispatcher, release)):
        for name, selector in used:
            hits = [what for what, labels in labelled(theirs) if matches(selector, labels)]
            assert hits == [], f"{name} selector {selector} selects {hits}"
    # Each side's selectors do select its own (the check above is not vacuous).
    for used, mine in ((by_release, release), (by_dispatcher, dispatcher)):
        for name, selector in used:
            assert any(matches(selector, labels) for _, labels in labelled(mine)), name
