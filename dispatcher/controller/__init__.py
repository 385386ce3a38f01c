"""The kopf operator for OutboxDispatcher resources.

Pure (no I/O, unit-tested):

- the resource: ``resource`` (its names, the models' base), ``model`` (the spec),
  ``podsettings``, ``coretypes`` (core/v1 schemas), ``conditions`` (the status), ``crd``
  (the CRD rendered from them), ``quantity``;
- decisions: ``scaling`` and ``autoscale`` (replicas from backlog), ``shard_policy``,
  ``migration``, ``report`` (a pass's result and the status made of it);
- manifests: ``identity`` (names, labels, owner), ``pods`` (containers and pod specs),
  ``render`` (Deployments, budgets, the migration Job).

Adapters: ``k8s`` (the Kubernetes API), ``redis_access`` (one pipelined measurement),
``probes`` (PostgreSQL, the CRD), ``cache`` (the watch cache), ``effects`` (a pass's API
writes), ``metrics``.

Glue: ``reconcile`` (one pass: observe, decide, apply), ``operator`` (one loop per
dispatcher), ``operator_config``, ``handlers`` (kopf's watches to the operator).
"""
