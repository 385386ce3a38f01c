"""The cyclic garbage collector of a long-lived process, tuned once its start-up is done.

CPython's collector scans every tracked object of a generation when it runs.
A worker allocates thousands of short-lived containers per read batch (stream
fields, parsed inputs, models), nearly all freed by reference counting, yet
at the default young-generation threshold (700 net allocations) a collection
runs every few batches and scans the whole batch still in hand; the full
collections that follow scan the process's start-up heap (modules, pydantic
schemas, the handler's imports) over and over: on the no-op worker benchmark
1.56 s of ~6.5 s of CPU for 200,000 messages (2026-12-03; benchmarks/NOTES.md,
"Figures the code's comments quote"). The enqueuer is alike: a claim of 100
rows makes thousands of short-lived objects, and at idle a young collection
ran for nearly every dispatch.

``settle_heap`` moves what exists after start-up into the permanent generation
(``gc.freeze``: never scanned again, and never freed; it is live anyway) and
raises the young threshold, so a collection runs per ``YOUNG_THRESHOLD`` net
allocations. Cyclic garbage still gets collected, only in bigger, rarer
rounds. It is for a process's entry point (the CLI), never for a library
call: an application embedding the worker owns its own collector settings.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_heap"]

# Net allocations of tracked objects between young collections (CPython's default: 700).
YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Freeze the heap built so far and make young collections rarer; call once, after start-up."""
    gc.collect()  # what start-up left as garbage goes now, not frozen forever
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(max(_young, YOUNG_THRESHOLD), middle, old)
