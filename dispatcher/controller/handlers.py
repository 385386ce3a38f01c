"""The kopf handlers of the operator: thin glue from kopf's watches to ``Operator``.

Only watch-event handlers and operator-level activities are used. kopf adds a finalizer to a
resource for timers, daemons and change handlers; with none of those, it adds none, and
removes the one an older version of this operator added. ``register`` wires one ``Operator``
into a kopf registry: the ``dispatcher operator`` command and the tests build their own.
Importing this module builds, registers and starts nothing (there is no default operator
behind kopf's default registry). With a ``LeaseConfig``, the startup activity starts the
leader election (``dispatcher.controller.lease_election``) and the cleanup one (kopf runs it
on SIGTERM) releases the Lease."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import kopf

from dispatcher.controller.lease_election import LeaseConfig, LeaseElector, identity
from dispatcher.controller.loops import Operator, WatchEvent
from dispatcher.controller.resource import API_GROUP, API_VERSION, PLURAL

__all__ = ["configure", "login", "register", "register_login"]

RESOURCE = (API_GROUP, API_VERSION, PLURAL)


def configure(settings: kopf.OperatorSettings) -> None:
    """Operator-wide kopf settings: our own annotation prefix, events only when we say so,
    and the pod's name (``POD_NAME``, from the downward API) as the Events' reporting
    instance, so a Warning says which replica posted it."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.loggers = False
    settings.posting.reporting_instance = identity()


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    """The API server as a Pod finds it: the ``kubernetes`` Service's address from the
    environment the kubelet sets, as client-go's in-cluster config reads it (no cluster DNS
    needed), or None outside a Pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: its service account, at the ``kubernetes`` Service's address (kopf's own
    login names ``kubernetes.default.svc``, which needs a cluster DNS); elsewhere: the
    kubeconfig (kopf's own logins)."""
    account = kopf.login_with_service_account(**kwargs)
    if account is None:
        return kopf.login_with_kubeconfig(**kwargs)
    server = in_cluster_server(os.environ)
    return account if server is None else dataclasses.replace(account, server=server)


def register_login(registry: kopf.OperatorRegistry) -> None:
    """For a registry of our own (the default one has kopf's logins already)."""
    kopf.on.login(registry=registry)(login)


def register(
    registry: kopf.OperatorRegistry, operator: Operator, *, election: LeaseConfig | None = None
) -> Operator:
    """Add the operator's handlers to ``registry``; return ``operator`` for convenience.

    ``election``: run passes only while holding this Lease (``operator.leadership`` then
    starts not leading).
    """
    electing: list[tuple[LeaseElector, asyncio.Task[None]]] = []

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        await operator.start()
        operator.starting()
        if election is not None:
            client = operator.connected()
            elector = LeaseElector(election, client=client, leadership=operator.leadership)
            electing.append((elector, asyncio.create_task(elector.run(), name="lease")))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for elector, task in electing:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await elector.release()
        await operator.close()

    @kopf.on.probe(registry=registry, id="crd")
    async def crd(*, logger: Any, **_: Any) -> str:
        return await operator.crd_probe(logger)

    @kopf.on.event(*RESOURCE, registry=registry, id="dispatchers")
    async def dispatchers(**kwargs: Any) -> None:
        await operator.dispatcher_seen(WatchEvent.from_kopf(kwargs))

    return operator
