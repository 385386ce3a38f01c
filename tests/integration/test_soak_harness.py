"""The soak benchmark's short form: its harness runs, samples and delivers everything it commits.

``make soak`` runs it for 30 minutes; here it runs for a few seconds so CI keeps
the harness working. Figures are not asserted (they are recorded by the long run).
"""

from __future__ import annotations

from benchmarks.soak import Load, flatness, render, run


def test_the_soak_harness_samples_both_variants_and_delivers_what_it_commits() -> None:
    load = Load(rate=50, burst_rows=500, burst_every=4)
    results = run(minutes=0.15, load=load, sample_every=3)
    assert set(results) == {"enqueuer", "autovacuum only"}
    for samples in results.values():
        assert len(samples) >= 2
        last = samples[-1]
        assert last.committed >= 500, "the burst was committed"
        assert last.delivered > 0, "the reader saw the enqueuer's entries"
        assert last.table_kb > 0
        assert last.claim_ms >= 0
    text = render(results, command="test", load=load)
    assert "## enqueuer" in text
    assert "## autovacuum only" in text
    assert set(flatness(results["enqueuer"])) == {"table_kb", "index_kb", "claim_ms", "p99_ms"}
