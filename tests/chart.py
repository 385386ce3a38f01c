"""The Helm chart rendered offline by Helm's own SDK (``helm-python-sdk``, no binary), and
the value sets the tests render it with (``tests.unit.test_deploy_chart``, ``test_labels``,
``test_deploy_skaffold``, ``tests.integration.test_deploy_kustomize``, ``tests.e2e.test_kind``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

__all__ = ["CHART", "CRD", "K8S_VERSION", "NAMESPACE", "RELEASE", "ROOT", "VALUE_SETS", "render"]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "outbox-dispatcher"
CRD = ROOT / "crds" / "outboxdispatchers.yaml"
K8S_VERSION = "1.37.0"
RELEASE, NAMESPACE = "outbox-dispatcher", "outbox-dispatcher"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "with-dispatcher": {
        "dispatcher": {
            "enabled": True,
            "name": "orders",
            "spec": {
                "shards": 8,
                "queues": [
                    {"name": "emails", "handler": "myapp.tasks:send_email", "maxReplicas": 20},
                    {"name": "pdf", "handler": "b.h:render", "image": "reg.example.com/pdf:3"},
                ],
                "logFormat": "text",
            },
        }
    },
    "multi-namespace": {
        "fullnameOverride": "obd",
        "podSecurityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
        "namespace": {"create": True},
        "operator": {
            "image": {"repository": "reg.example.com/op", "digest": "sha256:" + "ab" * 32},
            "imagePullSecrets": ["regcred"],
            "watchNamespaces": ["team-a", "team-b"],
            "autoscaleInterval": 7.5,
            "logLevel": "DEBUG",
            "podAnnotations": {"example.com/scrape": "false"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "ops", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
            "workloadImages": {
                "enqueuer": "reg.example.com/enq:1.2",
                "worker": "reg.example.com/w:1.2",
            },
        },
        "serviceAccount": {"annotations": {"example.com/role": "dispatcher"}},
        "rbac": {"secretNames": ["dispatcher-postgres", "dispatcher-redis"]},
    },
    "monitoring": {
        "operator": {"watchNamespaces": ["team-a", "team-b"]},
        "monitoring": {
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
            "podMonitor": {"enabled": True, "labels": {"release": "prom"}},
        },
    },
    "per-role-credentials": {
        "dispatcher": {
            "enabled": True,
            "spec": {
                "migrate": False,
                "postgres": {
                    "secretRef": {"name": "pg-enqueuer", "key": "url"},
                    "migrationSecretRef": {"name": "pg-owner", "key": "url"},
                },
                "redis": {
                    "secretRef": None,
                    "enqueuerSecretRef": {"name": "redis-enqueuer", "key": "url"},
                    "workerSecretRef": {"name": "redis-worker", "key": "url"},
                    "operatorSecretRef": {"name": "redis-operator", "key": "url"},
                },
                "enqueuer": {
                    "nodeSelector": {"pool": "system"},
                    "tolerations": [{"key": "pool", "operator": "Exists"}],
                },
                "queues": [
                    {
                        "name": "emails",
                        "handler": "myapp.tasks:send_email",
                        "serviceAccountName": "emails",
                        "envFrom": [{"secretRef": {"name": "smtp"}}],
                    }
                ],
            },
        }
    },
    # The web console beside the release's OutboxDispatcher, actions allowed by a token.
    "console": {
        "dispatcher": {"enabled": True, "name": "orders"},
        "console": {
            "enabled": True,
            "token": {"secretRef": {"name": "console-token", "key": "token"}},
            "redis": {"secretRef": {"name": "redis-console", "key": "url"}, "cluster": True},
        },
    },
    # Two operator replicas (one acts, elected on a Lease) over every namespace.
    "all-namespaces-ha": {"operator": {"watchAllNamespaces": True, "replicas": 2}},
    "single-unelected": {"operator": {"leaderElection": False}},
    # The chart as a subchart: Helm passes the parent's `global` down.
    "subchart": {"global": {"imageRegistry": "reg.example.com", "storageClass": "fast"}},
    # A numeric-looking tag (a build number, a short commit hash of digits) from --set.
    "numeric-tag": helm.parse_set_string("operator.image.tag=1234567"),
    # What `skaffold dev -p kind` passes (skaffold.yaml: setValueTemplates + the kind patch).
    "skaffold-kind": helm.parse_set_string(
        "operator.image.repository=outbox-dispatcher-operator,operator.image.tag=abc1234,"
        "operator.workloadImages.enqueuer=outbox-dispatcher-enqueuer:abc1234,"
        "operator.workloadImages.worker=outbox-dispatcher-worker:abc1234,"
        "operator.logLevel=DEBUG,dispatcher.enabled=true,"
        "dispatcher.spec.queues[0].name=default,dispatcher.spec.queues[0].handler=builtins:print"
    ),
}


def render(
    values: dict[str, Any], *, name: str = RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """Every object the chart renders (templates only; Helm applies crds/ on its own)."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(copy.deepcopy(values), name=name, namespace=namespace)
    return [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
