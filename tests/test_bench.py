"""`make bench` end to end at the tiny size: every section runs and the output has its schema.

Speed targets are measured by the bench, never asserted here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from experiments.bench import __main__ as bench
from experiments.bench.harness import ALL_SECTIONS, SCHEMA, SIZES, peak_alloc_bytes


def _is_summary(d: Any, min_n: int = 5) -> bool:
    return (isinstance(d, dict) and {"median", "min", "max", "n", "values"} <= set(d)
            and d["n"] >= min_n and len(d["values"]) == d["n"]
            and d["min"] <= d["median"] <= d["max"] and d["min"] > 0)


@pytest.mark.slow  # the tiny bench end to end, ~30-60 s
def test_the_tiny_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every section of one tiny run, its schema, targets and Markdown."""
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "results"))
    rc = bench.main(["--size", "tiny", "--threads", "1"])
    files = sorted((tmp_path / "results" / "bench").glob("*.json"))
    assert len(files) == 1, files
    path = files[0]
    res = json.loads(path.read_text())
    assert res["errors"] == {}, res["errors"]
    assert rc == 0
    assert re.fullmatch(r"\d{8}T\d{6}Z\.json", path.name)
    assert res["schema"] == SCHEMA
    assert set(res["sections"]) == set(ALL_SECTIONS)
    assert res["settings"]["size"] == "tiny" and res["settings"]["reps"] >= 5
    m, sec, s = res["machine"], res["sections"], SIZES["tiny"]
    assert m["threads"] == 1
    assert m["torch"].startswith("2.")
    for k in ("cpu", "cpu_count", "device", "transformers", "x_transformers", "lm_eval"):
        assert k in m

    b = sec["train"]["baseline_vs_hf"]
    # HF got our weights: identical config means identical logits
    assert b["hf_logits_max_abs_diff_same_weights"] < 1e-4
    assert b["ours"]["params"] == b["hf"]["params"]
    for k in ("ours", "hf"):
        e = b[k]
        assert _is_summary(e["step_s"])
        assert e["tokens_per_s"] == pytest.approx(e["tokens_per_step"] / e["step_s"]["median"])
        assert e["frac_of_matmul"] == pytest.approx(e["model_flops_s"] / b["matmul"]["flops_s"])
    assert _is_summary(b["speedup_ours_over_hf"])
    assert b["hf_attn_implementation"] == "sdpa"

    xt = sec["free"]["ft_vs_xtransformers"]
    assert xt["mismatches"]
    hs = [k for k in xt if k.startswith("H")]
    assert hs == [f"H{h}" for h in s.xt_bits]
    for k in hs:
        assert _is_summary(xt[k]["ours"]["step_s"]) and _is_summary(xt[k]["xt"]["step_s"])
        assert _is_summary(xt[k]["speedup_ours_over_xt"])
        assert xt[k]["xt"]["params"] > 0
    ov = sec["free"]["overhead"]
    assert _is_summary(ov["baseline"]["step_s"])
    assert ov["analytic_at_paper_presets"]["1.5B"]["1/L"] == pytest.approx(1 / 28)
    assert ov["paper_overhead"] == pytest.approx(1 / ov["n_layers"])
    assert [r["H"] for r in ov["bits"].values()] == list(s.overhead_bits)
    prev = 1.0
    for r in ov["bits"].values():
        assert _is_summary(r["step_ratio"])
        # the analytic ratio grows with H (the mapper's backward is dense over 2^H codes)
        assert r["analytic_flops_ratio"] > prev
        prev = r["analytic_flops_ratio"]

    mp = sec["mapper"]
    assert len(mp["rows"]) == len(s.mapper_bits) * len(s.mapper_tokens)
    for r in mp["rows"]:
        # ours equals the dense formula in value and gradient
        assert r["max_abs_err"]["value"] < 1e-6  # 1 + g - g is 1 up to rounding
        assert r["max_abs_err"]["grad_logits_rel"] < 1e-4
        assert r["max_abs_err"]["grad_weight"] < 1e-5
        assert r["ours_peak_bytes"] > 0 and r["dense_peak_bytes"] > 0
        # both at least hold the weight gradient they create
        assert r["dense_peak_bytes"] >= r["weight_grad_bytes"]
        assert _is_summary(r["ours_s"]) and _is_summary(r["dense_s"])
    big = max(mp["rows"], key=lambda r: (r["H"], r["tokens"]))
    # the dense formula holds (tokens x 2^H) tensors; ours must not
    assert big["dense_peak_bytes"] >= 2 * 4 * big["tokens"] * (1 << big["H"])
    assert big["ours_peak_bytes"] < big["dense_peak_bytes"]

    g = sec["generate"]
    assert g["kv_equals_recompute"] is True
    for k in ("kv_cache", "recompute"):
        assert _is_summary(g[k]["s"])
        assert g[k]["tokens_per_s"] == pytest.approx(g["new_tokens"] / g[k]["s"]["median"])
    assert _is_summary(g["kv_speedup_over_recompute"])
    if "hf_generate" in g:  # the exported baseline decodes the same greedy tokens
        assert g["hf_token_agreement"] > 0.5
    g = sec["generate_batch"]
    assert g["batch"] == s.gen_batch >= 8 and len(g["prompt_lens"]) == g["batch"]
    assert len(set(g["prompt_lens"])) > 1  # mixed prompt lengths
    assert g["stop_sequences"] >= 1 and 1 <= g["rows_stopped"] < g["batch"]
    assert g["hf_rows_equal"] == g["batch"]  # the export decodes the same rows, same stops
    for k in ("ours", "hf_generate"):
        assert _is_summary(g[k]["s"])
        assert g[k]["tokens_per_s"] == pytest.approx(g["new_tokens_kept"] / g[k]["s"]["median"])
    assert _is_summary(g["speedup_ours_over_hf"])

    ev = sec["eval"]
    # per task type: multi-token continuations, and 5-shot MMLU-like (shared headers)
    assert set(ev["tasks"]) == {"mc_continuations", "mmlu_5shot"}
    for t in ev["tasks"].values():
        assert t["max_abs_loglik_diff"] < 1e-3  # both backends score the same model
        assert _is_summary(t["speedup_ours_over_hf"])
        assert t["ours"]["requests_per_s"] > 0 and t["hf"]["requests_per_s"] > 0
    mmlu = ev["tasks"]["mmlu_5shot"]
    assert mmlu["contexts"] * 4 == mmlu["requests"]  # four letters per question

    names = [t["target"] for t in res["targets"]]
    assert len(names) == 6
    assert "batched generation ours vs HF generate at batch 8" in names
    for t in res["targets"]:
        assert t["met"] in (True, False, None)
        assert (t["measured"] is None) == (t["met"] is None)
    md = Path(res["markdown_path"])
    assert md == path.with_suffix(".md")  # the tiny run never overwrites docs/BENCH.md
    text = md.read_text()
    for heading in ("## Targets", "## Training step", "## Free Transformer overhead",
                    "## Our Free Transformer vs x-transformers",
                    "## Binary mapper", "## Generation", "## Batched generation",
                    "## Evaluation"):
        assert heading in text
    assert "| ours baseline |" in text
    # a rewritten table keeps the hand-run measurements below the marker
    md = tmp_path / "BENCH.md"
    md.write_text(f"old table\n{bench.HAND_RUN_MARKER}\n## By hand\nfigures\n")
    bench._write(json.loads(json.dumps(res)), tmp_path / "out.json", md)
    text = md.read_text()
    assert "old table" not in text and "## Training step" in text
    assert text.endswith(f"{bench.HAND_RUN_MARKER}\n## By hand\nfigures\n")


