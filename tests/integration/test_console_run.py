"""The console's run lookup: a search of bounded steps, over real PostgreSQL and Redis.

A lookup by ``run_id`` cannot use an index (there is none, on purpose), so each
request reads one bounded slice of the outbox, of ``outbox_dlq`` and of the
keyspace and returns what it found with a cursor to continue. Over a keyspace
and tables larger than one request's budget the search takes several requests
and, assembled as the page assembles it, finds exactly the run's tasks: on
standalone Redis and on the suite's Cluster (the cursor names the node its
SCAN is on). A cursor is untrusted input: a forged one is refused in one line.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import RedisCluster

from dispatcher.console.run_search import run_tasks
from dispatcher.redis_client import RedisClient
from dispatcher.worker.dedup import ATTEMPT_PREFIX

# A budget far below the data: every part of the search takes several requests.
SMALL = {"scan_steps": 2, "scan_count": 50, "chunk": 40}
FILLER = 1500
OUTBOX_ROWS, OUTBOX_OWN = 150, 13
DLQ_ROWS, DLQ_OWN = 110, 7


class Data:
    """What was written for one test: the run's own rows and attempts, and everyone's keys."""

    def __init__(self, tag: str) -> None:
        # Glob characters in the run id: its keys are matched by an escaped prefix. The
        # neighbour's keys would match the pattern unescaped (``[7]`` is a class: ``7``).
        self.run = f"run-{tag}-[7]*"
        self.neighbour = f"run-{tag}-7"
        self.keys: list[str] = []
        self.attempts: set[tuple[str, str]] = set()
        self.outbox: set[str] = set()
        self.dlq: set[str] = set()


async def _fill_redis(client: RedisClient, data: Data, tag: str) -> None:
    values: dict[str, str] = {}
    for n in range(57):
        task, attempt = f"t{n}", str(1 + n % 3)
        values[f"{ATTEMPT_PREFIX}{data.run}:{task}:{attempt}"] = "done" if n % 2 else "2|"
        data.attempts.add((task, attempt))
    for n in range(40):
        values[f"{ATTEMPT_PREFIX}{data.neighbour}:t{n}:1"] = "done"
    for n in range(FILLER):
        values[f"{ATTEMPT_PREFIX}other-{tag}-{n}:t{n}:1"] = "done"
    pipe = client.pipeline(transaction=False)
    for key, value in values.items():
        pipe.set(key, value)
    await pipe.execute()
    data.keys = list(values)


def _fill_postgres(url: str, data: Data) -> None:
    """Rows of the run spread among others' (ids in an order unrelated to the run)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(OUTBOX_ROWS):
            own = n % (OUTBOX_ROWS // OUTBOX_OWN) == 0 and len(data.outbox) < OUTBOX_OWN
            row = f"o-{uuid.uuid4().hex}"
            conn.execute(
                "INSERT INTO outbox (id, task_id, stream, payload) VALUES (%s, %s, %s, %s)",
                (
                    row,
                    f"t{n}",
                    "workflow.tasks.q",
                    json.dumps({"run_id": data.run if own else "x"}),
                ),
            )
            if own:
                data.outbox.add(row)
        # The smallest id there is: a keyset that starts after '' would miss it.
        for n in range(DLQ_ROWS):
            own = n % (DLQ_ROWS // DLQ_OWN) == 0 and len(data.dlq) < DLQ_OWN
            row = "" if n == 0 else f"d-{uuid.uuid4().hex}"
            conn.execute(
                "INSERT INTO outbox_dlq (id, task_id, stream, payload, attempts, last_error)"
                " VALUES (%s, %s, %s, %s, 5, 'boom')",
                (row, f"t{n}", "workflow.tasks.q", json.dumps({"run_id": data.run if own else n})),
            )
            if own:
                data.dlq.add(row)


@pytest.fixture
async def data(any_redis: RedisClient, outbox_db_url: str) -> AsyncIterator[Data]:
    tag = uuid.uuid4().hex[:8]
    found = Data(tag)
    await _fill_redis(any_redis, found, tag)
    _fill_postgres(outbox_db_url, found)
    yield found
    pipe = any_redis.pipeline(transaction=False)
    for key in found.keys:  # the suite's Cluster is shared: leave it as found
        pipe.delete(key)
    await pipe.execute()


async def _search(
    client: RedisClient, pool: AsyncConnectionPool[Any], run_id: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every answer of one search, and the result assembled as the page does."""
    answers: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        answer = await run_tasks(client=client, pool=pool, run_id=run_id, cursor=cursor, **SMALL)
        answers.append(answer)
        cursor = answer["next"]
        if cursor is None:
            break
        assert len(answers) < 500, "the search never completes"
    # SCAN may return a key twice (a rehash between steps): the page keeps one row per key.
    attempts = {(a["task_id"], a["attempt"]): a for answer in answers for a in answer["attempts"]}
    assembled = {
        "outbox": [r["id"] for answer in answers for r in answer["outbox"]],
        "outbox_dlq": [r["id"] for answer in answers for r in answer["outbox_dlq"]],
        "attempts": attempts,
    }
    return answers, assembled


async def test_a_run_lookup_is_a_search_of_bounded_steps_that_finds_exactly_the_run(
    any_redis: RedisClient, pool: AsyncConnectionPool[Any], data: Data
) -> None:
    answers, found = await _search(any_redis, pool, data.run)

    assert answers[0]["next"] is not None  # one request does not walk to the end
    assert len(answers) > 2
    for answer in answers:  # each request did a bounded amount of work
        searched = answer["searched"]
        assert searched["outbox_rows"] <= SMALL["chunk"]
        assert searched["outbox_dlq_rows"] <= SMALL["chunk"]
        assert searched["redis_scans"] <= SMALL["scan_steps"]
        assert searched["redis_scan_count"] == SMALL["scan_count"]
    # Every row and key was examined once: the parts each searched to their end.
    assert sum(a["searched"]["outbox_rows"] for a in answers) >= OUTBOX_ROWS
    assert sum(a["searched"]["outbox_dlq_rows"] for a in answers) >= DLQ_ROWS
    assert sorted(found["outbox"]) == sorted(data.outbox)  # none twice, none missing
    assert sorted(found["outbox_dlq"]) == sorted(data.dlq)
    assert set(found["attempts"]) == data.attempts
    states = {a["state"] for a in found["attempts"].values()}
    assert states == {"done", "failed runs: 2"}
    assert all(a["run_id"] == data.run and a["cancelled"] is False for a in answers)


async def test_a_run_with_nothing_anywhere_completes_with_nothing(
    any_redis: RedisClient, pool: AsyncConnectionPool[Any], data: Data
) -> None:
    answers, found = await _search(any_redis, pool, f"{data.run}-none")
    assert len(answers) > 1
    assert found == {"outbox": [], "outbox_dlq": [], "attempts": {}}


def _forge(doc: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


async def test_a_forged_cursor_is_refused_in_one_line(
    any_redis: RedisClient, pool: AsyncConnectionPool[Any], data: Data
) -> None:
    first = await run_tasks(client=any_redis, pool=pool, run_id=data.run, cursor=None, **SMALL)
    good = first["next"]
    assert good is not None
    decoded = json.loads(base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)))
    node = decoded[4]

    def edited(index: int, value: Any) -> str:
        return _forge([*decoded[:index], value, *decoded[index + 1 :]])

    forged = {
        "not base64": "!!!",
        "not JSON": base64.urlsafe_b64encode(b"[1, nope").decode().rstrip("="),
        "not a list": _forge({"scan": 0}),
        "too short": _forge(decoded[:-1]),
        "another version": edited(0, 99),
        "an outbox key of another type": edited(2, 7),
        "a negative SCAN cursor": edited(5, -1),
        "a SCAN cursor of 65 bits": edited(5, 2**64),
        "a SCAN cursor that is a bool": edited(5, True),
        "a node Redis does not have": edited(4, "10.0.0.1:1"),
        "a finished search": _forge([*decoded[:2], None, None, None, 0]),
    }
    for what, cursor in forged.items():
        with pytest.raises(ValueError, match=r"^cursor: ") as caught:
            await run_tasks(client=any_redis, pool=pool, run_id=data.run, cursor=cursor, **SMALL)
        assert "\n" not in str(caught.value), what
    # A cursor continues the search of its own run only.
    with pytest.raises(ValueError, match=r"^cursor: .*another run"):
        await run_tasks(client=any_redis, pool=pool, run_id=data.neighbour, cursor=good, **SMALL)
    # The good one still continues.
    second = await run_tasks(client=any_redis, pool=pool, run_id=data.run, cursor=good, **SMALL)
    assert second["run_id"] == data.run
    if isinstance(any_redis, RedisCluster):
        assert node in {n.name for n in any_redis.get_primaries()}
    else:
        assert node == ""
