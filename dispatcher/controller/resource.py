"""What names the ``OutboxDispatcher`` resource, and the base of every model of it.

The API group, version, kind and plural are the contract clients, RBAC rules and the CRD
share. ``ResourceModel`` gives the spec's and the status's models one shape: frozen,
camelCase field names on the wire, snake_case in Python.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "SINGULAR",
    "ResourceModel",
    "cel_rule",
]

API_GROUP = "dispatch.composer.dev"
API_VERSION = "v1alpha1"
KIND = "OutboxDispatcher"
PLURAL = "outboxdispatchers"
SINGULAR = "outboxdispatcher"
SHORT_NAME = "obd"


class ResourceModel(BaseModel):
    """A part of the resource: immutable, camelCase aliases, unknown fields refused."""

    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )


def cel_rule(rule: str, message: str) -> dict[str, Any]:
    """A CEL rule of the CRD (an ``x-kubernetes-validations`` entry); its model twin says
    ``message`` too."""
    return {"rule": rule, "message": message}
