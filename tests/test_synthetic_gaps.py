"""Issue 38: every gap of the synthetic experiment carries a jackknife interval over the shared
Z groups and a one-sided permutation p, each checked here against an independent computation
(group_metrics on relabelled or reduced samples), plus the validity difference, CE's interval,
the committed-samples path and the evaluation's per-sequence CE."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from pathlib import Path

import calibration as C
import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sps

from analysis import synthetic as SY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def planted(enc: float, seed: int = 0) -> list[dict]:
    """calibration's planted samples (3 prompts x (1 + 4 shared groups) x 6 rows, 10% invalid):
    each shared group's rows take its start / noise with probability ~ Beta(50 enc, 50 - 50 enc)."""
    return C.planted_samples(np.random.default_rng(seed), 50 * enc, 50 - 50 * enc, n_prompts=3,
                             rows=6)


def gaps_by_group_metrics(samples: list[dict]) -> tuple[float, float]:
    m = SY.group_metrics(samples)
    return (m["pos_agree_within"] - m["pos_agree_across"],
            m["noise_jaccard_within"] - m["noise_jaccard_across"])


@pytest.mark.parametrize("enc", [0.0, 0.3, 0.9])
def test_gaps_and_jackknife_match_group_metrics(enc: float) -> None:
    s = planted(enc, seed=int(enc * 10))
    g = SY.gap_tests(s, n_perm=99)
    pos, noise = gaps_by_group_metrics(s)
    assert g["pos_gap"] == pytest.approx(pos, abs=1e-12)
    assert g["noise_gap"] == pytest.approx(noise, abs=1e-12)
    assert g["n_groups"] == 12 and g["n_rows"] == 72
    # the jackknife, recomputed by dropping each shared group's rows and re-measuring
    shared = sorted({(r["prompt_idx"], r["group"]) for r in s if r["group"]})
    loo = np.array([gaps_by_group_metrics([r for r in s if (r["prompt_idx"], r["group"]) != k])
                    for k in shared])
    n = len(shared)
    for j, kind in enumerate(("pos", "noise")):
        se = math.sqrt((n - 1) / n * ((loo[:, j] - loo[:, j].mean()) ** 2).sum())
        half = sps.t.ppf(0.975, n - 1) * se
        centre = (pos, noise)[j]
        assert g[f"{kind}_lo"] == pytest.approx(max(-1, centre - half), abs=1e-12)
        assert g[f"{kind}_hi"] == pytest.approx(min(1, centre + half), abs=1e-12)


def test_permutation_p_matches_relabelled_group_metrics() -> None:
    """The same shuffles (same seed, same draw order), applied to the samples' group labels
    and measured by group_metrics, give the same p."""
    s = planted(0.2, seed=5)
    n_perm, seed = 99, 7
    g = SY.gap_tests(s, n_perm=n_perm, seed=seed)
    pos, noise = gaps_by_group_metrics(s)
    rng = np.random.default_rng(seed)
    by_prompt: dict[int, list[dict]] = {}
    for r in s:
        if r["group_kind"] == "shared":
            by_prompt.setdefault(r["prompt_idx"], []).append(r)
    shuffled = {}
    for p in sorted(by_prompt):
        groups = sorted({r["group"] for r in by_prompt[p]})
        labels = np.array([groups.index(r["group"]) for r in by_prompt[p]])
        shuffled[p] = (groups, rng.permuted(np.tile(labels, (n_perm, 1)), axis=1))
    hits = np.zeros(2)
    for i in range(n_perm):
        relabelled = [dict(r, group=shuffled[p][0][shuffled[p][1][i, j]])
                      for p in sorted(by_prompt) for j, r in enumerate(by_prompt[p])]
        pg, ng = gaps_by_group_metrics(relabelled)
        hits += [pg >= pos - 1e-12, ng >= noise - 1e-12]
    assert g["pos_p"] == pytest.approx((1 + hits[0]) / (1 + n_perm))
    assert g["noise_p"] == pytest.approx((1 + hits[1]) / (1 + n_perm))


