"""outbox-dispatcher's no-op handler for ``dispatcher worker --handler``."""

from __future__ import annotations

from benchmarks.peers.record import note
from dispatcher.models import TaskMessage


async def handle(message: TaskMessage) -> None:
    note(message.task_id)
