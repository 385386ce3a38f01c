"""The shard key's owner marker, read: never trusted, never a crash."""

from __future__ import annotations

import pytest

from dispatcher.controller.identity import Owner
from dispatcher.controller.shard_owner import ShardKeyOwner, judge

ME = Owner(name="orders", namespace="shop", uid="u-1")


def test_no_marker_is_free_and_our_own_is_mine() -> None:
    assert judge(None, me=ME) == ("free", None)
    mine = ShardKeyOwner.of(ME)
    assert judge(mine.text(), me=ME) == ("mine", mine)
    assert judge(mine.text().encode(), me=ME) == ("mine", mine)


@pytest.mark.parametrize(
    "other",
    [
        Owner(name="payments", namespace="shop", uid="u-2"),
        Owner(name="orders", namespace="shop", uid="u-0"),  # deleted and created again
        Owner(name="orders", namespace="other", uid="u-1"),
    ],
)
def test_another_resource_is_foreign(other: Owner) -> None:
    assert judge(ShardKeyOwner.of(other).text(), me=ME) == ("foreign", ShardKeyOwner.of(other))


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xff\xfe", "not json", "[]", "{}", '{"namespace": "shop", "name": "orders"}',
     '{"namespace": "shop", "name": "orders", "uid": "u-1", "extra": 1}',
     '{"namespace": "", "name": "orders", "uid": "u-1"}', "x" * 100_000],
)  # fmt: skip
def test_anything_else_is_unreadable(raw: str | bytes) -> None:
    assert judge(raw, me=ME) == ("unreadable", None)
