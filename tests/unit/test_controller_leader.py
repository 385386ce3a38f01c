"""Leader election's pure parts: what a candidate does with the Lease it read, and the
``Leadership`` the operator's loops wait on (a pass cancelled when leadership goes)."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.controller.leadership import Leadership, NotLeading
from dispatcher.controller.lease_election import LeaseRecord, decide

ME, PEER = "operator-a", "operator-b"


def record(holder: str | None, *, duration: float = 15) -> LeaseRecord:
    return LeaseRecord(holder=holder, duration=duration, transitions=3, resource_version="42")


def test_a_lease_is_read_from_the_api_servers_json() -> None:
    lease = {
        "metadata": {"name": "op", "resourceVersion": "7"},
        "spec": {"holderIdentity": PEER, "leaseDurationSeconds": 15, "leaseTransitions": 2,
                 "acquireTime": "2026-12-05T00:00:00.000000Z"},
    }  # fmt: skip
    assert LeaseRecord.from_api(lease) == LeaseRecord(
        holder=PEER, duration=15, transitions=2, resource_version="7",
        acquired="2026-12-05T00:00:00.000000Z",
    )  # fmt: skip
    assert LeaseRecord.from_api({"metadata": {"resourceVersion": "8"}}).holder is None


@pytest.mark.parametrize(
    "lease",
    [
        [],
        {"spec": {}},  # no metadata
        {"metadata": {}, "spec": "holder"},
        {"metadata": {}, "spec": {"leaseDurationSeconds": "long"}},
        {"metadata": {}, "spec": {"leaseTransitions": [1]}},
    ],
)
def test_a_malformed_lease_is_a_clear_error(lease: object) -> None:
    """Whoever else may write the Lease: garbage is a ValueError the loop logs, not a crash."""
    with pytest.raises(ValueError, match="Lease"):
        LeaseRecord.from_api(lease)


def test_no_lease_is_created() -> None:
    assert decide(None, me=ME, leading=False, now=100, observed_at=100) == "create"


def test_the_leader_renews_its_own_lease() -> None:
    assert decide(record(ME), me=ME, leading=True, now=100, observed_at=99) == "renew"


def test_a_peers_lease_is_respected_until_it_was_unchanged_for_its_duration() -> None:
    assert decide(record(PEER), me=ME, leading=False, now=114.9, observed_at=100) == "wait"
    assert decide(record(PEER), me=ME, leading=False, now=115, observed_at=100) == "take"


def test_a_lease_without_holder_is_taken_at_once() -> None:
    assert decide(record(None), me=ME, leading=False, now=100, observed_at=100) == "take"


def test_a_restarted_process_waits_even_for_a_lease_that_bears_its_name() -> None:
    """It cannot tell whether an earlier process of its pod still acts (nor can its peer, who
    saw the last renewal earlier and so takes over first after a crash)."""
    assert decide(record(ME), me=ME, leading=False, now=105, observed_at=100) == "wait"
    assert decide(record(ME), me=ME, leading=False, now=115, observed_at=100) == "take"


def test_a_leader_that_finds_another_holder_does_not_renew() -> None:
    assert decide(record(PEER), me=ME, leading=True, now=100, observed_at=100) == "wait"


async def test_a_pass_runs_while_leading_and_is_cancelled_when_leadership_goes() -> None:
    leadership = Leadership()
    with pytest.raises(NotLeading):
        await leadership.run(asyncio.sleep(0))
    leadership.gain()
    assert leadership.term == 1
    assert await leadership.run(asyncio.sleep(0, result="done")) == "done"
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def long_pass() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    running = asyncio.create_task(leadership.run(long_pass()))
    await started.wait()
    leadership.lose()
    with pytest.raises(NotLeading):
        await running
    assert cancelled.is_set()
    waiting = asyncio.create_task(leadership.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    leadership.gain()
    await waiting
    assert leadership.term == 2


async def test_without_election_a_replica_always_leads() -> None:
    leadership = Leadership.always()
    await leadership.wait()
    assert await leadership.run(asyncio.sleep(0, result=1)) == 1
