"""Shard naming: Go-compatible FNV-1a, stream names, queue validation, spread."""

from __future__ import annotations

import collections
import math
import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.stream import (
    DEFAULT_SHARDS,
    SHARDS_KEY,
    TASK_STREAM_PREFIX,
    InvalidQueueName,
    NotATaskStream,
    Router,
    dead_letter_stream,
    fnv1a_32,
    parse_task_stream,
    queue_of_stream,
    queue_stream,
    queue_streams,
    route_stream,
    shard_for,
    task_stream,
)

# Published FNV-1a 32 test vectors (the reference test suite of the algorithm's
# authors, which Go's hash/fnv tests reproduce).
VECTORS = [
    (b"", 0x811C9DC5),
    (b"a", 0xE40C292C),
    (b"foobar", 0xBF9CF968),
    (b"b", 0xE70C2DE5),
    (b"fo", 0x6222E842),
    (b"foo", 0xA9F37ED7),
    (b"foob", 0x3F5076EF),
    (b"fooba", 0x39AAA18A),
]


@pytest.mark.parametrize(("data", "expected"), VECTORS)
def test_fnv1a_matches_published_vectors(data: bytes, expected: int) -> None:
    assert fnv1a_32(data) == expected


def test_constants_are_the_contract() -> None:
    assert TASK_STREAM_PREFIX == "workflow.tasks."
    assert DEFAULT_SHARDS == 4
    assert SHARDS_KEY == "composer:stream_shards"


def test_shard_for_is_hash_mod_shards() -> None:
    assert shard_for("foobar", 4) == 0xBF9CF968 % 4
    assert shard_for("a", 7) == 0xE40C292C % 7
    assert shard_for("täsk-ü", 16) == fnv1a_32("täsk-ü".encode()) % 16


@pytest.mark.parametrize("shards", [0, 1, -3])
def test_one_or_fewer_shards_is_shard_zero(shards: int) -> None:
    assert shard_for("anything", shards) == 0


def test_task_stream_names() -> None:
    assert task_stream("http", 3) == "workflow.tasks.http.3"
    assert dead_letter_stream("http") == "workflow.dead.http"
    assert parse_task_stream("workflow.tasks.http.3") == ("http", 3)


def test_queue_streams_orders_queue_then_shard() -> None:
    assert queue_streams(["a", "b"], 2) == [
        "workflow.tasks.a.0",
        "workflow.tasks.a.1",
        "workflow.tasks.b.0",
        "workflow.tasks.b.1",
    ]
    assert queue_streams(["a"], 0) == ["workflow.tasks.a.0"]


@pytest.mark.parametrize("bad", ["", " ", "a b", "a.b", "tab\t", "{tag}", "x" * 201, "é"])
def test_ambiguous_or_invalid_queue_names_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidQueueName, match="invalid queue name"):
        task_stream(bad, 0)


def test_negative_shard_is_rejected() -> None:
    with pytest.raises(ValueError, match="shard must be >= 0"):
        task_stream("q", -1)


@pytest.mark.parametrize("bad", ["workflow.tasks.q", "workflow.tasks.q.x", "other.q.1"])
def test_parse_rejects_non_task_streams(bad: str) -> None:
    with pytest.raises(ValueError, match="not a task stream"):
        parse_task_stream(bad)


@settings(max_examples=200)
@given(st.text(), st.integers(min_value=1, max_value=1024))
def test_shard_is_always_in_range_and_stable(task_id: str, shards: int) -> None:
    shard = shard_for(task_id, shards)
    assert 0 <= shard < shards
    assert shard == shard_for(task_id, shards)


@pytest.mark.parametrize("shards", [2, 4, 8, 16])
@pytest.mark.parametrize("seed", range(5))
def test_spread_over_shards_is_even(seed: int, shards: int) -> None:
    """Each shard's share of random task ids is within 5 binomial sigmas of n/shards.

    For n=4000 and 16 shards that is 250 +- 77 per shard; a broken hash
    (constant, or using only part of the id) fails it by far. The ids are uuid4s from a
    seeded generator: hypothesis's generated uuids are deliberately not uniform (it
    favours near-identical values), which made this statistical check fail now and then.
    """
    rng = random.Random(seed)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(4000)]
    counts = collections.Counter(shard_for(task_id, shards) for task_id in ids)
    expected = len(ids) / shards
    sigma = math.sqrt(len(ids) * (1 / shards) * (1 - 1 / shards))
    assert set(counts) == set(range(shards))
    assert all(abs(c - expected) <= 5 * sigma for c in counts.values()), counts


def test_route_picks_the_shard_of_the_current_count_for_any_stored_form() -> None:
    # Rows written by older code carry a shard; new rows only the queue: both follow the count.
    for stored in ("workflow.tasks.http", "workflow.tasks.http.7", "workflow.tasks.http.0"):
        assert route_stream(stored, "t8", 2) == task_stream("http", shard_for("t8", 2))
        assert route_stream(stored, "t8", 5) == task_stream("http", shard_for("t8", 5))
    assert route_stream("workflow.tasks.http.3", "t8", 1) == "workflow.tasks.http.0"


@pytest.mark.parametrize(
    "other",
    [
        *("workflow.tasks", "custom.stream", "workflow.dead.http", "", "workflow.cancel.runs"),
        *("composer:limits:{q}", "composer:stream_shards", "workflow.tasks.q\n"),
        "workflow.tasks.q.\u0661",  # a digit, but not an ASCII one (the schema's [0-9])
    ],
)
def test_route_refuses_streams_that_are_not_task_queues(other: str) -> None:
    with pytest.raises(NotATaskStream, match="is not a task stream"):
        route_stream(other, "t8", 4)


def test_queue_stream_is_the_unsharded_name_and_routes_back() -> None:
    assert queue_stream("http") == "workflow.tasks.http"
    assert queue_of_stream("workflow.tasks.http") == "http"
    assert queue_of_stream("workflow.tasks.http.12") == "http"
    assert queue_of_stream("workflow.tasks") is None
    assert queue_of_stream("workflow.tasks.a.b") is None


@pytest.mark.parametrize("bad", ["orders.1", "orders.12", "a.0"])
def test_queue_names_ending_in_a_shard_number_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidQueueName, match="invalid queue name"):
        queue_stream(bad)


@settings(max_examples=200)
@given(st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True), st.text(), st.integers(1, 64))
def test_route_is_stable_and_in_range(queue: str, task_id: str, shards: int) -> None:
    routed = route_stream(queue_stream(queue), task_id, shards)
    assert parse_task_stream(routed) == (queue, shard_for(task_id, shards))


@settings(max_examples=300, deadline=None)
@given(
    stream=st.sampled_from(
        [
            "workflow.tasks.q",
            "workflow.tasks.q.3",
            "workflow.tasks.a-b_c.12",
            "custom.stream",
            "workflow.tasks.",
            "workflow.tasks.bad queue",
            "workflow.tasks.ü",
            "",
        ]
    )
    | st.text(max_size=30),
    task_id=st.text(max_size=40),
    shards=st.integers(min_value=0, max_value=64),
)
def test_router_routes_as_route_stream_for_every_row(
    stream: str, task_id: str, shards: int
) -> None:
    queue = queue_of_stream(stream)
    route = Router(shards)
    if queue is None:
        for _twice in range(2):  # and again, not from a cache
            with pytest.raises(NotATaskStream):
                route(stream, task_id)
        return
    want = task_stream(queue, shard_for(task_id, shards))
    assert route(stream, task_id) == want
    assert route(stream, task_id) == want  # again, from its cache
    assert route_stream(stream, task_id, shards) == want
