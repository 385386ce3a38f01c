"""The operator's pass puts ``spec.queues[].limits`` in Redis: only where Redis differs."""

from __future__ import annotations

from dispatcher.controller.limits_spec import publish_limits
from dispatcher.controller.model import OutboxDispatcherSpec
from dispatcher.redis_client import RedisClient
from dispatcher.stream.limit_keys import QueueLimits, limits_key, read_limits

SECRETS = {
    "postgres": {"secretRef": {"name": "db", "key": "url"}},
    "redis": {"secretRef": {"name": "redis", "key": "url"}},
}


def spec(*queues: dict[str, object]) -> OutboxDispatcherSpec:
    return OutboxDispatcherSpec.model_validate({**SECRETS, "queues": list(queues)})


async def test_limits_of_the_spec_are_written_when_redis_holds_something_else(
    redis_standalone: RedisClient,
) -> None:
    owned = {"name": "owned", "handler": "m:f", "limits": {"maxInFlight": 4, "rate": 2.5}}
    free = {"name": "free", "handler": "m:f"}
    await redis_standalone.set(limits_key("free"), '{"max_in_flight": 9}')  # the CLI's
    events: list[tuple[str, str, bool]] = []

    await publish_limits(redis_standalone, spec(owned, free).queues, events=events)
    assert await read_limits(redis_standalone, "owned") == QueueLimits(max_in_flight=4, rate=2.5)
    assert await read_limits(redis_standalone, "free") == QueueLimits(max_in_flight=9)
    assert [e[0] for e in events] == ["LimitsPublished"]

    await publish_limits(redis_standalone, spec(owned, free).queues, events=events)
    assert len(events) == 1  # the same: nothing written

    for garbage in ("garbage", b"\xff\xfe", "hash"):  # by hand, or an attacker
        await redis_standalone.delete(limits_key("owned"))
        if garbage == "hash":
            await redis_standalone.hset(limits_key("owned"), "x", "y")  # type: ignore[misc]
        else:
            await redis_standalone.set(limits_key("owned"), garbage)
        await publish_limits(redis_standalone, spec(owned, free).queues, events=events)
        want = QueueLimits(max_in_flight=4, rate=2.5)
        assert await read_limits(redis_standalone, "owned") == want, garbage

    changed = {**owned, "limits": {"rate": 1, "burst": 3}}
    await publish_limits(redis_standalone, spec(changed, free).queues, events=events)
    assert await read_limits(redis_standalone, "owned") == QueueLimits(rate=1, burst=3)

    await publish_limits(redis_standalone, spec({**owned, "limits": {}}).queues, events=events)
    assert await read_limits(redis_standalone, "owned") == QueueLimits()  # owned: none
    assert len(events) == 6
