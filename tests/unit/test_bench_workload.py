"""The benchmark's workload: payload sizes as the figures say, and the profile's folding."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from benchmarks.profile import self_time
from benchmarks.workload import LARGE, SMALL, TINY, dispatch, payload_size, sized_dispatch


def test_payloads_have_the_sizes_the_figures_name() -> None:
    assert payload_size(dispatch(str(uuid.uuid4()), "orders")) == 432
    assert payload_size(sized_dispatch("orders-12345", "orders", SMALL)) == SMALL
    assert payload_size(sized_dispatch("orders-12345", "orders", LARGE)) == LARGE
    assert payload_size(sized_dispatch("t1", "orders", TINY)) < 200
    assert json.loads(sized_dispatch("t", "orders", LARGE).input)["items"]


def test_self_time_folds_lines_of_one_function(tmp_path: Path) -> None:
    raw = tmp_path / "raw.1"
    raw.write_text(
        "main (a.py:1);f (b.py:10) 3\nmain (a.py:1);f (b.py:12) 2\nmain (a.py:1);g (c.py:5) 1\n"
    )
    assert self_time([raw, tmp_path / "missing"]) == {"f (b.py)": 5, "g (c.py)": 1}


def test_self_time_leaves_out_threads_blocked_in_a_wait(tmp_path: Path) -> None:
    """py-spy --native counts a thread blocked in poll() as busy: not the product's time."""
    raw = tmp_path / "raw.1"
    raw.write_text(
        "listen (l.py:3);poll (libc.so.6) 30\n"
        "run (a.py:1);epoll_wait (libc.so.6) 2\n"
        "run (a.py:1);send (libc.so.6) 4\n"
        "run (a.py:1);pollster (p.py:2) 1\n"
    )
    assert self_time([raw]) == {
        "epoll_wait (libc.so.6)": 2,
        "send (libc.so.6)": 4,
        "pollster (p.py)": 1,
    }
