"""Which ``OutboxDispatcher`` owns a Redis database's shard key: the marker next to it.

Two resources pointing at one Redis database would each publish their own
``spec.shards`` to ``composer:stream_shards`` and fight. So the first one records
itself in ``composer:stream_shards:owner`` (JSON: namespace, name, uid) with
``SET NX``; a pass reads the marker in its measuring round trip and goes on only
when the marker names its own resource. Another resource gets
``Degraded=RedisConflict`` and writes nothing. A marker whose resource no longer
exists (deleted while no operator ran, or deleted and created again: another uid) is
taken over; the owner's deletion removes it (``release``).

The marker is read, never trusted: anything that is not an owner record is a
conflict with a message saying which key to look at, never a crash and never an
overwrite (only the operator's Redis user may write it: docs/security.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from dispatcher.controller.api_requests import APIError, KubeApi
from dispatcher.controller.conditions import DEGRADED, Reason
from dispatcher.controller.identity import Owner
from dispatcher.controller.redis_access import NOT_TEXT, RedisProblem, redis_message
from dispatcher.controller.report import Failure
from dispatcher.controller.resource import KIND
from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import SHARDS_KEY, SHARDS_OWNER_KEY

__all__ = [
    "SHARDS_OWNER_KEY",
    "ShardKeyOwner",
    "claim",
    "in_conflict",
    "judge",
    "ownership_problem",
    "release",
    "release_marker",
    "take_over",
]

log = logging.getLogger("dispatcher.controller")
REASON = Reason.REDIS_CONFLICT
Verdict = Literal["mine", "free", "foreign", "unreadable"]


class ShardKeyOwner(pydantic.BaseModel):
    """The resource named by the marker."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    namespace: str = pydantic.Field(min_length=1, max_length=253)
    name: str = pydantic.Field(min_length=1, max_length=253)
    uid: str = pydantic.Field(min_length=1, max_length=64)

    @classmethod
    def of(cls, owner: Owner) -> ShardKeyOwner:
        return cls(namespace=owner.namespace, name=owner.name, uid=owner.uid)

    def text(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        return f"OutboxDispatcher {self.namespace}/{self.name} (uid {self.uid})"


def judge(raw: Any, *, me: Owner) -> tuple[Verdict, ShardKeyOwner | None]:
    """What the marker's value (as read, or None) says about ``me``."""
    if raw is None:
        return "free", None
    try:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        found = ShardKeyOwner.model_validate_json(text)
    except (UnicodeDecodeError, pydantic.ValidationError):
        return "unreadable", None
    if found == ShardKeyOwner.of(me):
        return "mine", found
    return "foreign", found


async def _read(client: RedisClient) -> Any:
    try:
        return await client.get(SHARDS_OWNER_KEY)
    except UnicodeDecodeError:  # bytes a decoding client cannot return: not an owner record
        return NOT_TEXT


async def claim(client: RedisClient, *, me: Owner) -> bool:
    """Record ``me`` if no one is recorded; whether the marker names ``me`` now."""
    mine = ShardKeyOwner.of(me).text()
    if await client.set(SHARDS_OWNER_KEY, mine, nx=True):
        return True
    return judge(await _read(client), me=me)[0] == "mine"


async def take_over(client: RedisClient, *, me: Owner, stale: ShardKeyOwner) -> bool:
    """Replace the marker of a resource that is gone; whether the marker names ``me`` now.

    Another resource may take it over at the same moment: the value read back decides.
    """
    if judge(await _read(client), me=me)[1] != stale:
        return False  # changed since measured: the next pass looks again
    await client.set(SHARDS_OWNER_KEY, ShardKeyOwner.of(me).text())
    return judge(await _read(client), me=me)[0] == "mine"


async def release(client: RedisClient, *, me: Owner) -> bool:
    """Remove the marker if it names ``me`` (the resource is being deleted)."""
    if judge(await _read(client), me=me)[0] != "mine":
        return False
    await client.delete(SHARDS_OWNER_KEY)
    return True


async def release_marker(client: RedisClient, *, me: Owner) -> bool:
    """``release``, logged; a Redis that does not answer leaves a stale marker behind, which
    the next resource on that database takes over once the API says ``me`` is gone."""
    try:
        if await release(client, me=me):
            log.info("%s/%s: released %s", me.namespace, me.name, SHARDS_OWNER_KEY)
            return True
    except RedisProblem as exc:
        log.warning(
            "%s/%s: %s not released: %s",
            me.namespace,
            me.name,
            SHARDS_OWNER_KEY,
            redis_message(client, exc),
        )
    return False


async def ownership_problem(
    client: RedisClient, *, api: KubeApi, me: Owner, marker: Any
) -> Failure | None:
    """None when ``me`` owns the shard key (claimed now if free or stale), else the conflict.

    ``marker``: the marker's value as the pass measured it; nothing is written unless it is
    free, or names a resource the API says is gone.
    """
    verdict, holder = judge(marker, me=me)
    try:
        if verdict == "mine":
            return None
        if verdict == "free" and await claim(client, me=me):
            return None
        stale = verdict == "foreign" and holder is not None and not await _alive(api, holder)
        if stale and holder is not None and await take_over(client, me=me, stale=holder):
            return None
    except RedisProblem as exc:
        return Failure(Reason.REDIS_UNAVAILABLE, redis_message(client, exc))
    except APIError as exc:  # cannot tell whether the holder is gone: it is not ours
        return Failure(Reason.REDIS_CONFLICT, f"{_held(holder)}; reading it failed: {exc}")
    if verdict == "unreadable":
        return Failure(
            Reason.REDIS_CONFLICT,
            f"{SHARDS_OWNER_KEY} holds something that is not an owner record; if no other "
            f"OutboxDispatcher uses this Redis database, delete that key",
        )
    return Failure(Reason.REDIS_CONFLICT, _held(holder))


def _held(holder: ShardKeyOwner | None) -> str:
    who = holder.describe() if holder is not None else "another OutboxDispatcher"
    return (
        f"this Redis database's shard count ({SHARDS_KEY}) belongs to {who}: "
        f"nothing is written to it; point spec.redis at another database"
    )


async def _alive(api: KubeApi, holder: ShardKeyOwner) -> bool:
    """Whether the resource the marker names still exists (the same uid)."""
    found = await api.get(KIND, namespace=holder.namespace, name=holder.name)
    return found is not None and found.get("metadata", {}).get("uid") == holder.uid


def in_conflict(status: Mapping[str, Any]) -> bool:
    """Whether a dispatcher's status says another one owns its Redis database's shard key."""
    return any(
        c.get("type") == DEGRADED and c.get("status") == "True" and c.get("reason") == REASON
        for c in status.get("conditions") or []
    )
