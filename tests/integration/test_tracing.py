"""One trace from the business transaction through the publish to the handler."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg_pool import AsyncConnectionPool

from dispatcher.models import TaskMessage
from dispatcher.outbox import enqueue_dispatch
from dispatcher.redis_client import RedisClient
from dispatcher.worker import Worker, WorkerConfig
from tests.data import dispatch
from tests.enqueuers import make_enqueuer
from tests.waiting import eventually

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)  # once per process: the global provider
    return _EXPORTER


@pytest.mark.parametrize("sync_handler", [False, True])
async def test_handler_span_is_a_child_of_the_enqueuing_span(
    spans: InMemorySpanExporter,
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    queue: str,
    sync_handler: bool,
) -> None:
    spans.clear()
    tracer = trace.get_tracer("app")
    with (
        tracer.start_as_current_span("business transaction"),
        psycopg.connect(outbox_db_url) as conn,
    ):
        enqueue_dispatch(
            conn,
            dispatch("traced", queue, input="{}"),
        )
    assert await make_enqueuer(pool, redis_standalone).process_batch() == 1

    seen: list[TaskMessage] = []

    def work(message: TaskMessage) -> None:
        with tracer.start_as_current_span("user work"):
            seen.append(message)

    async def awork(message: TaskMessage) -> None:
        work(message)

    worker = Worker(
        redis_standalone,
        work if sync_handler else awork,
        WorkerConfig(queues=(queue,), shards=1, block_ms=100),
    )
    run = asyncio.create_task(worker.run())
    try:
        await eventually(lambda: len(seen) == 1)
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 30)

    by_name = {s.name: s for s in spans.get_finished_spans()}
    business, publish = by_name["business transaction"], by_name["outbox publish"]
    handle, user = by_name["handle task"], by_name["user work"]
    assert publish.parent is not None
    assert publish.parent.span_id == business.context.span_id
    assert handle.parent is not None
    assert handle.parent.span_id == publish.context.span_id
    assert user.parent is not None
    assert user.parent.span_id == handle.context.span_id
    assert len({s.context.trace_id for s in (business, publish, handle, user)}) == 1