def test_gap_without_pairs_is_none() -> None:
    s = [r | {"text": "_" * 64} for r in planted(0.5)]  # nothing valid: no position pair
    g = SY.gap_tests(s, n_perm=19)
    assert g["pos_gap"] is None and g["pos_lo"] is None and g["pos_p"] is None
    assert g["noise_gap"] is not None and g["n_pos_within"] == 0


def test_validity_difference_and_ce_interval() -> None:
    ft = planted(0.5, seed=2)
    base = planted(0.0, seed=3)
    for i, r in enumerate(ft):  # every row of prompt 0, group 1 invalid
        if r["prompt_idx"] == 0 and r["group"] == 1:
            ft[i] = r | {"text": "_" * 64}
    out = SY.validity_diff(ft, base)

    def jack(smp: list[dict]) -> tuple[float, float, int]:
        keys = sorted({(r["prompt_idx"], r["group"]) for r in smp})
        val = [SY.parse_body(r["text"], "T").valid for r in smp]
        v = float(np.mean(val))
        loo = np.array([np.mean([x for r, x in zip(smp, val, strict=True)
                                 if (r["prompt_idx"], r["group"]) != k]) for k in keys])
        n = len(keys)
        return v, (n - 1) / n * float(((loo - loo.mean()) ** 2).sum()), n

    v, var, n = jack(ft)
    vb, varb, nb = jack(base)
    half = sps.t.ppf(0.975, min(n, nb) - 1) * math.sqrt(var + varb)
    assert out["validity_diff"] == pytest.approx(v - vb)
    assert out["validity_diff_lo"] == pytest.approx(v - vb - half)
    assert out["validity_diff_hi"] == pytest.approx(v - vb + half)
    lo, hi = SY.ce_interval({"ce_prior": 0.3, "ce_prior_sd": 0.08, "n_eval": 512})
    h = sps.t.ppf(0.975, 511) * 0.08 / math.sqrt(512)
    assert (lo, hi) == pytest.approx((0.3 - h, 0.3 + h))
    assert SY.ce_interval({"ce_prior": 0.3, "n_eval": 512}) == (None, None)  # not recorded


def test_evaluate_records_the_per_sequence_sd() -> None:
    """CE with prior Z is unchanged (the mean of per-sequence CEs, every sequence scoring 64
    characters, equals the CE over all characters), and its SD over sequences is recorded."""
    from experiments.synthetic import evaluate
    from experiments.train.synthetic_data import eval_batch
    from model import build_model, get_preset

    cfg = get_preset("1M", vocab_size=29, dim=32, n_layers=2, n_heads=2, n_kv_heads=1,
                     ffn_dim=64, latent_bits=4, kappa_bits=1.0)
    torch.manual_seed(0)
    m = build_model(cfg)
    ev = evaluate(m, n_eval=40, seed=3, batch_size=16)
    # the old computation: batch CE weighted by batch size, the same generator stream
    x = eval_batch(3, 40)
    inp, tgt = x[:, :-1], x[:, 1:].clone()
    tgt[:, 0] = -100
    g = torch.Generator().manual_seed(20)
    cp = ce = 0.0
    with torch.no_grad():
        for s in range(0, 40, 16):
            xi, ti = inp[s:s + 16], tgt[s:s + 16]
            cp += float(m(xi, targets=ti, z="prior", generator=g).ce) * xi.shape[0]
            ce += float(m(xi, targets=ti, z="posterior", generator=g).ce) * xi.shape[0]
    assert ev["ce_prior"] == pytest.approx(cp / 40, rel=1e-5)
    assert ev["ce_encoder"] == pytest.approx(ce / 40, rel=1e-5)
    assert ev["ce_prior_sd"] > 0 and ev["ce_encoder_sd"] > 0 and ev["n_eval"] == 40


