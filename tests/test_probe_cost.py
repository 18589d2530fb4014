"""What the probe and the synthetic runs record beside a wall time (docs/PROBE.md's cost table
is written from such a record by dev/probe_cost.py)."""

from __future__ import annotations


def test_load_and_memory_are_recorded_or_null() -> None:
    from common.provenance import loadavg, peak_rss_mb

    la, rss = loadavg(), peak_rss_mb()
    assert la is None or (len(la) == 3 and all(x >= 0 for x in la))
    assert rss is None or 10 < rss < 1e6  # MB: this test process, python and torch loaded
