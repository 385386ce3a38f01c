"""The outbox: its schema, the application's API (``enqueue_dispatch``, ``cancel_run``), the
enqueuer."""

from dispatcher.outbox.app_api import enqueue_dispatch, enqueue_dispatch_async
from dispatcher.outbox.enqueuer import OutboxEnqueuer
from dispatcher.outbox.enqueuer_config import EnqueuerConfig
from dispatcher.outbox.listener import NOTIFY_CHANNEL, OutboxListener
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.outbox.run_cancel import CancelMissing, InvalidRunId, cancel_run, cancel_run_async
from dispatcher.outbox.schema import migrate

__all__ = [
    "NOTIFY_CHANNEL",
    "CancelMissing",
    "EnqueuerConfig",
    "InvalidRunId",
    "OutboxEnqueuer",
    "OutboxListener",
    "OutboxRepository",
    "cancel_run",
    "cancel_run_async",
    "enqueue_dispatch",
    "enqueue_dispatch_async",
    "migrate",
]