def row(**kw: float | None) -> dict:
    """A final-model gaps.csv row: nothing encoded, nothing broken, unless overridden."""
    r = {"pos_gap": 0.0, "pos_lo": -0.01, "pos_hi": 0.01, "pos_p": 0.5,
         "noise_gap": 0.0, "noise_lo": -0.01, "noise_hi": 0.01, "noise_p": 0.5,
         "validity": 0.95, "validity_lo": 0.9, "validity_hi": 1.0, "validity_base": 0.95,
         "validity_diff": 0.0, "validity_diff_lo": -0.05, "validity_diff_hi": 0.05,
         "ce_prior": 0.3, "ce_prior_lo": None, "ce_prior_hi": None}
    r.update(kw)
    return r


def test_predicates_three_valued() -> None:
    P = SY.predicates
    assert P(row()) == {"pos_encoded": "no", "pos_negligible": "yes", "noise_encoded": "no",
                        "noise_negligible": "yes", "validity_drop": "no", "ce_broken": "no",
                        "leaking": "no", "samples_break": "no"}
    # small but detected: encoded AND negligible
    p = P(row(pos_gap=0.03, pos_lo=0.01, pos_hi=0.045, pos_p=0.001))
    assert (p["pos_encoded"], p["pos_negligible"]) == ("yes", "yes")
    # not detected, interval reaching past the margin: neither shown
    p = P(row(pos_gap=0.03, pos_lo=-0.02, pos_hi=0.08, pos_p=0.2))
    assert (p["pos_encoded"], p["pos_negligible"]) == ("unclear", "unclear")
    p = P(row(noise_gap=0.3, noise_lo=0.2, noise_hi=0.4, noise_p=0.0001))
    assert (p["noise_encoded"], p["noise_negligible"]) == ("yes", "no")
    assert P(row(pos_gap=None, pos_lo=None, pos_hi=None, pos_p=None))["pos_encoded"] == "unclear"
    # validity: the interval of the difference against -0.2
    assert P(row(validity_diff_lo=-0.6, validity_diff_hi=-0.3))["validity_drop"] == "yes"
    assert P(row(validity_diff_lo=-0.3, validity_diff_hi=-0.1))["validity_drop"] == "unclear"
    nb = row(validity_diff=None, validity_diff_lo=None, validity_diff_hi=None)
    assert P(nb)["validity_drop"] == "no"  # 0.9 > 0.8: no baseline can sit 0.2 above it
    assert P(nb | {"validity_lo": 0.7})["validity_drop"] == "unclear"
    # CE: the point without a recorded SD, the interval with one
    assert P(row(ce_prior=2.25))["ce_broken"] == "yes"
    assert P(row(ce_prior=0.6, ce_prior_lo=0.55, ce_prior_hi=0.65))["ce_broken"] == "unclear"
    assert P(row(ce_prior=0.62, ce_prior_lo=0.6, ce_prior_hi=0.64))["ce_broken"] == "yes"
    # leaking: either breaks -> yes; unclear only when neither is yes and one is unclear
    assert P(row(ce_prior=2.25, validity_diff_lo=-0.3, validity_diff_hi=-0.1))["leaking"] == "yes"
    assert P(row(validity_diff_lo=-0.3, validity_diff_hi=-0.1))["leaking"] == "unclear"
    # the samples alone: a CE with prior Z above the unigram CE is not a broken sample
    p = P(row(ce_prior=2.25, validity_diff_lo=-0.05, validity_diff_hi=0.05))
    assert (p["leaking"], p["samples_break"]) == ("yes", "no")
    assert abs(SY.UNIGRAM_CE - 0.5870) < 1e-4


