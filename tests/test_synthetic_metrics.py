"""Validity and agreement metrics of the synthetic experiment on hand-made sequences."""

from __future__ import annotations

import pytest

from analysis.synthetic import group_metrics, parse_body


def body(start: int | None, letter: str = "T", noise: tuple[int, ...] = (),
         run: int = 8) -> str:
    b = ["_"] * 64
    if start is not None:
        b[start:start + run] = [letter] * run
    for i in noise:
        b[i] = "!"
    return "".join(b)


@pytest.mark.parametrize("text,valid,start", [
    (body(0), True, 0),
    (body(56), True, 56),
    (body(20), True, 20),
    (body(20, noise=(20,)), True, 20),  # noise on the run's first letter: still one run
    (body(20, noise=(27, 3, 50)), True, 20),  # noise on the last letter and elsewhere
    (body(20, noise=tuple(range(21, 27))), True, 20),  # six of eight letters noised
    (body(20, run=7), False, None),  # a run of 7 with '_' both sides
    (body(20, run=9), False, None),  # a run of 9
    (body(20, run=7, noise=(27,)), True, 20),  # 7 letters + noise where the 8th was
    (body(20, run=7, noise=(19,)), True, 19),  # ... noise before the letters
    (body(None), False, None),  # no run at all
    (body(5)[:40] + body(40)[40:], False, None),  # two runs
    (body(20, letter="Q"), False, None),  # the wrong letter
    (body(20)[:30] + "Q" + body(20)[31:], False, None),  # a foreign letter
    (body(20)[:63], False, None),  # too short
    (body(20) + "_", False, None),  # too long
    (body(20)[:35] + ">" + body(20)[36:], False, None),  # a character outside the task
])
def test_parse_body(text: str, valid: bool, start: int | None) -> None:
    p = parse_body(text, "T")
    assert (p.valid, p.start) == (valid, start)


def test_noise_set() -> None:
    p = parse_body(body(10, noise=(1, 2, 12)), "T")
    assert p.noise == frozenset({1, 2, 12})


def rec(prompt: int, group: int, kind: str, text: str, row: int = 0) -> dict:
    return {"prompt_idx": prompt, "group": group, "group_kind": kind, "text": text,
            "letter": "T", "row": row}


def test_group_metrics_known_answers() -> None:
    s = [
        # per-sequence group: starts 0, 0, 30 -> pairs agree 1 of 3
        rec(0, 0, "per_sequence", body(0)), rec(0, 0, "per_sequence", body(0)),
        rec(0, 0, "per_sequence", body(30)),
        # shared group 1: starts 5, 5, one invalid (noise {1} everywhere)
        rec(0, 1, "shared", body(5, noise=(1,))), rec(0, 1, "shared", body(5, noise=(1,))),
        rec(0, 1, "shared", body(None, noise=(1,))),
        # shared group 2: starts 40, 40
        rec(0, 2, "shared", body(40)), rec(0, 2, "shared", body(40, noise=(2,))),
        # another prompt's shared group, same start as group 1: not compared across prompts
        rec(1, 1, "shared", body(5)),
    ]
    m = group_metrics(s)
    assert m["n_samples"] == 9
    assert m["validity"] == pytest.approx(8 / 9)
    assert m["pos_agree_per_seq"] == pytest.approx(1 / 3)
    # within: group 1 one valid pair (agree), group 2 one pair (agree), prompt 1 no pair
    assert m["pos_agree_within"] == 1.0 and m["n_pairs_within"] == 2
    # across (same prompt only): 2 valid x 2 valid pairs of groups 1 and 2, none agree
    assert m["pos_agree_across"] == 0.0 and m["n_pairs_across"] == 4
    # noise within: group 1 three pairs of {1}: 1.0; group 2 {} vs {2}: 0 -> mean 3/4
    assert m["noise_jaccard_within"] == pytest.approx(3 / 4)
    # across: group 1 {1} x3 against group 2 {} and {2}: all 0
    assert m["noise_jaccard_across"] == 0.0
    assert m["noise_jaccard_per_seq"] == 1.0
    assert m["noise_rate"] == pytest.approx(4 / (9 * 64))  # three {1} and one {2}


def test_group_metrics_empty_pairs_are_none() -> None:
    m = group_metrics([rec(0, 0, "per_sequence", body(3))])
    assert m["pos_agree_within"] is None and m["pos_agree_across"] is None
    assert m["validity"] == 1.0


def test_acceptance_needs_every_arm_to_call_a_fail():
    import pandas as pd

    from analysis.synthetic import acceptance

    def table(kappas_gaps: dict[float, float]) -> pd.DataFrame:
        rows = [{"arm": "baseline", "kappa_bits": float("nan"), "validity": 0.9,
                 "pos_agree_within": 0.02, "pos_agree_across": 0.02}]
        rows += [{"arm": "free", "kappa_bits": k, "validity": 0.9,
                  "pos_agree_within": 0.02 + g, "pos_agree_across": 0.02}
                 for k, g in kappas_gaps.items()]
        return pd.DataFrame(rows)

    def middle(df: pd.DataFrame) -> str:
        return next(c for c in acceptance(df) if c["check"].startswith("1/8 or 1"))["result"]

    assert middle(table({1 / 8: 0.0})) == "n/a"  # the 1-bit arm was not run: cannot fail
    assert middle(table({1 / 8: 0.0, 1.0: 0.0})) == "fail"
    assert middle(table({1 / 8: 0.0, 1.0: 0.2})) == "pass"
    assert middle(table({1 / 8: 0.15})) == "pass"
