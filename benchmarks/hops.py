"""What one hop between processes costs on this machine: the bound under the idle figures.

An idle dispatch crosses processes several times before a reader sees it
(application -> PostgreSQL -> the listener -> the enqueuer -> Redis -> the
reader); the NOTIFY receipt floor crosses fewer. Each crossing wakes a process
that was asleep, and on a virtual machine a CPU that was idle takes a while to
wake. This measures one round trip to the benchmark's Redis (``PING``) and to
PostgreSQL (``SELECT 1``) from a plain socket, back to back (both sides awake)
and 20 ms apart (as the idle probe paces its dispatches): the difference is
what each cold hop adds to an idle dispatch, whatever the product does.

``publish_to_reader_us`` is the last hop of every relay: an XADD of the idle
probe's realistic entry (``workload.dispatch``'s fields) written by another
process (a plain socket, stamped with its send time) until the idle probe's
own reader (a thread blocked on XREAD, ``probe.Receivers``) has it.
The NOTIFY receipt floor plus this hop is what a relay that publishes after
its notification cannot beat, with no work of its own at all.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

import psycopg
import redis as sync_redis

from benchmarks.env import BenchEnv
from benchmarks.workload import dispatch
from dispatcher.models import payload_fields

SAMPLES = 300
GAP = 0.02  # the idle probe's pace


def _redis_rtts(url: str, gap: float) -> list[float]:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(SAMPLES):
            if gap:
                time.sleep(gap)
            started = time.perf_counter()
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            s.recv(64)
            rtts.append(time.perf_counter() - started)
    return rtts


def _postgres_rtts(url: str, gap: float) -> list[float]:
    with psycopg.connect(url, autocommit=True) as conn:
        rtts = []
        for _ in range(SAMPLES):
            if gap:
                time.sleep(gap)
            started = time.perf_counter()
            conn.execute("SELECT 1", prepare=True)
            rtts.append(time.perf_counter() - started)
    return rtts


# The writer: for each line on stdin, wait ``gap``, XADD the entry with its send time, read
# the reply. argv: host, port, gap, the entry's other fields as a JSON list of pairs.
_WRITER = """
import json, socket, sys, time
host, port, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
pairs = [x.encode() for pair in json.loads(sys.argv[4]) for x in pair]
def command(args):
    out = [b"*%d\\r\\n" % len(args)]
    for a in args:
        out.append(b"$%d\\r\\n%s\\r\\n" % (len(a), a))
    return b"".join(out)
with socket.create_connection((host, port)) as s:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in sys.stdin:
        if gap:
            time.sleep(gap)
        sent = repr(time.perf_counter()).encode()
        s.sendall(command([b"XADD", b"hops", b"*", b"sent", sent, *pairs]))
        s.recv(64)
"""


def _entry_fields() -> str:
    """The fields of the idle probe's entry (its payload's, as the enqueuer publishes them)."""
    d = dispatch(str(uuid.uuid4()), "hops")
    return json.dumps(list(payload_fields(json.dumps(d.payload()), str(uuid.uuid4())).items()))


def _publish_to_reader(url: str, gap: float) -> list[float]:
    """XADD (another process) -> a reader thread blocked on XREAD has it, as the probe reads."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", str(parts.port or 6379)
    client = sync_redis.Redis.from_url(url, decode_responses=True)
    client.delete("hops")
    arrived: list[float] = []
    done = threading.Event()
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, host, port, str(gap), _entry_fields()],
        stdin=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None
    feed = writer.stdin

    def read() -> None:
        last = "0-0"
        while len(arrived) < SAMPLES:
            feed.write("\n")
            feed.flush()
            reply = client.xread({"hops": last}, block=5000, count=1)
            if not reply:
                break
            now = time.perf_counter()
            last, fields = reply[0][1][0]
            arrived.append(now - float(fields["sent"]))
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        done.wait(SAMPLES * (gap + 1.0))
    finally:
        feed.close()
        reader.join()
        writer.wait(10)
        client.close()
    if len(arrived) < SAMPLES:
        raise RuntimeError(f"the reader had {len(arrived)} of {SAMPLES} entries")
    return arrived


def round_trips(env: BenchEnv, gap: float) -> dict[str, float]:
    """Median round trips (µs) to Redis and PostgreSQL, ``gap`` seconds apart; and the
    median XADD -> blocked XREAD reader hop."""
    return {
        "redis_rtt_us": statistics.median(_redis_rtts(env.redis_url, gap)) * 1e6,
        "postgres_rtt_us": statistics.median(_postgres_rtts(env.db_url, gap)) * 1e6,
        "publish_to_reader_us": statistics.median(_publish_to_reader(env.redis_url, gap)) * 1e6,
    }
