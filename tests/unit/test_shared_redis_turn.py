"""Test sessions on one Redis take turns (its DB numbers are only unique within a session)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.fix_redis import shared_redis_turn

URL = "redis://127.0.0.1:65000"  # never connected to: the lock is named after the address

HOLDER = textwrap.dedent(f"""
    import sys
    from tests.fix_redis import shared_redis_turn
    with shared_redis_turn({URL!r}) as mine:
        print(mine, flush=True)
        sys.stdin.read()  # until the test closes it
""")


def test_a_second_session_on_the_same_redis_waits_for_the_first() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "True"
        with shared_redis_turn(URL, wait=False) as mine:
            assert mine is False, "taken while another session holds it"
        with shared_redis_turn("redis://127.0.0.1:65001", wait=False) as other:
            assert other is True, "another Redis is another turn"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
    with shared_redis_turn(URL, wait=False) as mine:
        assert mine is True, "free once the holder ended"
