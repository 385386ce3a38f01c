"""Wire compatibility with the spec page's Go fleet, both directions, on a real Redis.

``specfleet`` (``tests/interop/specfleet``) is the spec's own Go code on go-redis
v9: its enqueuer's ``publishRow`` and its consumer. Direction one: rows published
by our enqueuer are read by their consumer with exactly the values their
publisher writes for the same rows (plus our ``outbox_id``). Direction two: the
entries their publisher writes for the spec's ``EnqueueDispatch`` payloads are
handled by our worker, every field as the task was written.
"""

from __future__ import annotations

import json
import random
import subprocess
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.models import TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream import publish_shard_count, shard_for, task_stream
from dispatcher.worker import Worker
from tests.enqueuers import make_enqueuer
from tests.waiting import eventually
from tests.workers import config, running

SHARDS = 4


def _scalar_payloads() -> list[str | None]:
    """Rows as applications write them: every kind of top-level value the spec's fleet sends."""
    rng = random.Random(39)
    floats = [rng.uniform(-1e6, 1e6) for _ in range(40)]
    floats += [rng.random() * 10.0 ** rng.randint(-30, 30) for _ in range(40)]
    ints = [0, -1, 7, 2**31, -(2**53), 2**53 + 1, 12345678901234567890, 10**25]
    docs: list[Any] = [
        {"task_id": "t8", "run_id": "r", "workflow_version": 3, "attempt": 1, "input": '{"a":1}'},
        {"s": "", "u": "žluťoučký kůň 🐴", "q": 'with "quotes" and \\ and \n'},
        {"t": True, "f": False, "n": None, "id": "payload's own id"},
        {"data": "a key named data", "z": 0.0, "neg": -0.5, "e": 1e21, "tiny": 1.5e-7},
        {f"i{n}": v for n, v in enumerate(ints)},
        {f"f{n}": v for n, v in enumerate(floats)},
        {"dec": 2.50, "exp": 1e-300, "max": 1.7976931348623157e308},
    ]
    raw: list[str | None] = [json.dumps(d) for d in docs]
    raw += [None, "[1, 2]", '"just text"', "42", '{"big": 1' + "0" * 400 + "}"]
    return raw


def _insert(db_url: str, payloads: list[str | None], stream: str) -> list[tuple[str, str | None]]:
    """The rows as PostgreSQL hands them back (jsonb's own text): what either enqueuer reads."""
    out = []
    with psycopg.connect(db_url) as conn:
        for payload in payloads:
            row = conn.execute(
                "INSERT INTO outbox (id, task_id, stream, payload) VALUES (%s, %s, %s, %s::jsonb)"
                " RETURNING id, payload::text",
                (str(uuid.uuid4()), "t8", stream, payload),
            ).fetchone()
            assert row is not None
            out.append((row[0], row[1]))
    return out


def _specfleet(binary: Path, *args: str, feed: str = "") -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(binary), *args], input=feed, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _their_publish(
    binary: Path, redis_url: str, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return _specfleet(
        binary, "publish", redis_url, feed="".join(json.dumps(r) + "\n" for r in rows)
    )


def _their_consume(binary: Path, redis_url: str, stream: str, count: int) -> list[dict[str, Any]]:
    return [m["values"] for m in _specfleet(binary, "consume", redis_url, stream, "go", str(count))]


async def test_their_consumer_reads_our_entries_as_their_publisher_writes_them(
    specfleet: Path,
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    redis_url: str,
    queue: str,
) -> None:
    await publish_shard_count(redis_standalone, 1)
    ours, theirs = task_stream(queue, 0), f"spec.{queue}"
    rows = _insert(outbox_db_url, _scalar_payloads(), ours)
    published = _their_publish(
        specfleet, redis_url, [{"id": i, "stream": theirs, "payload": p} for i, p in rows]
    )
    assert all("entry" in p for p in published), published
    while await make_enqueuer(pool, redis_standalone).process_batch():
        pass

    read_ours = _their_consume(specfleet, redis_url, ours, len(rows))
    read_theirs = _their_consume(specfleet, redis_url, theirs, len(rows))

    by_id = {values["outbox_id"]: values for values in read_ours}
    assert len(by_id) == len(rows)
    for (row_id, payload), their_values in zip(rows, read_theirs, strict=True):
        assert by_id[row_id] == {**their_values, "outbox_id": row_id}, payload


async def test_nested_values_are_json_where_their_publisher_cannot_send_them(
    specfleet: Path,
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    redis_url: str,
    queue: str,
) -> None:
    await publish_shard_count(redis_standalone, 1)
    ours = task_stream(queue, 0)
    payload = '{"o": {"b": [1, true, null, 2.5]}, "s": "x"}'
    ((row_id, text),) = _insert(outbox_db_url, [payload], ours)
    (refused,) = _their_publish(
        specfleet, redis_url, [{"id": row_id, "stream": "x", "payload": text}]
    )
    assert "can't marshal map[string]interface {}" in refused["error"]
    await make_enqueuer(pool, redis_standalone).process_batch()
    (values,) = _their_consume(specfleet, redis_url, ours, 1)
    assert values == {"o": '{"b":[1,true,null,2.5]}', "s": "x", "outbox_id": row_id}


def _spec_dispatch_payload(n: int, queue: str, task_input: str) -> dict[str, Any]:
    """The spec's ``EnqueueDispatch`` payload (its json.Marshal of the map it builds)."""
    return {
        "attempt": n % 3 + 1,
        "input": task_input,
        "node_id": f"node-{n}",
        "node_type": "http",
        "run_id": f"run-{n}",
        "task_id": f"{queue}-task-{n}",
        "workflow_id": "wf-ü",
        "workflow_version": 1000 + n,
    }


async def test_our_worker_handles_every_entry_their_publisher_writes(
    specfleet: Path, redis_standalone: RedisClient, redis_url: str, queue: str
) -> None:
    await publish_shard_count(redis_standalone, SHARDS)
    # Inputs as the spec's EnqueueDispatch stores them: string(d.Input), "" for none at all.
    inputs = ['{"url":"https://example.test","n":[1,2]}', "null", "", "true", "0", '"s"', "[]"]
    written = [_spec_dispatch_payload(n, queue, inputs[n % len(inputs)]) for n in range(28)]
    extra = {"flag": True, "none": None, "ratio": 0.25}  # fields a worker ignores
    rows = [
        {
            "id": str(uuid.uuid4()),
            "stream": task_stream(queue, shard_for(d["task_id"], SHARDS)),
            "payload": json.dumps({**d, **(extra if n % 2 else {})}),
        }
        for n, d in enumerate(written)
    ]
    assert all("entry" in p for p in _their_publish(specfleet, redis_url, rows))

    seen: dict[str, TaskMessage] = {}

    async def handle(message: TaskMessage) -> None:
        seen[message.task_id] = message

    worker = Worker(redis_standalone, handle, config(queue, shards=SHARDS))
    async with running(worker):
        await eventually(lambda: len(seen) == len(written), within=30, what="every entry handled")

    for d in written:
        message = seen[d["task_id"]]
        assert message.model_dump(exclude={"input", "outbox_id", "traceparent"}) == {
            k: v for k, v in d.items() if k != "input"
        }
        assert message.input == (json.loads(d["input"]) if d["input"] else None)
        assert message.outbox_id == ""  # the spec's publisher adds none