def test_judge_v2_known_answers() -> None:
    J = SY.judge_v2
    enc = {"pos_encoded": "yes", "noise_encoded": "yes", "pos_negligible": "no",
           "noise_negligible": "no", "leaking": "no"}
    assert J(1.0, enc)[0] == "holds"
    assert J(1.0, enc | {"leaking": "yes"})[0] == "fails"  # the 1-bit "passes" of v1
    assert J(1.0, enc | {"leaking": "unclear"})[0] == "unclear"
    assert J(1.0, enc | {"leaking": "unclear", "noise_encoded": "no"})[0] == "fails"
    assert J(1 / 8, enc | {"noise_negligible": "yes"})[0] == "holds"
    assert J(1 / 64, enc | {"pos_negligible": "yes", "noise_negligible": "yes"})[0] == "holds"
    assert J(8.0, {"leaking": "yes"}) == ("holds", "leaking: yes")
    assert J(0.5, enc) == (None, "")  # no rule at this kappa


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory: pytest.TempPathFactory) -> tuple[SY.SeedAggregate, Path]:
    """Seed a as the paper; seed b's 1 bit encodes the position and breaks generation (all
    invalid): v1 "passes" the 8-bit rule's condition at 1 bit too, v2 calls it leaking."""
    from test_synthetic_seeds import KL, PAPER, plant

    root = tmp_path_factory.mktemp("two")
    plant(root, "a", 0, PAPER, KL)
    plant(root, "b", 1, {**PAPER, "kappa=1": {"collapse"}}, KL)
    agg = SY.aggregate(["a", "b"], root=root)
    with pytest.MonkeyPatch.context() as mp:  # tables only: test_synthetic_seeds draws figures
        for fig in ("render_kl_curves", "render_agreement"):
            mp.setattr(SY, fig, lambda _df, path: path)
        SY.write_aggregate(agg, root / "out")
    return agg, root / "out"


def test_verdicts_beside_v1_on_planted_runs(two_seeds) -> None:
    agg, out = two_seeds
    raw = pd.read_csv(out / "verdicts.csv", keep_default_na=False, na_values=[""])
    assert list(raw.columns) == list(SY.VERDICT_COLUMNS)
    ver = raw.set_index(["model", "name"])
    for m in ("kappa=1/64", "kappa=1/8", "kappa=1", "kappa=8"):
        assert ver.loc[(m, "a"), "result_v2"] == "holds", (m, ver.loc[(m, "a")].to_dict())
        # v1 in verdicts.csv is per_seed.csv's result
        ps = agg.per_seed.set_index(["model", "name"])
        for n in ("a", "b"):
            v1 = ps.loc[(m, n), "regime_result"]
            assert ver.loc[(m, n), "result_v1"] == v1
    assert ver.loc[("kappa=1", "b"), "leaking"] == "yes"
    assert ver.loc[("kappa=1", "b"), "result_v2"] == "fails"
    assert ver.loc[("kappa=8", "a"), "kl_penalty"] == "none (kappa >= H)"  # H = 8 planted
    assert ver.loc[("kappa=1", "a"), "kl_penalty"] == "free bits"
    block = SY.render_block(out)
    assert "| 8 | leaking (the paper's collapse) | validity <= the same seed's baseline's - " \
           "0.2 | 2/2 seeds | leaking | 2 / 0 / 0 of 2 seeds (no KL penalty: kappa >= H) |" \
        in block
    assert "| kappa=1 | b | 8 | free bits | n/a | **fails** |" in block  # no valid pair: v1 n/a


def test_aggregate_folder_holds_its_samples_and_a_missing_one_reads_not_run(
        two_seeds, tmp_path: Path) -> None:
    out = two_seeds[1]
    gz = {n: (out / "samples" / f"{n}.samples.jsonl.gz").read_bytes() for n in "ab"}
    assert gzip.decompress(gz["a"]) == (out.parent / "synthetic" / "a" / "samples.jsonl"
                                        ).read_bytes()
    assert gz["a"][4:8] == b"\0\0\0\0"  # mtime 0: the same bytes on every rewrite
    # the folder's samples give its gaps again
    SY.write_gaps(pd.concat([SY.measure_run(n, SY.read_run(gzip.decompress(b).decode()
                                                           .splitlines())) for n, b in gz.items()]),
                  tmp_path)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "gaps.csv"),
                                  pd.read_csv(out / "gaps.csv"))
    assert SY.render_block(tmp_path / "synthetic" / "gpu").startswith(
        "Not run yet: no tables in `synthetic/gpu/`")


