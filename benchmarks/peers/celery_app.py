"""Celery's app for the peer benchmark: one no-op task, Redis broker, no results kept."""

from __future__ import annotations

import os

from celery import Celery

from benchmarks.peers.record import note

app = Celery("peers", broker=os.environ.get("PEERS_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.task_ignore_result = True


@app.task(name="noop")
def noop(task: str) -> None:
    note(task)
