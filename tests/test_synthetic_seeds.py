"""The multi-seed aggregate of `make synthetic` and the doc it renders, on planted runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from test_synthetic_metrics import body

from analysis.synthetic import (
    DOC_BEGIN,
    DOC_END,
    GAP_COLUMNS,
    SeedAggregate,
    aggregate,
    main,
    render_block,
    render_doc,
    write_aggregate,
)

REPO = Path(__file__).resolve().parents[1]
KAPPAS = {"kappa=1/64": 1 / 64, "kappa=1/8": 1 / 8, "kappa=1": 1.0, "kappa=8": 8.0}


def text_for(model: str, prompt: int, group: int, row: int, encodes: set[str]) -> str:
    """Planted behaviour: 'collapse' is never valid; 'position' gives every row of a shared
    group the group's start (and distinct starts elsewhere); 'noise' the group's '!' set."""
    if "collapse" in encodes:
        return "_" * 64
    shared = group > 0
    start = 4 + 12 * group if shared and "position" in encodes else (7 * row + group) % 56
    noise = (60 + group % 4,) if shared and "noise" in encodes else ()
    return body(start, noise=noise)


def samples(kind: str, model: str, enc: set[str], **step: int) -> list[dict]:
    """One model's generated rows: 2 prompts x (1 per-sequence + 2 shared groups) x 4 rows."""
    return [{"kind": kind, "model": model, **step, "prompt_idx": p, "letter": "T", "group": g,
             "row": row, "group_kind": "shared" if g else "per_sequence",
             "text": text_for(model, p, g, row, enc)}
            for p in range(2) for g in range(3) for row in range(4)]