# Sentences that count seeds or regimes: in the doc they must come from a generated block
# (rendered from verdicts.csv / per_seed.csv), never typed, so they cannot contradict a table.
# "all four regimes appear ... one in none" was such a sentence, and wrong.
_COUNT_PHRASES = (
    r"\b(in|of)\s+(one|two|three|four|\d+)\s+(of\s+(three|four|\d+)\s+)?seeds?\b",
    r"\bin\s+(every|each|no|all|most)\s+(seeds?|runs?)\b", r"\bin\s+none\b",
    r"\b(all|three|two|one)\s+(four\s+)?(of\s+the\s+)?(paper's\s+)?regimes?\b",
    r"\b(\d+|one|two|three)\s*/\s*(\d+)\s+seeds\b", r"\b(twice|once)\s+in\s+three\b",
)


def _outside_blocks(text: str) -> str:
    out, pos = [], 0
    while (b := text.find(SY.DOC_BEGIN, pos)) >= 0:
        out.append(text[pos:b])
        pos = text.find(SY.DOC_END, b) + len(SY.DOC_END)
    return "".join(out) + text[pos:]


def test_doc_prose_counts_nothing_by_hand() -> None:
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "SYNTHETIC.md").read_text()
    prose = _outside_blocks(doc)
    hits = [m.group(0) for pat in _COUNT_PHRASES for m in re.finditer(pat, prose, re.I)]
    assert hits == [], f"seed/regime counts typed outside the generated blocks: {hits}"
    # the check would have caught the sentence issue 38 found wrong
    old = "all four of the paper's regimes appear, three of them in most seeds and one in none"
    assert any(re.search(pat, old, re.I) for pat in _COUNT_PHRASES)


def test_findings_count_what_the_tables_say(two_seeds) -> None:
    out = two_seeds[1]
    text = SY.render_findings(out)
    ver = pd.read_csv(out / "verdicts.csv", keep_default_na=False, na_values=[""])
    for k, g in ver.groupby("kappa_bits"):
        res = list(g["result_v2"])
        line = next(x for x in text.splitlines() if f"kappa = {SY.kappa_label(k)} bit" in x)
        assert (f"v2 holds in {res.count('holds')} of {len(res)} seeds, fails in "
                f"{res.count('fails')}, unclear in {res.count('unclear')}") in line
    assert "Position gap not measurable (no valid pair)" in text  # 8 bits: nothing valid
    assert "Position gap 1.000 (n=1) over seeds (interval ends 1.000 (n=1)" in text  # 1 bit


@pytest.mark.parametrize("folder", ["cpu", "cpu-eighth2x"])
def test_committed_gaps_and_verdicts_agree_with_the_tables(folder: str) -> None:
    """gaps.csv's final rows re-derive per_seed.csv's gaps and validity; verdicts.csv is what
    the rules make of gaps.csv, and its v1 column is per_seed.csv's regime result; the
    committed samples/*.gz decompress to the sha256 aggregate.json names."""
    d = Path(__file__).resolve().parents[1] / "measured" / "synthetic" / folder
    meta = json.loads((d / "aggregate.json").read_text(encoding="utf-8"))
    for src in meta["sources"]:
        gz = d / "samples" / f"{src['name']}.samples.jsonl.gz"
        assert hashlib.sha256(gzip.decompress(gz.read_bytes())).hexdigest() == src["sha256"]
    g = pd.read_csv(d / "gaps.csv")
    fin = g[g["final"]].set_index(["model", "name"])
    ps = pd.read_csv(d / "per_seed.csv", keep_default_na=False,
                     na_values=[""]).set_index(["model", "name"])
    for c in ("pos_gap", "noise_gap", "validity"):
        a, b = fin[c].astype(float), ps.loc[fin.index, c].astype(float)
        assert np.allclose(a, b, atol=2e-5, equal_nan=True), c
    ver = pd.read_csv(d / "verdicts.csv", keep_default_na=False, na_values=[""])
    again = SY.verdicts(g)
    for c in ("result_v2", "why_v2", "result_samples", "ce_vs_samples", *SY.PREDICATES):
        assert list(ver[c].astype(object).fillna("")) == list(again[c].astype(object).fillna("")), c
    v1 = ps.loc[list(zip(ver["model"], ver["name"], strict=True)), "regime_result"]
    assert list(ver["result_v1"]) == list(v1)
