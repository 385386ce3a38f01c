"""The console's run lookup: a search of bounded steps, each request one step and a cursor.

Nothing indexes a run's tasks by ``run_id``, on purpose: an index on the outbox
would cost every dispatch a write (migration 0011), and a per-run key in Redis
would cost every claim a write that cannot even share a Cluster node with the
attempt key. So a lookup searches, and never walks to the end in one request:
each request reads the next ``chunk`` rows of the outbox and of ``outbox_dlq``
by primary key (keeping the run's), makes at most ``scan_steps`` calls of
``SCAN cursor MATCH <run's attempt keys> COUNT scan_count`` (one primary after
the other on a Cluster, in the order of their names), and answers what it found
with ``next``: the cursor that continues the search, ``None`` once every part
was read to its end. A part stops early past ``most`` of the run's entries.

What a finished search guarantees is SCAN's: every row and key present from its
first request to its last is found; one added or removed meanwhile may be found
or not, and a key may be returned twice (the page keeps one row per key). The
cursor comes back from the browser, so it is parsed strictly: anything this
module did not make for this run is refused (``ValueError``: HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import RedisCluster

from dispatcher.console.views import stamp
from dispatcher.models import dedup_run_part
from dispatcher.outbox.queries import QUERIES
from dispatcher.redis_client import RedisClient
from dispatcher.stream.cancel_keys import CANCELLED_RUNS, redis_now_ms
from dispatcher.worker.dedup import ATTEMPT_PREFIX, DONE

__all__ = ["CHUNK", "MOST", "SCAN_COUNT", "SCAN_STEPS", "SearchCursor", "run_tasks"]

# One request's budget: ~100,000 keys examined in Redis, 50,000 rows of each table read
# (benchmarks/results/console_load.md: a step takes well under a second on the big backlog).
SCAN_STEPS = 100
SCAN_COUNT = 1000
CHUNK = 50_000
MOST = 500  # of the run's entries per part and request: the page stays small
_VERSION = 1
_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,8000}")
_MAX_SCAN = 2**64 - 1


def _run_tag(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchCursor:
    """Where a run's search stands; ``None`` for a part read to its end.

    ``outbox``/``dlq``: the id the next chunk starts from (inclusive). ``node``:
    the Redis primary the SCAN is on (``""`` on standalone Redis), ``scan`` its cursor.
    """

    run: str
    outbox: str | None
    dlq: str | None
    node: str | None
    scan: int

    @classmethod
    def start(cls, run_id: str, *, node: str) -> SearchCursor:
        return cls(run=_run_tag(run_id), outbox="", dlq="", node=node, scan=0)

    @property
    def complete(self) -> bool:
        return self.outbox is None and self.dlq is None and self.node is None

    def encode(self) -> str:
        doc = [_VERSION, self.run, self.outbox, self.dlq, self.node, self.scan]
        text = json.dumps(doc, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(text).decode().rstrip("=")

    @classmethod
    def parse(cls, text: str, *, run_id: str) -> SearchCursor:
        """The cursor ``text`` of a search of ``run_id``; ValueError for anything else."""
        if not _CURSOR.fullmatch(text):
            raise ValueError("cursor: not a cursor of a run's search (bad characters)")
        try:
            doc = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (binascii.Error, ValueError):
            raise ValueError("cursor: not a cursor of a run's search (not its encoding)") from None
        if not (isinstance(doc, list) and len(doc) == 6 and doc[0] == _VERSION):
            raise ValueError("cursor: not a cursor of a run's search (not its layout)")
        _, run, outbox, dlq, node, scan = doc
        if not all(isinstance(v, str) or v is None for v in (outbox, dlq, node)):
            raise ValueError("cursor: not a cursor of a run's search (a position not a key)")
        if type(scan) is not int or not 0 <= scan <= _MAX_SCAN or (node is None and scan):
            raise ValueError("cursor: not a cursor of a run's search (not a SCAN cursor)")
        if run != _run_tag(run_id):
            raise ValueError("cursor: it continues the search of another run")
        cursor = cls(run=run, outbox=outbox, dlq=dlq, node=node, scan=scan)
        if cursor.complete:
            raise ValueError("cursor: that search is complete (look the run up again)")
        return cursor


def _glob_escaped(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _attempt_state(value: str) -> str:
    if value == DONE:
        return "done"
    runs, _, holder = value.partition("|")
    return f"running (run {runs})" if holder else f"failed runs: {runs}"


@dataclass(frozen=True, slots=True, kw_only=True)
class _TableStep:
    """One table's part of a step: the run's rows found, where the next step starts, rows read."""

    rows: list[dict[str, Any]]
    next_id: str | None
    examined: int


_TABLES = {"outbox": "run_outbox_rows", "outbox_dlq": "run_dlq_rows"}


async def _sql_step(
    conn: AsyncConnection[Any], at: SearchCursor, *, run_id: str, chunk: int, most: int
) -> dict[str, _TableStep]:
    """The next chunk of each table not yet searched to its end, from ``at``."""
    params = {"run_id": run_id, "outbox_from": at.outbox, "dlq_from": at.dlq}
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(QUERIES["run_search_chunk"], {**params, "chunk": chunk, "most": most})
    parts = {row["source"]: row for row in await cur.fetchall()}
    steps = {}
    for table, query in _TABLES.items():
        part = parts.get(table)  # none: nothing left to read in it
        found = []
        if part and part["found"]:
            await cur.execute(QUERIES[query], {"ids": part["found"]})
            found = [{k: stamp(v) for k, v in row.items()} for row in await cur.fetchall()]
        steps[table] = _TableStep(
            rows=found,
            next_id=part["next_id"] if part else None,
            examined=int(part["examined"]) if part else 0,
        )
    return steps


async def _primaries(client: RedisClient) -> list[str]:
    """The nodes a SCAN visits, in a stable order: ``[""]`` for standalone Redis."""
    if isinstance(client, RedisCluster):
        await client.initialize()  # a no-op once the slot map is known
        return sorted(node.name for node in client.get_primaries())
    return [""]


def _node_gone(node: str) -> ValueError:
    where = repr(node) if node else "(a cursor of standalone Redis)"
    return ValueError(f"cursor: Redis has no primary {where} (any more): look the run up again")


async def _scan_call(
    client: RedisClient, node: str, cursor: int, *, match: str, count: int
) -> tuple[int, list[str]]:
    if isinstance(client, RedisCluster):
        target = client.get_node(node_name=node)
        if target is None:  # without a target the call would go to every node
            raise _node_gone(node)
        reply: tuple[dict[str, int], list[Any]] = await client.scan(  # type: ignore[assignment]
            cursor, match=match, count=count, target_nodes=target
        )
        return int(reply[0][node]), [str(k) for k in reply[1]]
    after, keys = await client.scan(cursor, match=match, count=count)
    return int(after), [str(k) for k in keys]


async def _scan_steps(
    client: RedisClient,
    at: SearchCursor,
    *,
    nodes: list[str],
    match: str,
    steps: int,
    count: int,
    most: int,
) -> tuple[list[str], SearchCursor, int]:
    """Up to ``steps`` SCAN calls from ``at`` over ``nodes`` (the primaries in their order):
    the keys found, where they stopped, calls made."""
    if at.node is not None and at.node not in nodes:
        raise _node_gone(at.node)
    found: dict[str, None] = {}  # a key SCAN returns twice is kept once
    node, scan, calls = at.node, at.scan, 0
    while node is not None and calls < steps and len(found) < most:
        scan, keys = await _scan_call(client, node, scan, match=match, count=count)
        calls += 1
        found.update(dict.fromkeys(keys))
        if scan == 0:
            later = nodes[nodes.index(node) + 1 :]
            node = later[0] if later else None
    return list(found), replace(at, node=node, scan=scan), calls


async def _attempts(client: RedisClient, keys: list[str], prefix: str) -> list[dict[str, str]]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    values = await pipe.execute() if keys else []
    attempts = []
    for key, value in zip(keys, values, strict=True):
        if value is None:  # expired between the SCAN and the GET
            continue
        task, _, attempt = key.removeprefix(prefix).rpartition(":")
        attempts.append({"task_id": task, "attempt": attempt, "state": _attempt_state(str(value))})
    attempts.sort(key=lambda a: (a["task_id"], a["attempt"]))
    return attempts


async def run_tasks(
    *,
    client: RedisClient,
    pool: AsyncConnectionPool[Any],
    run_id: str,
    cursor: str | None,
    scan_steps: int = SCAN_STEPS,
    scan_count: int = SCAN_COUNT,
    chunk: int = CHUNK,
    most: int = MOST,
) -> dict[str, Any]:
    """One step of the search for ``run_id``'s tasks, from ``cursor`` (None: the start).

    Whether the run is cancelled (read in full, by key), the run's rows found in this
    step's chunk of the outbox and of ``outbox_dlq``, its attempt keys found by this
    step's SCAN calls, how much was searched, and ``next``.
    """
    nodes = await _primaries(client)
    if cursor is None:
        at = SearchCursor.start(run_id, node=nodes[0])
    else:
        at = SearchCursor.parse(cursor, run_id=run_id)
    prefix = f"{ATTEMPT_PREFIX}{dedup_run_part(run_id)}:"
    keys, after, calls = await _scan_steps(
        client,
        at,
        nodes=nodes,
        match=_glob_escaped(prefix) + "*",
        steps=scan_steps,
        count=scan_count,
        most=most,
    )
    async with pool.connection() as conn:
        tables = await _sql_step(conn, at, run_id=run_id, chunk=chunk, most=most)
        relaying = await (
            await conn.execute(QUERIES["run_cancel_waiting"], {"run_id": run_id})
        ).fetchone()
    waiting, dead = tables["outbox"], tables["outbox_dlq"]
    after = replace(after, outbox=waiting.next_id, dlq=dead.next_id)
    until = await client.zscore(CANCELLED_RUNS, run_id)
    return {
        "run_id": run_id,
        "cancelled": until is not None and until > await redis_now_ms(client),
        "cancel_waiting": relaying is not None,
        "outbox": waiting.rows,
        "outbox_dlq": dead.rows,
        "attempts": await _attempts(client, keys, prefix),
        "searched": {
            "outbox_rows": waiting.examined,
            "outbox_dlq_rows": dead.examined,
            "redis_scans": calls,
            "redis_scan_count": scan_count,
            "outbox_done": after.outbox is None,
            "outbox_dlq_done": after.dlq is None,
            "redis_done": after.node is None,
        },
        "next": None if after.complete else after.encode(),
    }
