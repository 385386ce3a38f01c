"""The worker runtime: read a queue's shard streams, run a handler, ack, reclaim, dead-letter.

``Worker`` (``runtime.py``) wires the parts: per-stream loops (``reader.py``),
the shared handler slots (``slots.py``), what happens to one delivery
(``delivery.py``), duplicate suppression (``dedup.py``), dead letters
(``dead_letter.py``), the user's handler (``handler.py``) and metrics
(``worker_metrics.py``).
"""

from dispatcher.worker.cancels import cancel_requested
from dispatcher.worker.dead_letter import dead_letter_fields
from dispatcher.worker.dedup import AttemptGuard, Claim, attempt_key
from dispatcher.worker.handler import Handler, HandlerImportError, load_handler
from dispatcher.worker.runtime import Worker
from dispatcher.worker.worker_config import WorkerConfig, default_consumer_name

__all__ = [
    "AttemptGuard",
    "Claim",
    "Handler",
    "HandlerImportError",
    "Worker",
    "WorkerConfig",
    "attempt_key",
    "cancel_requested",
    "dead_letter_fields",
    "default_consumer_name",
    "load_handler",
]
