"""Parsing the published shard count."""

from __future__ import annotations

import pytest

from dispatcher.stream import InvalidShardCount, parse_shard_count


@pytest.mark.parametrize(("raw", "expected"), [("4", 4), (b"16", 16), (" 8 ", 8), (1, 1)])
def test_valid_counts(raw: str | bytes | int, expected: int) -> None:
    assert parse_shard_count(raw) == expected


@pytest.mark.parametrize("raw", ["0", "-2", "four", "", "4.5", b"\x00"])
def test_invalid_counts_name_the_key(raw: str | bytes) -> None:
    with pytest.raises(InvalidShardCount, match="composer:stream_shards must be an integer >= 1"):
        parse_shard_count(raw)
