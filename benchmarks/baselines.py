"""Baselines the product is measured against, in the same run.

``PerRowPublisher`` is the straightforward relay: one awaited XADD per row,
as the spec page's ``publishRow`` loop does.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import RedisError

from dispatcher.stream import Fields, PublishResult, RedisStreamPublisher


class PerRowPublisher(RedisStreamPublisher):
    async def publish_many(
        self,
        entries: Sequence[tuple[str, Fields]],
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> list[PublishResult]:
        results = []
        for stream, fields in entries:
            try:
                results.append(PublishResult(stream, entry_id=await self.publish(stream, fields)))
            except RedisError as exc:
                results.append(PublishResult(stream, error=exc))
        return results

    async def publish(self, stream: str, fields: Fields) -> str:
        await self._ensure_groups([stream])
        return str(await self.client.xadd(stream, dict(fields)))  # type: ignore[arg-type]
