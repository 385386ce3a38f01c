"""What one hop between processes costs on this machine: the bound under the idle figures.

An idle dispatch crosses processes several times before a reader sees it
(application -> PostgreSQL -> the listener -> the enqueuer -> Redis -> the
reader); the NOTIFY receipt floor crosses fewer. Each crossing wakes a process
that was asleep, and on a virtual machine a CPU that was idle takes a while to
wake. This measures one round trip to the benchmark's Redis (``PING``) and to
PostgreSQL (``SELECT 1``) from a plain socket, back to back (both sides awake)
and 20 ms apart (as the idle probe paces its dispatches): the difference is
what each cold hop adds to an idle dispatch, whatever the product does.
"""

from __future__ import annotations

import socket
import statistics
import time
from urllib.parse import urlsplit

import psycopg

from benchmarks.env import BenchEnv

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


def round_trips(env: BenchEnv, gap: float) -> dict[str, float]:
    """Median round trips (µs) to Redis and PostgreSQL, ``gap`` seconds apart."""
    return {
        "redis_rtt_us": statistics.median(_redis_rtts(env.redis_url, gap)) * 1e6,
        "postgres_rtt_us": statistics.median(_postgres_rtts(env.db_url, gap)) * 1e6,
    }
