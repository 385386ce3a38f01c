"""procrastinate's app for the peer benchmark: one no-op task (its own venv runs this)."""

from __future__ import annotations

import os

import procrastinate

from benchmarks.peers.record import note

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("PEERS_DATABASE_URL", ""))
)


@app.task(name="noop")
async def noop(task: str) -> None:
    note(task)