def plant(root: Path, name: str, seed: int, behaviour: dict[str, set[str]],
          kl: dict[str, float], curves: bool = True) -> None:
    """results/synthetic/<name>/samples.jsonl (+ each arm's metrics.jsonl) with the given
    behaviour per model (`samples`)."""
    lines = [{"kind": "meta", "name": name, "created": "2026-01-01T00:00:00+00:00",
              "settings": {"seed": seed, "setting": "cpu", "latent_bits": 8,
                           "kappas": [KAPPAS[m] for m in behaviour if m != "baseline"],
                           "baseline": "baseline" in behaviour, "overrides": [],
                           "train_overrides": ["model=1M"], "n_prompts": 2},
              "wall_s": 100.0 + seed, "threads": 1, "cpu_count": 2,
              "loadavg_start": [2.0, 2.0, 2.0], "loadavg_end": [1.0, 1.0, 1.0]}]
    for model, enc in behaviour.items():
        base = model == "baseline"
        run_id = f"{name}-{model}".replace("=", "").replace("/", "_")
        lines.append({"kind": "model", "model": model, "arm": "baseline" if base else "free",
                      "kappa_bits": None if base else KAPPAS[model], "latent_bits": 0 if base
                      else 8, "run_id": run_id, "run_dir": str(root / "runs" / run_id),
                      "kl_bits": None if base else kl[model], "ce_prior": 0.3,
                      "ce_prior_sd": 0.05, "n_eval": 64,
                      "ce_encoder": None if base else 0.2, "steps": 100, "train_wall_s": 20.0})
        if curves:  # the trainer logs kl_bits 0.0 for the baseline
            d = root / "runs" / run_id
            d.mkdir(parents=True)
            k = 0.0 if base else kl[model]
            recs = [{"kind": "train", "step": s, "kl_bits": k * s / 100,
                     "ce": 1.0 - k * s / 1000} for s in range(10, 101, 10)]
            recs.append({"kind": "final", "step": 100, "wall_s": 20.0})
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        lines += samples("sample", model, enc)
    d = root / "synthetic" / name
    d.mkdir(parents=True)
    (d / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


PAPER = {"baseline": set(), "kappa=1/64": set(), "kappa=1/8": {"position"},
         "kappa=1": {"position", "noise"}, "kappa=8": {"collapse"}}
KL = {"kappa=1/64": 0.01, "kappa=1/8": 0.1, "kappa=1": 0.5, "kappa=8": 6.0}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("planted")
    plant(root, "a", 0, PAPER, KL)
    # seed 1: 1/8 bit encodes nothing, 1 bit position only (no noise), and no curves
    plant(root, "b", 1, {**PAPER, "kappa=1/8": set(), "kappa=1": {"position"}},
          {k: 2 * v for k, v in KL.items()}, curves=False)
    # seed a kept checkpoints at steps 25 and 50: Z unused at 25, the final behaviour from 50;
    # seed b kept none, so it has no rows (not zeros) and the counts say n = 1
    add_points(root, "a", {25: {m: set() for m in PAPER}, 50: PAPER})
    return root  # "c" is never written: a missing seed


@pytest.fixture(scope="module")
def written(planted: Path) -> tuple[SeedAggregate, dict[str, Path]]:
    """The one aggregate of a, b and c, written (figures included) once for the module."""
    agg = aggregate(["a", "b", "c"], root=planted)
    return agg, write_aggregate(agg, planted / "docs" / "synthetic" / "t")


def test_aggregate_counts_regimes_per_seed_and_missing(written) -> None:
    agg, out = written
    ps = agg.per_seed.set_index(["model", "name"])
    # planted: shared groups agree (1.0), different groups never (0.0)
    assert ps.loc[("kappa=1/8", "a"), "pos_gap"] == 1.0
    assert ps.loc[("kappa=1/8", "b"), "pos_gap"] == 0.0
    assert ps.loc[("kappa=1", "a"), "noise_gap"] == 1.0
    assert ps.loc[("kappa=1", "b"), "noise_gap"] == 0.0  # no '!' anywhere: Jaccard 1 and 1
    assert ps.loc[("kappa=8", "a"), "validity"] == 0.0
    assert math.isnan(ps.loc[("kappa=8", "a"), "pos_gap"])  # no valid pair: not measured
    res = {m: [x if isinstance(x, str) else None for x in g] for m, g in
           agg.per_seed.groupby("model")["regime_result"]}
    assert res["kappa=1/64"] == ["pass", "pass", None]
    assert res["kappa=1/8"] == ["pass", "fail", None]
    assert res["kappa=1"] == ["pass", "fail", None]
    assert res["kappa=8"] == ["pass", "pass", None]
    # the missing seed: rows of None, never 0
    c = agg.per_seed[agg.per_seed["name"] == "c"]
    assert len(c) == 5 and set(c["status"]) == {"missing"}
    assert c[["kl_bits", "validity", "pos_gap"]].isna().all().all()
    s = agg.summary.set_index("model")
    assert list(s.index) == ["baseline", "kappa=1/64", "kappa=1/8", "kappa=1", "kappa=8"]
    assert (s["n_measured"] == 2).all() and (s["n_names"] == 3).all()
    assert s.loc["kappa=1/8", "kl_bits"] == pytest.approx((0.1 + 0.2) / 2)
    assert s.loc["kappa=1/8", "pos_gap"] == pytest.approx(0.5)
    assert s.loc["kappa=8", "pos_gap_n"] == 0 and pd.isna(s.loc["kappa=8", "pos_gap"])
    assert (s.loc["kappa=1/8", "regime_pass"], s.loc["kappa=1/8", "regime_fail"]) == (1, 1)
    assert agg.meta["missing"] == ["c"]
    b = next(x for x in agg.meta["sources"] if x["name"] == "b")
    assert b["curves_missing"] == ["baseline", "kappa=1/64", "kappa=1/8", "kappa=1", "kappa=8"]
    assert set(agg.curves["name"]) == {"a"}  # b has no metrics.jsonl: no curve, not zeros
    cv = agg.curves.set_index(["model", "step"])
    assert pd.isna(cv.loc[("baseline", 100), "kl_bits"])  # logged 0.0, but it has no Z
    # 16 bins of ceil(100/16) = 7 steps: the last, (98, 100], holds step 100 alone
    assert cv.loc[("kappa=1", 100), "kl_bits"] == pytest.approx(0.5)
    assert cv.loc[("kappa=1", 14), "kl_bits"] == pytest.approx(0.05)  # step 10 alone
    block = render_block(out["summary.md"].parent)
    # CE gain against the seed's baseline: one run (a) with both curves, -6.0 * 100 / 1000
    assert "| kappa=8 | " in block and "| -0.600 (n=1) |" in block


def test_block_and_doc_render_from_written_tables(planted: Path, written,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = written[1]
    block = render_block(out["summary.md"].parent)
    assert "Runs: 2 of 3 measured" in block and "Missing (not finished): c" in block
    assert "| 1/8 | position | position gap >= 0.1 | 1/2 seeds (1 missing) |" in block
    assert "| kappa=1/8 | c (missing) | – | – |" in block
    assert "| kappa=1/8 | 2/3 | 0.150 |" in block  # mean KL of the two measured seeds
    doc = planted / "docs" / "DOC.md"
    stale = block.replace("0.150", "9.999")
    doc.write_text(f"# t\n\n{DOC_BEGIN}docs/synthetic/t -->\n{stale}{DOC_END}\n\nprose 1.23\n")
    new, dirs = render_doc(doc, root=planted)
    assert dirs == ["docs/synthetic/t"] and "9.999" not in new and block in new
    assert new.endswith(f"{DOC_END}\n\nprose 1.23\n")
    monkeypatch.setattr("analysis.synthetic.ROOT", planted)
    assert main(["render-doc", "--doc", str(doc), "--check"]) == 1
    assert "9.999" in doc.read_text()  # --check writes nothing
    assert main(["render-doc", "--doc", str(doc)]) == 0 and doc.read_text() == new
    assert main(["render-doc", "--doc", str(doc), "--check"]) == 0
    doc.write_text(f"{DOC_BEGIN}docs/synthetic/t -->\nunclosed")
    assert main(["render-doc", "--doc", str(doc)]) == 2


def test_cli_names(planted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FTBENCH_RESULTS", str(planted))
    for fig in ("render_kl_curves", "render_agreement"):  # drawn once, by `written`
        monkeypatch.setattr(f"analysis.synthetic.{fig}", lambda _df, path: path)
    # its own folder: the module's `planted` is shared, and other tests read planted/agg
    main(["--names", "a", "c", "--out", str(tmp_path / "agg")])
    assert pd.read_csv(tmp_path / "agg" / "summary.csv")["n_measured"].tolist() == [1] * 5
    for bad, why in ((["--names", "../a"], "plain folder"), (["--names", "c"], "none of"),
                     (["--names", "a", "a"], "twice"), (["--out", "x"], "goes with --names")):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and why in err, (bad, err)


def test_committed_doc_is_rendered_from_committed_tables() -> None:
    """docs/SYNTHETIC.md's numbers are exactly what render-doc makes of measured/synthetic/."""
    doc = REPO / "docs" / "SYNTHETIC.md"
    new, dirs = render_doc(doc)
    assert dirs and new == doc.read_text(encoding="utf-8")


def test_make_synthetic_seeds_names_one_run_per_seed() -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    res = subprocess.run(["make", "-s", "-n", "-o", "setup", "synthetic-seeds", "SYN_NAME=mid",
                          "SYN_SEEDS=3 4"], cwd=REPO, capture_output=True, text=True, env=env,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert "-m pipelines.synthetic_seeds --name 'mid' --seeds '3 4'" in res.stdout
    assert "--jobs" not in res.stdout  # default: every seed at once
    assert "--names 'mid-s3' 'mid-s4'" in res.stdout


def add_points(root: Path, name: str, steps: dict[int, dict[str, set[str]]]) -> None:
    """Append `point` / `point_sample` records to a planted run: the behaviour per model at
    each kept step (planted, so the agreement over training is known)."""
    f = root / "synthetic" / name / "samples.jsonl"
    lines = []
    for step, behaviour in steps.items():
        for model, enc in behaviour.items():
            base = model == "baseline"
            lines.append({"kind": "point", "model": model, "step": step,
                          "arm": "baseline" if base else "free",
                          "kappa_bits": None if base else KAPPAS[model],
                          "kl_bits": None if base else step / 1000, "ce_prior": 0.4,
                          "ce_encoder": None if base else 0.3})
            lines += samples("point_sample", model, enc, step=step)
    with f.open("a") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in lines))


def test_agreement_over_training_from_kept_checkpoints(planted: Path, written) -> None:
    agg, out = written
    ag = agg.agreement.set_index(["model", "step"])
    assert set(agg.agreement["name"]) == {"a"}
    assert sorted({int(s) for s in agg.agreement["step"]}) == [25, 50, 100]
    assert ag.loc[("kappa=1", 25), "pos_gap"] == 0.0 and ag.loc[("kappa=1", 25), "noise_gap"] == 0
    assert ag.loc[("kappa=1", 50), "pos_gap"] == 1.0 and ag.loc[("kappa=1", 50), "noise_gap"] == 1
    assert ag.loc[("kappa=1", 100), "final"] and not ag.loc[("kappa=1", 50), "final"]
    assert ag.loc[("kappa=8", 25), "validity"] == 1.0 and ag.loc[("kappa=8", 50), "validity"] == 0
    assert ag.loc[("kappa=1", 50), "kl_bits"] == pytest.approx(0.05)
    assert ag.loc[("kappa=1", 100), "kl_bits"] == pytest.approx(0.5)  # the model record's
    assert pd.isna(ag.loc[("baseline", 50), "kl_bits"])  # no Z: missing, not 0
    assert out["agreement.png"].is_file()
    # gaps.csv: every measured step of every model (final last), the baseline without a
    # reference, p from the permutations, CE's interval from the recorded per-sequence SD
    g = pd.read_csv(out["gaps.csv"])
    assert list(g.columns) == list(GAP_COLUMNS) and g["n_perm"].eq(9999).all()
    a = g[g["name"] == "a"]
    assert list(zip(a["model"], a["step"], a["final"], strict=True))[:3] == [
        ("baseline", 25, False), ("baseline", 50, False), ("baseline", 100, True)]
    fin = a[a["final"]].set_index("model")
    assert pd.isna(fin.loc["baseline", "validity_diff"]) and fin["seed"].eq(0).all()
    assert fin.loc["kappa=1", "pos_p"] < 0.01 < fin.loc["kappa=1/64", "pos_p"]
    assert fin.loc["kappa=1", "ce_prior_lo"] < 0.3 < fin.loc["kappa=1", "ce_prior_hi"]
    block = out["summary.md"].read_text()
    assert "Position gap over training, per run" in block and "| kappa=1 | a | " in block
    assert "| kappa=1 | position gap | 0.000 (n=1) | 1.000 (n=1) | 1.000 (n=1) |" in block
    assert "| baseline | validity |" in block and "| baseline | position gap |" not in block
    # the same folder rewritten from runs that kept nothing: said, and no stale figure
    out = write_aggregate(aggregate(["b"], root=planted), planted / "agg")
    assert "agreement.png" not in out and not (planted / "agg" / "agreement.png").exists()
    assert "Agreement over training: not measured" in render_block(planted / "agg")
