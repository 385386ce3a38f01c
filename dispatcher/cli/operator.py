"""``dispatcher operator``: run the kopf operator for ``OutboxDispatcher`` resources.

The operator's kopf handlers (``dispatcher.controller.handlers``) in a registry of their own,
with the scope (``--namespace`` or ``--all-namespaces``) and the autoscaler interval as flags.
Leader election on a Lease is on unless ``--no-leader-election``
(``dispatcher.controller.lease_election``): several replicas may run, one acts. kopf runs it
all: start-up, SIGTERM/SIGINT (the Lease is released then), and, from start-up to shutdown,
one port (``--metrics-port``, env ``METRICS_PORT``) with ``/healthz`` (``Operator.live``: the
CRD is served and was at start), ``/readyz`` (``Operator.ready``) and ``/metrics``.

The command layer of ``dispatcher.controller.loops``: this module parses flags and starts
kopf; that one is the operator's loop.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from dispatcher.cli.flags import add_options
from dispatcher.cli.main import Common, UsageError
from dispatcher.config import METRICS_PORT, Settings
from dispatcher.controller.leadership import Leadership
from dispatcher.controller.lease_election import LeaseConfig, identity
from dispatcher.controller.operator_config import OperatorConfig
from dispatcher.options import options

__all__ = ["register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "operator",
        help="run the Kubernetes operator for OutboxDispatcher resources",
        description="Reconcile OutboxDispatcher resources (dispatch.composer.dev/v1alpha1): the "
        "enqueuer Deployment, one worker Deployment per queue autoscaled on stream backlog, and "
        "the shard count in Redis. Runs until SIGTERM/SIGINT.",
    )
    g = p.add_argument_group("operator")
    scope = g.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; globs such as 'team-*' work)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    g.add_argument("--liveness", default=None, help=argparse.SUPPRESS)  # gone: a clear error
    add_options(g, [*options(OperatorConfig).values(), METRICS_PORT])
    g.add_argument(
        "--enqueuer-image",
        default=None,
        help="image of enqueuers whose OutboxDispatcher names none (env "
        "DISPATCHER_ENQUEUER_IMAGE, default: outbox-dispatcher-enqueuer at this version)",
    )
    g.add_argument(
        "--worker-image",
        default=None,
        help="image of workers whose queue names none (env DISPATCHER_WORKER_IMAGE, default: "
        "outbox-dispatcher-worker at this version)",
    )
    g.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run reconcile passes only while holding a coordination.k8s.io Lease, so several "
        "replicas may run and one acts (default: on)",
    )
    g.add_argument(
        "--lease-name",
        default="outbox-dispatcher-operator",
        help="name of the Lease (default: %(default)s)",
    )
    g.add_argument(
        "--lease-namespace",
        default=None,
        help="namespace of the Lease (default: env POD_NAMESPACE, else the one --namespace)",
    )
    g.add_argument(
        "--lease-owner",
        default=None,
        metavar="DEPLOYMENT",
        help="the operator's Deployment, in the Lease's namespace: the Lease's owner, so it is "
        "deleted with it; no Lease is created while it does not exist (default: none)",
    )
    common(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace, settings: Settings) -> Any:
    if args.liveness is not None:
        raise UsageError(
            "--liveness is gone: /healthz is served with /readyz and /metrics on --metrics-port "
            "(env METRICS_PORT); point the liveness probe there"
        )
    if not args.namespaces and not args.all_namespaces:
        raise UsageError("pass --namespace NS (repeatable) or --all-namespaces")
    election = lease_config(args)
    return _serve(args, settings, election)


def lease_config(args: argparse.Namespace) -> LeaseConfig | None:
    """The Lease to hold (None: ``--no-leader-election``), or a usage error naming the flag."""
    if not args.leader_election:
        return None
    namespaces = [ns for ns in args.namespaces or () if not any(c in ns for c in "*?[!")]
    namespace = (
        args.lease_namespace
        or os.environ.get("POD_NAMESPACE")
        or (namespaces[0] if len(namespaces) == 1 and not args.all_namespaces else None)
    )
    if not namespace:
        raise UsageError("pass --lease-namespace NS (or --no-leader-election)")
    return LeaseConfig(
        name=args.lease_name, namespace=namespace, identity=identity(), owner=args.lease_owner
    )


def operator_settings(namespaces: Sequence[str], *, all_namespaces: bool) -> Any:
    """kopf settings for this scope: exact namespace names, or all of them, need no discovery.

    With scanning off, kopf neither lists namespaces nor watches CRDs, so the
    operator's Role (or ClusterRole, for all namespaces) is all it needs.
    """
    import kopf

    settings = kopf.OperatorSettings()
    globs = not all_namespaces and any(ch in ns for ns in namespaces for ch in "*?[!")
    settings.scanning.disabled = not globs
    return settings


async def _serve(args: argparse.Namespace, settings: Settings, election: LeaseConfig | None) -> int:
    import kopf
    from prometheus_client import REGISTRY

    from dispatcher.controller.handlers import register as register_handlers
    from dispatcher.controller.loops import Operator

    registry = kopf.OperatorRegistry()
    config = OperatorConfig(
        autoscale_interval=args.autoscale_interval,
        enqueuer_image=args.enqueuer_image,
        worker_image=args.worker_image,
    )
    leadership = Leadership() if election is not None else Leadership.always()
    operator = Operator(config, registry=REGISTRY, leadership=leadership)
    register_handlers(registry, operator, election=election, port=settings.metrics_port)
    await kopf.operator(
        registry=registry,
        ready_flag=operator.started,
        settings=operator_settings(args.namespaces or (), all_namespaces=args.all_namespaces),
        clusterwide=bool(args.all_namespaces),
        namespaces=args.namespaces or (),
        standalone=True,  # kopf's peering pauses nothing here: the Lease decides who acts
    )
    return 0
