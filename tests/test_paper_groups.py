"""The paper's four groups and 16 rows, and the stock metrics claimed for each row."""

from __future__ import annotations

from pathlib import Path

import yaml

from analysis.paper_groups import PAPER_GROUPS
from experiments.eval.tasks import STOCK, stock_yaml


class _Loader(yaml.SafeLoader):
    """Stock YAMLs carry `!function` tags; their metric names are plain strings."""


_Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def _stock_cfg(path: Path) -> dict:
    """A stock YAML with its `include:` chain resolved (the includer's keys win)."""
    cfg = yaml.load(path.read_text(), Loader=_Loader)
    if "include" in cfg:
        cfg = _stock_cfg(path.parent / cfg.pop("include")) | cfg
    return cfg


def test_four_groups_sixteen_rows_in_paper_order() -> None:
    assert list(PAPER_GROUPS) == ["Generative code/math",
                                  "Multi-choice general knowledge / common sense",
                                  "Multi-choice text understanding", "Culture"]
    names = [r["benchmark"] for rows in PAPER_GROUPS.values() for r in rows]
    assert names == ["HumanEval+", "MBPP", "GSM8K", "MMLU", "CSQA", "HellaSwag", "WinoGrande",
                     "OBQA", "ARC-E", "ARC-C", "PIQA", "RACE-high", "RACE-middle", "BoolQ",
                     "NQ", "TriviaQA"]
    rows = {r["task"]: (g, r) for g, rs in PAPER_GROUPS.items() for r in rs}
    assert rows["piqa"][0] == "Multi-choice general knowledge / common sense"
    assert "gsm8k_gold_bpb" not in rows and rows["race"][1]["benchmark"] == "RACE-high"
    assert "partial (7,993 of 17,944)" in rows["triviaqa"][1]["note"]


def test_stock_metrics_are_the_stock_yamls() -> None:
    paths = {"mmlu": STOCK / "mmlu" / "default" / "_default_template_yaml",
             "race": STOCK / "race" / "race.yaml"}
    for rows in PAPER_GROUPS.values():
        for r in rows:
            if r["task"] is None:
                assert r["metric"] is None and not r["matches_paper"]
                continue
            assert r["metric"] in r["stock_metrics"], r["benchmark"]
            if r["task"] in ("humaneval_plus", "mbpp_plus"):
                continue  # evalplus, not lm-eval
            cfg = _stock_cfg(paths.get(r["task"]) or stock_yaml(r["task"]))
            stock = [m["metric"] for m in cfg["metric_list"]]
            filters = [f["name"] for f in cfg.get("filter_list", [])] or ["none"]
            want = [m if f == "none" else f"{m},{f}" for m in stock for f in filters]
            assert r["stock_metrics"] == want, r["benchmark"]
