"""The kopf handlers of the operator: thin glue from kopf's causes to ``Operator``.

``register`` wires one ``Operator`` into a kopf registry, so tests and the
``dispatcher operator`` command build their own; importing this module also
registers a default one, so ``kopf run -m controller.handlers`` works too.
"""

from __future__ import annotations

from typing import Any

import kopf

from controller.model import API_GROUP, API_VERSION, PLURAL
from controller.operator import Operator, OperatorConfig

__all__ = ["OPERATOR", "configure", "login", "register", "register_login"]

RESOURCE = (API_GROUP, API_VERSION, PLURAL)


def configure(settings: kopf.OperatorSettings) -> None:
    """Operator-wide kopf settings: our own annotation prefix, events only when we say so."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.loggers = False


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: its service account; elsewhere: the kubeconfig (kopf's own logins)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def register_login(registry: kopf.OperatorRegistry) -> None:
    """For a registry of our own (the default one has kopf's logins already)."""
    kopf.on.login(registry=registry)(login)


def register(registry: kopf.OperatorRegistry, operator: Operator) -> Operator:
    """Add the operator's handlers to ``registry``; return ``operator`` for convenience."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        operator.settings = settings

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await operator.redis.close()

    @kopf.on.probe(registry=registry, id="crd")
    async def crd(*, logger: Any, **_: Any) -> str:
        return await operator.crd_probe(logger)

    @kopf.on.resume(*RESOURCE, registry=registry, id="reconcile")
    @kopf.on.create(*RESOURCE, registry=registry, id="reconcile")
    @kopf.on.update(*RESOURCE, registry=registry, id="reconcile")
    async def reconcile(
        *,
        body: kopf.Body,
        spec: kopf.Spec,
        status: kopf.Status,
        name: str,
        namespace: str | None,
        uid: str,
        meta: kopf.Meta,
        retry: int,
        patch: kopf.Patch,
        logger: Any,
        **_: Any,
    ) -> None:
        await operator.reconcile(
            body=body,
            spec=spec,
            status=status,
            name=name,
            namespace=namespace or "default",
            uid=uid,
            generation=meta.get("generation"),
            retry=retry,
            patch=patch,
            logger=logger,
        )

    @kopf.on.delete(*RESOURCE, registry=registry, optional=True)
    async def forget(*, name: str, namespace: str | None, **_: Any) -> None:
        await operator.redis.drop((namespace or "default", name))

    @kopf.timer(
        *RESOURCE,
        registry=registry,
        id="autoscale",
        interval=operator.config.autoscale_interval,
        initial_delay=min(operator.config.autoscale_interval, 5.0),
    )
    async def autoscale(
        *,
        body: kopf.Body,
        spec: kopf.Spec,
        status: kopf.Status,
        name: str,
        namespace: str | None,
        uid: str,
        patch: kopf.Patch,
        logger: Any,
        **_: Any,
    ) -> None:
        await operator.autoscale(
            body=body,
            spec=spec,
            status=status,
            name=name,
            namespace=namespace or "default",
            uid=uid,
            patch=patch,
            logger=logger,
        )

    return operator


OPERATOR = register(kopf.get_default_registry(), Operator(OperatorConfig()))
