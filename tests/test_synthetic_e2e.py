"""A very short end-to-end `make synthetic`: experiments.train -> samples -> table + figure."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from analysis.synthetic import render
from experiments.synthetic import SyntheticSettings, generate_groups, run
from model import build_model, get_preset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_shared_groups_pin_one_code_sequence() -> None:
    """Rows of a shared group get identical codes; the per-sequence group differs row by row."""
    cfg = get_preset("1M", vocab_size=29, dim=32, n_layers=2, n_heads=2, n_kv_heads=1,
                     ffn_dim=64, latent_bits=4, kappa_bits=1.0)
    torch.manual_seed(0)
    m = build_model(cfg)
    seen: dict[str, torch.Tensor] = {}
    orig = m.generate

    def spy(prompt, max_new_tokens, **kw):  # type: ignore[no-untyped-def]
        seen["z"] = kw["z"]
        return orig(prompt, max_new_tokens, **kw)

    m.generate = spy  # type: ignore[method-assign]
    out = generate_groups(m, ["A", "B"], n_shared_groups=2, group_size=3, temperature=1.0,
                          generator=torch.Generator().manual_seed(0))
    z = seen["z"]
    assert isinstance(z, torch.Tensor) and z.shape == (2 * 3 * 3, 2 + 64)
    for p in range(2):
        base = p * 9
        per_seq, g1, g2 = z[base:base + 3], z[base + 3:base + 6], z[base + 6:base + 9]
        assert bool((g1 == g1[0]).all()) and bool((g2 == g2[0]).all())
        assert not bool((g1[0] == g2[0]).all())
        assert not bool((per_seq[0] == per_seq[1]).all())
    assert [r["group_kind"] for r in out[:9]] == ["per_sequence"] * 3 + ["shared"] * 6
    assert {r["letter"] for r in out} == {"A", "B"} and all(len(r["text"]) == 64 for r in out)


@pytest.mark.slow
def test_end_to_end_smoke_with_kept_checkpoints(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Both arms trained on the smoke setting, sampled, tabled and drawn. With
    logging.keep_eval_checkpoints=3 on 3 steps, steps 1, 2 and 3 (the final weights) are kept:
    points at 1 and 2, each with the final model's prompts and group layout; the aggregate's
    agreement table has steps 1, 2, 3 with the final model last."""
    from analysis.report import _synthetic_html
    from analysis.synthetic import aggregate

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    st = SyntheticSettings(name="e2e", setting="smoke", kappas=(1 / 64, 8.0), n_prompts=1,
                           n_shared_groups=2, group_size=4, figure_rows=4, n_eval=32,
                           overrides=["logging.keep_eval_checkpoints=3"])
    d = run(st)
    assert d == tmp_path / "synthetic" / "e2e"
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 3 and all((r / "checkpoints" / "final.pt").is_file() for r in runs)
    out = render(d)
    for name in ("table.csv", "table.md", "acceptance.json", "figure.png", "agreement.csv"):
        assert out[name].is_file() and out[name].stat().st_size > 0
    assert out["figure.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    df = pd.read_csv(out["table.csv"])
    models = ["baseline", "kappa=1/64", "kappa=8"]
    assert list(df["model"]) == models
    assert (df["n_samples"] == 1 * 3 * 4).all()
    assert df.loc[0, "kl_bits"] != df.loc[0, "kl_bits"]  # NaN: the baseline has no Z
    assert (df.loc[1:, "kl_bits"] >= 0).all() and (df["ce_prior"] > 0).all()
    md = out["table.md"].read_text()
    assert md.startswith("| model ") and "Acceptance check" in md
    checks = json.loads(out["acceptance.json"].read_text())
    assert [c["result"] for c in checks][1] == "n/a"  # no 1/8 or 1 bit run here
    lines = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "meta" and sum(x["kind"] == "model" for x in lines) == 3

    pts = [r for r in lines if r["kind"] == "point"]
    assert [(r["model"], r["step"]) for r in pts] == [(m, s) for m in models for s in (1, 2)]
    assert all(r["checkpoint"] == f"eval_step_{r['step']}.pt" and r["measure_s"] >= 0
               for r in pts)
    assert pts[-1]["kl_bits"] >= 0 and pts[0]["kl_bits"] is None  # the baseline has no Z
    final = [(r["letter"], r["group"], r["row"]) for r in lines
             if r["kind"] == "sample" and r["model"] == "kappa=8"]
    for step in (1, 2):
        assert [(r["letter"], r["group"], r["row"]) for r in lines
                if r["kind"] == "point_sample" and r["model"] == "kappa=8"
                and r["step"] == step] == final
    ag = aggregate(["e2e"], root=tmp_path).agreement
    assert list(ag[ag["model"] == "kappa=8"]["step"]) == [1, 2, 3]
    assert list(ag[ag["model"] == "kappa=8"]["final"]) == [False, False, True]
    # one run: its agreement over training beside its table, and in the report
    assert pd.read_csv(out["agreement.csv"])["step"].tolist() == [1, 2, 3] * 3
    assert "Agreement over training" in _synthetic_html(d)
