"""The paper's benchmark table (Fleuret 2025, arXiv 2510.17558, Tables 1-3) in the shape the
tables read it: group -> rows in the paper's order, each a row of common/benchmarks.py (the one
place a benchmark is written; its `paper_row` says what each key means, and its
PAPER_METRICS_CHECKED flag whether the paper's metric per row was checked against the PDF).
"""

from __future__ import annotations

from typing import Any

from common import benchmarks

PAPER_GROUPS: dict[str, list[dict[str, Any]]] = {
    group: [b.paper_row() for b in rows] for group, rows in benchmarks.by_group().items()}
