"""``make bench-peers``: outbox-dispatcher beside River, procrastinate and Celery.

Each system runs as its users run it, in its own processes (River from its Go module,
procrastinate and Celery from venvs of their own, never the project's), on the same
PostgreSQL and a Redis of the benchmark's own. The harness (``python -m benchmarks.peers``)
runs the scenarios interleaved, reads the CPU every process of a system spent (its PostgreSQL
backends and Redis included, the producer processes not), and writes
``benchmarks/results/peers.json`` and ``peers.png``. ``record`` notes when a handler starts;
``produce`` is the Python systems' producer.
"""
