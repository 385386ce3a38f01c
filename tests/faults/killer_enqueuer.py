"""``dispatcher enqueuer`` that dies (``os._exit``) whenever its batch holds a marked row.

Run as ``python -m tests.faults.killer_enqueuer MARKER <enqueuer flags>``: publishing
an entry whose command (packed by the claim) contains MARKER, or encoding a payload
containing it (the rows the enqueuer encodes itself), ends the process at once, with
its batch open (the row kills whoever takes it).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import dispatcher.cli.outbox  # noqa: F401  (loads every module that holds payload_fields)
from dispatcher import models
from dispatcher.cli import main
from dispatcher.stream.publisher import RedisStreamPublisher


def _armed(marker: str) -> None:
    original = models.payload_fields

    def killer(payload: str | None, outbox_id: str) -> dict[str, str]:
        if payload is not None and marker in payload:
            os._exit(17)
        return original(payload, outbox_id)

    for module in list(sys.modules.values()):
        if getattr(module, "payload_fields", None) is original:
            module.payload_fields = killer  # type: ignore[attr-defined]

    publish_packed = RedisStreamPublisher.publish_packed

    async def killing(self: RedisStreamPublisher, streams: Any, commands: Any, **kw: Any) -> Any:
        if any(marker.encode() in command for command in commands):
            os._exit(17)
        return await publish_packed(self, streams, commands, **kw)

    RedisStreamPublisher.publish_packed = killing  # type: ignore[method-assign]


if __name__ == "__main__":
    _armed(sys.argv[1])
    sys.exit(main(["enqueuer", *sys.argv[2:]]))