def test_peak_alloc_bytes_counts_temporaries() -> None:
    import torch

    def f() -> None:
        a = torch.ones(1000, 1000)  # 4 MB, freed before b exists
        del a
        b = torch.ones(500, 1000)  # 2 MB
        del b

    peak = peak_alloc_bytes(f, torch.device("cpu"))
    assert 4_000_000 <= peak < 6_000_000


def test_eta_comes_from_the_newest_earlier_run_of_the_same_size(tmp_path: Path) -> None:
    def write(stamp: str, size: str, walls: dict[str, float], errors: dict | None = None) -> Path:
        p = tmp_path / f"{stamp}.json"
        p.write_text(json.dumps({"settings": {"size": size}, "section_wall_s": walls,
                                 "errors": errors or {}}))
        return p

    write("20260101T000000Z", "full", {"train": 600.0, "free": 900.0})
    write("20260102T000000Z", "full", {"train": 300.0, "mapper": 999.0}, {"mapper": "boom"})
    write("20260103T000000Z", "tiny", {"train": 1.0, "free": 1.0})
    (tmp_path / "20260104T000000Z.json").write_text("{not json")
    me = write("20260105T000000Z", "full", {"train": 5.0})  # the run itself: never its own basis
    times = bench._earlier_section_times(tmp_path, "full", me, ["train", "free", "mapper"])
    assert times == {"train": 300.0, "free": 900.0}  # newest wins; a failed section is no basis
    assert bench._earlier_section_times(tmp_path, "full", me, ["free"]) == {"free": 900.0}
    assert bench._eta(times, ["train", "free"]) == " (about 20.0 min left, by earlier runs)"
    assert bench._eta(times, ["train"]) == " (about 5.0 min left, by earlier runs)"
    assert bench._eta(times, ["free", "mapper"]) == ""  # never a partial sum shown as an ETA
    assert bench._eta({}, []) == ""


@pytest.mark.slow  # a fresh interpreter importing torch; the fast tier covers the bench's helpers
def test_memory_probe_keeps_stderr_quiet() -> None:
    # kineto printed two "USDT ... profiler_start/stop" lines per profiled call, hundreds per run
    code = ("import torch; from experiments.bench.harness import peak_alloc_bytes;"
            "peak_alloc_bytes(lambda: torch.ones(1000) * 2, torch.device('cpu'))")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert r.returncode == 0, r.stderr
    assert "USDT" not in r.stderr and "profiler_start" not in r.stderr, r.stderr
