"""Rendering of the enqueuer and worker Deployments: pure builders, valid manifests."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from dispatcher.controller.identity import DISPATCHER_LABEL, Owner, migration_job_name, worker_name
from dispatcher.controller.model import OutboxDispatcherSpec
from dispatcher.controller.pods import (
    CONFIG_HASH_ANNOTATION,
    SECRETS_HASH_ANNOTATION,
    WorkloadDefaults,
)
from dispatcher.controller.render import (
    build_enqueuer_deployment,
    build_enqueuer_pdb,
    build_migration_job,
    build_worker_deployment,
    build_worker_pdb,
)

K8S_VERSION = "1.37.0"
OWNER = Owner(name="orders", namespace="shop", uid="0b4c5a3e-1111-2222-3333-444455556666")


def _spec(**overrides: Any) -> OutboxDispatcherSpec:
    raw: dict[str, Any] = {
        "shards": 8,
        "postgres": {"secretRef": {"name": "pg", "key": "dsn"}},
        "redis": {"secretRef": {"name": "rd", "key": "url"}, "cluster": True},
        "enqueuer": {"replicas": 2, "batchSize": 100, "resources": {"limits": {"cpu": 1}}},
        "queues": [
            {"name": "emails", "handler": "app.tasks:send", "concurrency": 16},
            {"name": "Invoices_v2", "handler": "billing:render", "minReplicas": 0},
        ],
    }
    raw.update(overrides)
    return OutboxDispatcherSpec.model_validate(raw)


def _container(manifest: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = manifest["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(manifest: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(manifest)["env"]}


def _all_manifests(spec: OutboxDispatcherSpec) -> list[dict[str, Any]]:
    return [
        build_enqueuer_deployment(spec, owner=OWNER),
        *(build_worker_deployment(spec, q, owner=OWNER, replicas=1) for q in spec.queues),
    ]


def test_enqueuer_runs_dispatcher_enqueuer_with_the_spec_flags() -> None:
    manifest = build_enqueuer_deployment(_spec(), owner=OWNER)
    container = _container(manifest)
    assert container["command"] == ["dispatcher"]
    assert container["args"] == [
        "enqueuer",
        "--batch-size=100",
        "--concurrency=4",
        "--poll-interval=1",
        "--wait-replicas=0",
    ]
    assert manifest["metadata"]["name"] == "orders-enqueuer"
    assert manifest["spec"]["replicas"] == 2
    assert container["resources"] == {"limits": {"cpu": 1}}


def test_worker_runs_dispatcher_worker_for_its_queue() -> None:
    spec = _spec()
    manifest = build_worker_deployment(spec, spec.queues[0], owner=OWNER, replicas=3)
    assert _container(manifest)["args"] == [
        "worker",
        *("--queue=emails", "--handler=app.tasks:send", "--concurrency=16", "--max-runs=5"),
        *("--reclaim-idle=30", "--handler-timeout=0", "--lease-ttl=30", "--grace-period=30"),
    ]
    assert manifest["spec"]["replicas"] == 3
    assert manifest["metadata"]["name"] == "orders-worker-emails"


def test_urls_come_from_the_referenced_secrets_never_inline() -> None:
    spec = _spec()
    enqueuer, worker, _ = _all_manifests(spec)
    assert _env(enqueuer)["DATABASE_URL"] == {"secretKeyRef": {"name": "pg", "key": "dsn"}}
    for manifest in (enqueuer, worker):
        env = _env(manifest)
        assert env["REDIS_URL"] == {"secretKeyRef": {"name": "rd", "key": "url"}}
        assert env["REDIS_CLUSTER"] == "1"
        assert "STREAM_SHARDS" not in env  # read live from composer:stream_shards
        assert env["METRICS_PORT"] == "9090"
        assert env["LOG_FORMAT"] == "json"
    assert "DATABASE_URL" not in _env(worker)  # workers only need Redis


@pytest.mark.parametrize(("require", "value"), [(False, "0"), (True, "1")])
def test_require_aof_reaches_the_enqueuer_and_the_workers(require: bool, value: str) -> None:
    redis = {"secretRef": {"name": "rd", "key": "url"}, "requireAof": require}
    for manifest in _all_manifests(_spec(redis=redis)):
        assert _env(manifest)["REQUIRE_AOF"] == value


def test_require_aof_is_off_unless_the_spec_says_so() -> None:
    assert _env(build_enqueuer_deployment(_spec(), owner=OWNER))["REQUIRE_AOF"] == "0"


def test_labels_selector_and_owner_reference() -> None:
    for manifest in _all_manifests(_spec()):
        meta = manifest["metadata"]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "outbox-dispatcher"
        assert labels["dispatch.composer.dev/dispatcher"] == "orders"
        assert "app.kubernetes.io/instance" not in labels  # the Helm release's key
        assert labels["app.kubernetes.io/managed-by"] == "outbox-dispatcher-operator"
        selector = manifest["spec"]["selector"]["matchLabels"]
        assert selector.items() <= manifest["spec"]["template"]["metadata"]["labels"].items()
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "dispatch.composer.dev/v1alpha1",
                "kind": "OutboxDispatcher",
                "name": "orders",
                "uid": OWNER.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["namespace"] == "shop"


def test_pods_meet_pod_security_restricted() -> None:
    for manifest in _all_manifests(_spec()):
        pod = manifest["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(pod["securityContext"])
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = _container(manifest)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in _container(manifest)["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]


def test_probes_hit_healthz_on_the_metrics_port() -> None:
    for manifest in _all_manifests(_spec()):
        container = _container(manifest)
        assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def _hash(manifest: dict[str, Any]) -> str:
    value: str = manifest["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    return value


def test_config_hash_is_stable_and_follows_the_config() -> None:
    spec = _spec()
    one = build_worker_deployment(spec, spec.queues[0], owner=OWNER, replicas=1)
    again = build_worker_deployment(spec, spec.queues[0], owner=OWNER, replicas=5)
    assert _hash(one) == _hash(again)  # replicas are not configuration
    resharded = _spec(shards=16)
    more_shards = build_worker_deployment(resharded, resharded.queues[0], owner=OWNER, replicas=1)
    assert more_shards["spec"]["template"] == one["spec"]["template"]  # read live: no restart
    changed = _spec(queues=[{"name": "emails", "handler": "app.tasks:send2"}])
    other = build_worker_deployment(changed, changed.queues[0], owner=OWNER, replicas=1)
    assert _hash(other) != _hash(one)


def test_names_are_dns_labels_and_distinct() -> None:
    assert worker_name(OWNER, "emails") == "orders-worker-emails"
    a, b = worker_name(OWNER, "Invoices_v2"), worker_name(OWNER, "invoices-v2")
    assert a != b
    assert a.startswith("orders-worker-invoices-v2-")
    long = worker_name(Owner(name="x" * 50, namespace="n", uid="u"), "q" * 63)
    assert len(long) <= 63
    assert long.replace("-", "").isalnum()
    assert long.islower()


@pytest.mark.parametrize("shards", [1, 8])
def test_every_rendered_manifest_passes_kubernetes_validate_strict(shards: int) -> None:
    for manifest in _all_manifests(_spec(shards=shards)):
        assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_builders_do_not_share_mutable_state() -> None:
    spec = _spec()
    first = build_enqueuer_deployment(spec, owner=OWNER)
    first["spec"]["template"]["spec"]["containers"][0]["env"].clear()
    assert _env(build_enqueuer_deployment(spec, owner=OWNER))


def test_images_default_to_the_operators_and_a_spec_image_wins() -> None:
    defaults = WorkloadDefaults(enqueuer_image="reg/enq:2", worker_image="reg/w:2")
    spec = _spec(
        queues=[{"name": "a", "handler": "m:f"}, {"name": "b", "handler": "m:f", "image": "mine:1"}]
    )
    enqueuer = build_enqueuer_deployment(spec, owner=OWNER, defaults=defaults)
    assert _container(enqueuer)["image"] == "reg/enq:2"
    images = [
        _container(build_worker_deployment(spec, q, owner=OWNER, replicas=1, defaults=defaults))[
            "image"
        ]
        for q in spec.queues
    ]
    assert images == ["reg/w:2", "mine:1"]


def test_fixed_ids_only_when_the_operator_is_given_them() -> None:
    defaults = WorkloadDefaults(
        enqueuer_image="e", worker_image="w", run_as_user=1000, run_as_group=1000, fs_group=2000
    )
    manifest = build_enqueuer_deployment(_spec(), owner=OWNER, defaults=defaults)
    pod = manifest["spec"]["template"]["spec"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["fsGroup"]) == (1000, 2000)
    assert _container(manifest)["securityContext"]["runAsGroup"] == 1000
    assert "fsGroup" not in _container(manifest)["securityContext"]
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_secrets_hash_is_an_annotation_and_none_means_replicas_are_left_alone() -> None:
    spec = _spec()
    worker = build_worker_deployment(
        spec, spec.queues[0], owner=OWNER, replicas=None, secrets_hash="abc123"
    )
    assert worker["spec"]["template"]["metadata"]["annotations"][SECRETS_HASH_ANNOTATION] == (
        "abc123"
    )
    assert "replicas" not in worker["spec"]
    assert kubernetes_validate.validate(worker, K8S_VERSION, strict=True)


POD_SETTINGS: dict[str, Any] = {
    "env": [
        {"name": "APP_MODE", "value": "prod"},
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
    ],
    "envFrom": [{"configMapRef": {"name": "handler-config"}}],
    "volumes": [
        {"name": "certs", "secret": {"secretName": "pg-ca", "defaultMode": 288}},
        {"name": "cfg", "configMap": {"name": "handler-config"}},
    ],
    "volumeMounts": [
        {"name": "certs", "mountPath": "/etc/pg-ca", "readOnly": True},
        {"name": "cfg", "mountPath": "/etc/handler"},
    ],
    "serviceAccountName": "orders-handlers",
    "imagePullSecrets": [{"name": "regcred"}],
    "nodeSelector": {"kubernetes.io/os": "linux", "pool": "workers"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "q", "effect": "NoSchedule"}
    ],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {DISPATCHER_LABEL: "orders"}},
                    },
                }
            ]
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {DISPATCHER_LABEL: "orders"}},
        }
    ],
    "priorityClassName": "dispatch-high",
    "podAnnotations": {"example.com/team": "billing"},
    "podLabels": {"team": "billing"},
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
}


def _full_spec() -> OutboxDispatcherSpec:
    return _spec(
        enqueuer={"replicas": 2, **POD_SETTINGS},
        queues=[{"name": "emails", "handler": "app.tasks:send", "maxReplicas": 4, **POD_SETTINGS}],
        postgres={
            "secretRef": {"name": "pg", "key": "dsn"},
            "migrationSecretRef": {"name": "pg-owner", "key": "dsn"},
        },
    )


def _pod(manifest: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return pod


def _full_manifests() -> list[dict[str, Any]]:
    spec = _full_spec()
    pdb = build_worker_pdb(spec.queues[0], owner=OWNER)
    assert pdb is not None
    return [
        build_enqueuer_deployment(spec, owner=OWNER),
        build_worker_deployment(spec, spec.queues[0], owner=OWNER, replicas=2),
        build_migration_job(spec, owner=OWNER),
        build_enqueuer_pdb(OWNER),
        pdb,
    ]


def test_every_pod_setting_reaches_the_enqueuer_worker_and_migration_pods() -> None:
    for manifest in _full_manifests():
        if manifest["kind"] == "PodDisruptionBudget":
            continue
        pod, container = _pod(manifest), _container(manifest)
        env = {e["name"]: e for e in container["env"]}
        assert env["APP_MODE"] == {"name": "APP_MODE", "value": "prod"}
        assert env["API_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "api", "key": "token"}}
        assert container["envFrom"] == POD_SETTINGS["envFrom"]
        assert container["volumeMounts"] == [
            {"name": "tmp", "mountPath": "/tmp"},
            *POD_SETTINGS["volumeMounts"],
        ]
        assert pod["volumes"] == [
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            *POD_SETTINGS["volumes"],
        ]
        assert pod["serviceAccountName"] == "orders-handlers"
        assert pod["automountServiceAccountToken"] is False
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["nodeSelector"] == POD_SETTINGS["nodeSelector"]
        assert pod["tolerations"] == POD_SETTINGS["tolerations"]
        assert pod["affinity"] == POD_SETTINGS["affinity"]
        assert pod["topologySpreadConstraints"] == POD_SETTINGS["topologySpreadConstraints"]
        assert pod["priorityClassName"] == "dispatch-high"
        assert container["resources"] == POD_SETTINGS["resources"]
        meta = manifest["spec"]["template"]["metadata"]
        assert meta["annotations"]["example.com/team"] == "billing"
        assert CONFIG_HASH_ANNOTATION in meta["annotations"]
        assert meta["labels"]["team"] == "billing"
        assert meta["labels"]["dispatch.composer.dev/dispatcher"] == "orders"


def test_new_manifests_pass_kubernetes_validate_strict() -> None:
    for manifest in _full_manifests():
        assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True), manifest["kind"]


def test_pods_get_default_requests_so_they_are_not_best_effort() -> None:
    spec = _spec(enqueuer={}, queues=[{"name": "emails", "handler": "app.tasks:send"}])
    enqueuer = _container(build_enqueuer_deployment(spec, owner=OWNER))
    worker = _container(build_worker_deployment(spec, spec.queues[0], owner=OWNER, replicas=1))
    for container in (enqueuer, worker):
        assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
        assert "memory" in container["resources"]["limits"]
    none = _spec(queues=[{"name": "emails", "handler": "app.tasks:send", "resources": {}}])
    bare = build_worker_deployment(none, none.queues[0], owner=OWNER, replicas=1)
    assert _container(bare)["resources"] == {}  # {} asks for none


def test_each_role_gets_its_own_redis_secret_falling_back_to_the_shared_one() -> None:
    spec = _spec(
        redis={
            "secretRef": {"name": "rd", "key": "url"},
            "enqueuerSecretRef": {"name": "rd-enqueuer", "key": "url"},
        }
    )
    enqueuer, worker, _ = _all_manifests(spec)
    assert _env(enqueuer)["REDIS_URL"] == {"secretKeyRef": {"name": "rd-enqueuer", "key": "url"}}
    assert _env(worker)["REDIS_URL"] == {"secretKeyRef": {"name": "rd", "key": "url"}}
    roles = _spec(
        redis={
            "enqueuerSecretRef": {"name": "rd-enqueuer", "key": "url"},
            "workerSecretRef": {"name": "rd-worker", "key": "url"},
            "operatorSecretRef": {"name": "rd-operator", "key": "url"},
        }
    )
    enqueuer, worker, _ = _all_manifests(roles)
    assert _env(worker)["REDIS_URL"] == {"secretKeyRef": {"name": "rd-worker", "key": "url"}}
    assert roles.redis.secret_for("operator").name == "rd-operator"


def test_pdbs_take_one_pod_at_a_time_and_only_where_a_queue_can_run_several() -> None:
    spec = _spec(
        queues=[
            {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 4},
            {"name": "single", "handler": "app.tasks:send", "minReplicas": 1, "maxReplicas": 1},
        ]
    )
    enqueuer = build_enqueuer_pdb(OWNER)
    assert enqueuer["spec"]["maxUnavailable"] == 1
    assert (
        enqueuer["spec"]["selector"]["matchLabels"]
        == build_enqueuer_deployment(spec, owner=OWNER)["spec"]["selector"]["matchLabels"]
    )
    emails = build_worker_pdb(spec.queues[0], owner=OWNER)
    assert emails is not None
    assert emails["metadata"]["name"] == worker_name(OWNER, "emails")
    assert emails["spec"]["selector"]["matchLabels"]["dispatch.composer.dev/queue"] == "emails"
    assert emails["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert emails["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert build_worker_pdb(spec.queues[1], owner=OWNER) is None


def test_migration_job_runs_dispatcher_migrate_as_the_owner_with_the_enqueuer_image() -> None:
    spec = _full_spec()
    defaults = WorkloadDefaults(enqueuer_image="reg/enq:2", worker_image="reg/w:2")
    job = build_migration_job(spec, owner=OWNER, defaults=defaults)
    container = _container(job)
    assert container["command"] == ["dispatcher"]
    assert container["args"] == ["migrate"]
    # The enqueuer's image, which (named in no spec) is the operator's own version.
    assert spec.enqueuer.image is None
    assert container["image"] == "reg/enq:2"
    assert _env(job)["DATABASE_URL"] == {"secretKeyRef": {"name": "pg-owner", "key": "dsn"}}
    assert "REDIS_URL" not in _env(job)
    assert _pod(job)["restartPolicy"] == "Never"
    assert "livenessProbe" not in container
    assert job["metadata"]["name"] == migration_job_name(OWNER, "reg/enq:2")
    pinned = _spec(enqueuer={"image": "reg.example.com/enq:1.0"})
    assert _container(build_migration_job(pinned, owner=OWNER))["image"] == (
        "reg.example.com/enq:1.0"
    )
    other = migration_job_name(OWNER, "reg.example.com/enq:2.0")
    assert other != job["metadata"]["name"]
    assert len(other) <= 63
    plain = _spec()
    fallback = build_migration_job(plain, owner=OWNER)
    assert _env(fallback)["DATABASE_URL"] == {"secretKeyRef": {"name": "pg", "key": "dsn"}}


def test_startup_probe_gives_slow_handler_imports_time_before_liveness() -> None:
    for manifest in _all_manifests(_spec()):
        container = _container(manifest)
        startup = container["startupProbe"]
        assert startup["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
        assert "initialDelaySeconds" not in container["livenessProbe"]
