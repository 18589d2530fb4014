"""The paper's benchmark table (Fleuret 2025, arXiv 2510.17558, Tables 1-3) as the tables read
it: its four row groups, the metric the paper reports per row, and what this suite reports for
that row. Every fact here is a row of common/benchmarks.py (the one place a benchmark is
written); this module only hands them out in the shape the tables take.

PAPER_GROUPS maps group -> rows in the paper's order. Each row:
- "benchmark": the paper's row name;
- "paper_metric": the paper's metric for the row (pass@1, em, acc_char, acc_completion,
  macro_avg/acc_char). acc_char: accuracy with each choice's log-likelihood divided by its length
  in characters; acc_completion: accuracy with each choice's log-likelihood normalised by that
  of the completion alone (an unconditional baseline); em: exact match;
- "task": the task this suite runs for the row (lm-eval stock name, or the evalplus task), None
  when the suite cannot run it;
- "stock_metrics": the metrics the stock task computes (lm-eval 0.4.13 YAML `metric_list`, or
  evalplus), as result-file keys;
- "metric": the metric the report shows for the row: the stock metric that is the paper's where
  one exists, else the closest stock one;
- "matches_paper": True when "metric" is the paper's metric (possibly under another name),
  False when it is only the closest stand-in; the report must mark those rows;
- "note": why, when it is not a plain match; offline data limits (TriviaQA partial, RACE
  online only).

Caveat (PAPER_METRICS_CHECKED = False): the paper_metric column was transcribed from the paper's
tables from memory, without the PDF at hand. A check against the paper's extracted text was
attempted (issue 16) and could not be completed: the stored copies reachable from this project
return only the opening of the paper, not Tables 1-2. What the search did confirm is only the
vocabulary (Meta's model cards use exactly `macro_avg/acc_char` for MMLU, `acc_char` for
CommonSenseQA, WinoGrande and ARC-Challenge, `em` for TriviaQA, `pass@1` for MBPP), not this
paper's per-row choices. Check each row against Tables 1-2 of arXiv 2510.17558 before quoting
it, then set the flag (in common/benchmarks.py).
"""

from __future__ import annotations

from typing import Any

from common import benchmarks

PAPER_METRICS_CHECKED = benchmarks.PAPER_METRICS_CHECKED
TRIVIAQA_PARTIAL = benchmarks.TRIVIAQA_PARTIAL

PAPER_GROUPS: dict[str, list[dict[str, Any]]] = {
    group: [b.paper_row() for b in rows] for group, rows in benchmarks.by_group().items()}


def group_of(task: str) -> str | None:
    """The paper group a suite task belongs to (None for tasks outside the paper's table)."""
    for group, rows in PAPER_GROUPS.items():
        if any(r["task"] == task for r in rows):
            return group
    return None


def row_of(task: str) -> dict[str, Any] | None:
    for rows in PAPER_GROUPS.values():
        for r in rows:
            if r["task"] == task:
                return r
    return None
