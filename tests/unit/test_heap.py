"""The collector settings of a long-lived process (``dispatcher.heap``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from dispatcher.heap import YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("collector")
def test_settle_heap_freezes_start_up_and_makes_young_collections_rarer() -> None:
    gc.set_threshold(700, 10, 10)
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("collector")
def test_settle_heap_still_collects_cycles() -> None:
    settle_heap()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2


@pytest.mark.usefixtures("collector")
def test_settle_heap_keeps_a_higher_threshold_set_before() -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 2, 10, 10)
    settle_heap()
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD * 2
