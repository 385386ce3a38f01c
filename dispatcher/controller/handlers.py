"""The kopf handlers of the operator: thin glue from kopf's life cycle and watches to ``Operator``.

kopf owns the operator's life: its start-up activity logs in (``Operator.start``: the official
client's one login, which kopf's login handler then hands to kopf), serves the probes and
metrics on one port and starts the leader election; its cleanup activity (kopf runs it on
SIGTERM) releases the Lease, closes the operator and stops serving. Only watch-event handlers
and operator-level activities are used. kopf adds a finalizer to a
resource for timers, daemons and change handlers; with none of those, it adds none, and
removes the one an older version of this operator added. ``register`` wires one ``Operator``
into a kopf registry: the ``dispatcher operator`` command and the tests build their own.
Importing this module builds, registers and starts nothing (there is no default operator
behind kopf's default registry)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import kopf
from kubernetes_asyncio.client import Configuration

from dispatcher.controller.lease_election import LeaseConfig, LeaseElector, identity
from dispatcher.controller.loops import Operator, WatchEvent
from dispatcher.controller.resource import API_GROUP, API_VERSION, PLURAL
from dispatcher.observability import ObservabilityServer

__all__ = ["configure", "connection_info", "register"]

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


async def connection_info(configuration: Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials: those the operator's API client logged in with (in a pod its
    ServiceAccount at the ``kubernetes`` Service's address, elsewhere the kubeconfig), read
    anew each time kopf asks (on start and after a 401), so a rotated token is picked up."""
    bearer = await configuration.get_api_key_with_prefix("BearerToken")
    scheme, _, token = (bearer or "").partition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host or "http://localhost",  # the client's own default
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl or None,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        proxy_url=configuration.proxy,
    )


def register(
    registry: kopf.OperatorRegistry,
    operator: Operator,
    *,
    election: LeaseConfig | None = None,
    port: int = 0,
    host: str = "0.0.0.0",
) -> Operator:
    """Add the operator's handlers to ``registry``; return ``operator`` for convenience.

    ``election``: run passes only while holding this Lease (``operator.leadership`` then
    starts not leading). ``port``: from start-up to cleanup, serve ``/healthz``
    (``Operator.live``), ``/readyz`` (``Operator.ready``) and ``/metrics`` (the operator's
    registry) there; 0 serves nothing.
    """
    electing: list[tuple[LeaseElector, asyncio.Task[None]]] = []
    server = ObservabilityServer(
        port=port,
        host=host,
        live=operator.live,
        ready=operator.ready,
        registry=operator.metrics.registry,
    )

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        try:
            await server.start()
        except OSError as exc:  # kopf would retry it every minute; nothing else would change
            raise kopf.PermanentError(f"cannot serve the probes on {host}:{port}: {exc}") from exc
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
        await server.stop()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection_info(operator.connected().configuration)

    @kopf.on.event(*RESOURCE, registry=registry, id="dispatchers")
    async def dispatchers(**kwargs: Any) -> None:
        await operator.dispatcher_seen(WatchEvent.from_kopf(kwargs))

    return operator
