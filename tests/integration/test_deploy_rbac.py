"""kopf runs under the operator's Role, which grants no cluster-scoped scanning.

The Role of ``deploy/base/rbac.yaml`` (the chart's is the same object) is checked against
the operator's requests on the real API server in ``tests/e2e/test_operator_rbac.py``:
every call allowed, every verb used. kopf's scanning of namespaces and CRDs is refused by
that Role in a cluster; kopf then falls back to the ``--namespace`` names.
"""

from __future__ import annotations

import inspect


def test_kopf_tolerates_refused_scanning() -> None:
    """Without namespace/CRD list+watch, kopf 1.45 warns and serves the given namespaces."""
    from kopf._core.reactor import observation

    for observer in (observation.namespace_observer, observation.resource_observer):
        assert "except errors.APIForbiddenError" in inspect.getsource(observer), observer
