"""analysis/alive.py: the recovered share, the preregistered rule and its verdict, from planted
run directories (config.yaml, metrics.jsonl, probe files) whose numbers are known by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import alive

LN2 = math.log(2.0)


def _probe(d: float, lo: float, hi: float, kl_bits: float, step: int, rows: int = 64,
           draws: int = 2) -> dict:
    return {"schema": "ftbench-probe-v1", "spec": {"rows": rows, "draws": draws},
            "checkpoint_step": step, "n_rows": rows,
            "kl": {"mean_bits_per_token": kl_bits, "se_over_rows": 0.01},
            "ablations": {"prior_ce_nats_per_token": 5.0,
                          "modes": {"posterior": {"delta_vs_prior": {
                              "mean": d, "lo": lo, "hi": hi, "n": rows}}}}}


def _run(root: Path, rid: str, arm: str, seed: int, ces: list[float],
         probes: list[dict] = (), lr: float = 2e-3) -> Path:
    rd = root / rid
    (rd / "eval").mkdir(parents=True)
    h = 0 if arm == "baseline" else 8
    cfg = {"model": {"latent_bits": h, "kappa_bits": 1.0, "z_cut": arm == "free_zcut"},
           "train": {"seed": seed, "batch_size": 16, "seq_len": 256, "tokens": 4096 * 10},
           "optim": {"lr": lr}}
    (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = []
    for i, ce in enumerate(ces):
        r = {"kind": "val", "step": 5 * i, "tokens": 5 * i * 4096, "val_ce": ce}
        if h:
            r.update({"val_ce_prior": ce, "val_ce_posterior": ce - 0.1, "val_kl_nats": 0.4,
                      "val_kl_bits": 0.4 / LN2})
        lines.append(json.dumps(r))
    lines.append(json.dumps({"kind": "final", "step": 10, "wall_s": 12.5}))
    (rd / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for i, p in enumerate(probes):
        (rd / "eval" / f"probe.spec{i}.step{p['checkpoint_step']}.json").write_text(
            json.dumps(p))
    return rd


def test_share_is_posterior_gain_over_kl_in_nats() -> None:
    p = alive.share_of(_probe(-0.1, -0.15, -0.05, 0.5, 10))
    kl = 0.5 * LN2
    assert p["share"] == pytest.approx(0.1 / kl)
    assert (p["share_lo"], p["share_hi"]) == (pytest.approx(0.05 / kl), pytest.approx(0.15 / kl))
    # missing is NaN, never 0; a KL of 0 gives no share
    assert math.isnan(alive.share_of({"kl": {}, "ablations": {}})["share"])
    assert math.isnan(alive.share_of(_probe(-0.1, -0.2, 0.0, 0.0, 1))["share"])


def test_rule_edges() -> None:
    base = {"share": 0.25, "share_lo": 0.10, "kl_bits": 0.1}
    assert alive.is_alive(base)
    for k, v in (("share", 0.2499), ("share_lo", 0.0999), ("kl_bits", 0.0999),
                 ("share", math.nan)):
        assert not alive.is_alive({**base, k: v})
    assert alive.is_stirring({"share": 0.05, "share_lo": 1e-9})
    assert not alive.is_stirring({"share": 0.05, "share_lo": 0.0})


def test_come_alive_is_sustained() -> None:
    def pts(flags: list[bool]) -> pd.DataFrame:
        return pd.DataFrame({"tokens": [1e6 * (i + 1) for i in range(len(flags))],
                             "alive": flags})
    assert alive.come_alive(pts([False, True, False, True, True])) == 4e6
    assert alive.come_alive(pts([True, True, True])) == 1e6
    assert alive.come_alive(pts([True, True, False])) is None
    assert alive.come_alive(pts([])) is None
    v = alive.setting_verdict([None, 3e6, 5e6], 3)
    assert v["alive"] and v["came_alive_tokens"] == 5e6 and v["n_alive"] == 2
    v = alive.setting_verdict([None, float("nan"), 2e6], 3)
    assert not v["alive"] and v["came_alive_tokens"] is None


def test_t_interval_by_hand() -> None:
    m, lo, hi, n = alive.t_interval([1.0, 2.0, 3.0, float("nan")])
    h = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) x sd 1 / sqrt(3)
    assert (m, n) == (2.0, 3) and lo == pytest.approx(2 - h) and hi == pytest.approx(2 + h)
    assert math.isnan(alive.t_interval([1.0])[1])


def test_choose_lr_prefers_smaller_within_tie() -> None:
    g = pd.DataFrame({"lr": [1e-3, 2e-3, 4e-3, 8e-3], "final_val_ce": [5.0, 4.904, 4.9, 4.95]})
    assert alive.choose_lr(g) == 2e-3
    assert alive.choose_lr(g, tie=0.0) == 4e-3
    assert alive.choose_lr(g.assign(final_val_ce=math.nan)) is None


def test_tables_verdict_and_doc(tmp_path: Path) -> None:
    runs = []
    kl = 0.5
    for s in range(3):
        runs.append(_run(tmp_path, f"b{s}", "baseline", s, [6.0, 5.0 + 0.01 * s]))
        # seed 0 comes alive at step 10 only, seed 1 at step 5 and stays, seed 2 never
        share = {0: [0.01, 0.3], 1: [0.4, 0.5], 2: [0.02, 0.03]}[s]
        probes = [_probe(-sh * kl * LN2, -sh * kl * LN2 - 0.01, -sh * kl * LN2 + 0.01, kl,
                         step) for sh, step in zip(share, (5, 10), strict=True)]
        probes.append(_probe(-0.9, -1, -0.8, kl, 10, rows=16))  # another spec: ignored
        probes.append({**probes[1]})  # the same step twice (final.pt): counted once
        runs.append(_run(tmp_path, f"f{s}", "free", s, [6.0, 5.02], probes))
        runs.append(_run(tmp_path, f"z{s}", "free_zcut", s, [6.0, 5.03],
                         [_probe(0.0, 0.0, 0.0, 0.9, 5), _probe(0.0, 0.0, 0.0, 0.8, 10)]))
    out = tmp_path / "out"
    summ = alive.write_tables(runs, out)
    v = summ["verdict"]
    assert v["alive"] and v["n_alive"] == 2 and v["came_alive_tokens"] == 10 * 4096
    assert summ["zcut_check"]["ok"] and summ["zcut_check"]["n_checkpoints"] == 6
    seeds = pd.read_csv(out / "seeds.csv")
    f = seeds[seeds["arm"] == "free"].set_index("seed")
    assert f.loc[1, "came_alive_tokens"] == 5 * 4096 and pd.isna(f.loc[2, "came_alive_tokens"])
    assert f.loc[0, "n_probed"] == 2 and f.loc[0, "final_share"] == pytest.approx(0.3)
    assert (seeds[seeds["arm"] == "baseline"]["n_probed"] == 0).all()
    dl = pd.read_csv(out / "deltas.csv").set_index("comparison")
    # FT 5.02 vs baseline 5.00, 5.01, 5.02: mean 0.01, by hand
    assert dl.loc["FT kappa=1 - baseline", "mean"] == pytest.approx(0.01)
    assert dl.loc["FT kappa=1 - Z-cut", "mean"] == pytest.approx(-0.01)
    curves = pd.read_csv(out / "val_curves.csv")
    fc = curves[curves["arm"] == "free"]
    assert fc["share_val"].iloc[-1] == pytest.approx(0.1 / 0.4)
    assert curves[curves["arm"] == "baseline"]["share_val"].isna().all()
    assert (out / "alive.png").stat().st_size > 1000
    doc = tmp_path / "ALIVE.md"
    doc.write_text(f"# head\n\n{alive.BEGIN}\nold\n{alive.END}\ntail\n")
    assert alive.main(["render-doc", "--tables", str(out), "--doc", str(doc), "--check"]) == 1
    assert alive.main(["render-doc", "--tables", str(out), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "**The latent came alive**" in text and "0.04M" in text and text.endswith("tail\n")
    assert alive.main(["render-doc", "--tables", str(out), "--doc", str(doc), "--check"]) == 0


def test_zcut_check_failure_voids_the_verdict(tmp_path: Path) -> None:
    runs = [_run(tmp_path, "z0", "free_zcut", 0, [5.0], [_probe(-0.01, -0.02, 0.0, 0.5, 5)])]
    summ = alive.write_tables(runs, tmp_path / "out")
    assert summ["zcut_check"]["ok"] is False and summ["verdict"]["alive"] is None


def test_bad_input_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert alive.main(["tables", "--runs", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("alive: error:") and "\n" not in err
    assert not (tmp_path / "o").exists()
    assert alive.main(["tables", "--sweep", "nope", "--out", str(tmp_path / "o")]) == 2


def test_unfinished_runs_are_listed_not_counted(tmp_path: Path) -> None:
    kl = 0.5
    good = [_probe(-0.4 * kl * LN2, -0.4 * kl * LN2 - 0.01, -0.4 * kl * LN2 + 0.01, kl, 10)]
    runs = [_run(tmp_path, "f0", "free", 0, [6.0, 5.0], good),
            _run(tmp_path, "f1", "free", 1, [6.0, 5.0], good), tmp_path / "never-started"]
    lines = (runs[1] / "metrics.jsonl").read_text().splitlines()[:-1]  # no final line yet
    (runs[1] / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    v = alive.write_tables(runs, out)["verdict"]
    assert v["n_seeds"] == 1 and v["n_alive"] == 1 and not v["alive"]
    assert v["unfinished_runs"] == ["f1", "never-started"]
    seeds = pd.read_csv(out / "seeds.csv").set_index("run_id")
    assert not seeds.loc["f1", "finished"] and seeds.loc["f0", "finished"]
    # a second block, from a subdirectory of the tables, renders from there
    doc = tmp_path / "ALIVE.md"
    sub = alive.BEGIN_PREFIX + "docs/alive/pilot -->"
    doc.write_text(f"{alive.BEGIN}\nx\n{alive.END}\nmid\n{sub}\ny\n{alive.END}\n")
    tables = tmp_path / "tables"
    alive.write_tables(runs[:1], tables / "pilot")
    alive.write_tables(runs, tables)
    assert alive.main(["render-doc", "--tables", str(tables), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.count(alive.END) == 2 and "\nmid\n" in text and sub in text
    assert "not counted): f1, never-started" in text and "(training)" in text
