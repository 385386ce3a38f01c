"""hiredis command packing: the same bytes on the wire and the same errors as redis-py's own."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from dispatcher.redis_connection import HiredisConnection

arguments = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    st.binary(),
    st.integers(),
    st.floats(allow_nan=False),
)


def both(*args: Any, **connection: Any) -> tuple[Any, Any]:
    return (
        HiredisConnection(**connection).pack_command(*args),
        Connection(**connection).pack_command(*args),
    )


@given(
    name=st.sampled_from(["XADD", "XINFO STREAM", b"CONFIG GET", b"SET"]), args=st.lists(arguments)
)
def test_packing_matches_redis_py_byte_for_byte(name: str | bytes, args: list[Any]) -> None:
    fast, python = both(name, *args)
    assert b"".join(fast) == b"".join(python)


@pytest.mark.parametrize("bad", [True, None, object()])
def test_arguments_redis_py_refuses_are_still_refused(bad: Any) -> None:
    with pytest.raises(DataError):
        HiredisConnection().pack_command("SET", "k", bad)


def test_bytes_like_and_other_encodings_fall_back_to_the_same_bytes() -> None:
    fast, python = both("SET", bytearray(b"k"), memoryview(b"v"))
    assert b"".join(fast) == b"".join(bytes(p) for p in python)
    fast, python = both("SET", "k", "é", encoding="latin-1")
    assert b"".join(fast) == b"".join(python) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"
