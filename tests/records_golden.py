"""Fixed planted sweeps and the frames/tables the analysis reads from them, for the golden test
of the typed records (tests/test_records_golden.py). The goldens under tests/data/records_golden/
of "spec" and "calib" were captured with the code before common/records.py existed (their
evals.csv again with the records' columns, every value equal), those of "extras" with the code
before the spec-less eval files lost their upgrade (issue 43):

    PYTHONPATH=$PWD .venv/bin/python tests/records_golden.py --write

Each sweep plants files as the suite writes them, so a reader change that alters what any of
them means shows up as a CSV difference.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from fake import fake_spec, spec_id, write_fake_sweep  # noqa: E402

from common.records import EvalSpec  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "records_golden"
N_BOOT = 200
# hashes of the planted files' bytes: a writer may order keys differently (same content)
VOLATILE = ("config_sha256", "file_sha256")


def _likelihood(rid: str, arm: str, seed: int, step: int = 10) -> dict:
    """A likelihood file as experiments/eval/likelihood.py writes it."""
    spec = {"suite": "likelihood", "ks": [1, 8], "max_rows": 8, "seed": 12345,
            "rows": "corpus validation rows (val_x, val_y), the first max_rows of them"}
    base = 3.0 + 0.01 * seed
    rec = {"suite": "likelihood", "spec": spec, "spec_id": spec_id(spec),
           "checkpoint_step": step, "run_id": rid, "checkpoint": f"runs/{rid}/final.pt",
           "unit": "nats per token", "n_sequences": 8, "n_tokens": 1024, "n_bytes": 3000}
    if arm == "baseline":
        rec.update(arm="baseline", exact=True, nll_nats_per_token=base,
                   bpb=base * 1024 / 3000 / math.log(2))
    else:
        iw = {str(k): {"nll_nats_per_token": base + 0.1 / k, "se_nats_per_token": 0.01,
                       "bpb": (base + 0.1 / k) * 1024 / 3000 / math.log(2)} for k in (1, 8)}
        rec.update(arm="free", exact=False, iwae=iw,
                   spread_bpb=iw["1"]["bpb"] - iw["8"]["bpb"],
                   prior_k1={"nll_nats_per_token": base + 0.2, "bpb": 1.0},
                   posterior={"ce_nats_per_token": base - 0.3, "kl_nats_per_token": 0.5,
                              "elbo_nats_per_token": base + 0.2, "label": "leaking"})
    return rec


def _evalplus(rid: str, seed: int) -> dict:
    """An evalplus file with a sandbox block and an item the sandbox timed out."""
    rng = np.random.default_rng([seed, 7])
    items = []
    for i in range(12):
        if i == 3:
            items.append({"doc_id": i, "base": None, "plus": None, "reason": "sandbox timeout"})
        else:
            v = float(rng.random() < 0.4)
            items.append({"doc_id": i, "base": v, "plus": v})
    scored = [it["plus"] for it in items if it["plus"] is not None]
    m = float(np.mean(scored))
    spec = EvalSpec.from_args("evalplus", ["mbpp_plus"], 12, "prior", 1, None, 128).to_json()
    return {"schema": "ftbench-eval-v1", "run_id": rid, "checkpoint": f"runs/{rid}/final.pt",
            "suite": "evalplus", "arm": "baseline", "z_mode": None, "k": 1, "leaks": False,
            "seed": 0, "limit": 12, "spec": spec, "spec_id": spec_id(spec),
            "data_checksums": {}, "tasks": {"mbpp_plus": {
                "primary": "pass@1_plus", "higher_is_better": True, "n": 11,
                "metrics": {"pass@1_plus": {"value": m, "n": 11, "n_missing": 1},
                            "pass@1_base": {"value": m, "n": 11, "n_missing": 1}},
                "items": items,
                "sandbox": {"isolation": "weak", "scored": 11, "n_missing": 1,
                            "timed_out": False, "budget_s": 60, "elapsed_s": 3.0,
                            "sandboxes": 12, "leftovers_killed": 0}}}}


def plant(root: Path) -> list[str]:
    """Write the fixed sweeps under root; return their names."""
    # 1: a pending cell, one-H controls, likelihood files, an evalplus file with a sandbox
    #    timeout and a stray limit-20 lm-eval file beside the full one
    write_fake_sweep(root, "extras", kappas=(0.5, 4.0), pending=("free-k4-H16-s1",),
                     controls=("baseline_flops", "baseline_plus1"))
    man = json.loads((root / "sweeps" / "extras" / "manifest.json").read_text())
    for c in man["cells"]:
        if c["state"] != "done":
            continue
        ed = root / "runs" / c["run_id"] / "eval"
        if c["arm"] in ("baseline", "free"):
            lik = _likelihood(c["run_id"], c["arm"], c["seed"])
            (ed / f"likelihood.{lik['spec_id']}.step10.json").write_text(json.dumps(lik))
        if c["arm"] == "baseline":
            (ed / "evalplus.limit12.json").write_text(json.dumps(_evalplus(
                c["run_id"], c["seed"])))
        if c["cell"] == "free-k0.5-H16-s0":
            ev = json.loads((ed / "lm-eval.json").read_text())
            ev["limit"] = ev["spec"]["limit"] = 20
            ev["spec_id"] = spec_id(ev["spec"])
            ev["tasks"]["arc_easy"]["metrics"]["acc"]["value"] = 0.99
            (ed / "lm-eval.limit20.json").write_text(json.dumps(ev))
    # 2: files with specs, two H, both FLOPs controls, manifest eval_spec_id
    sid = spec_id(fake_spec())
    write_fake_sweep(root, "spec", kappas=(0.5, 2.0), latent_bits=(8, 16),
                     controls=("baseline_flops", "baseline_plus1_flops"), eval_spec_id=sid,
                     checkpoint_step=10)
    # 3: the calibration's planted sweep (missing cells, crashed items, a stray LIMIT re-run)
    from calibration import DESIGNS, Scenario, write_scenario

    sc = Scenario("calib", DESIGNS["demo"], 0.05, hs=(8, 16), effects={0.5: 0.1},
                  control_effect={16: 0.05}, missing=True, crash=0.2, stray_limit=True)
    write_scenario(root, sc, np.random.default_rng(7))
    return ["extras", "spec", "calib"]


def frames(root: Path, name: str) -> dict[str, pd.DataFrame]:
    """What the analysis reads from a sweep: the frames and the report's tables."""
    import tempfile

    from analysis import checkpoints as ckpts
    from analysis.frame import load_sweep
    from analysis.tables import write_tables

    data = load_sweep(name, root)
    out = {"scores": data.scores, "cells": data.cells, "tasks": data.tasks,
           "points": data.points, "items": data.items, "curves": data.curves,
           "evals": pd.DataFrame(data.evals), "likelihood": pd.DataFrame(data.likelihood),
           "warnings": pd.DataFrame({"warning": data.warnings})}
    with tempfile.TemporaryDirectory() as td:
        write_tables(data, Path(td), n_boot=N_BOOT)
        for p in sorted(Path(td).glob("*.csv")):
            out["report_" + p.stem] = pd.read_csv(p)
    out["report_table3"] = ckpts.table3(data)
    out["report_likelihood"] = ckpts.likelihood_table(data)
    return out


def to_csv(df: pd.DataFrame, root: Path) -> str:
    """A frame as CSV text, with the planted root's path and file hashes taken out."""
    df = df.drop(columns=[c for c in VOLATILE if c in df.columns])
    text = df.to_csv(index=False)
    return text.replace(str(root), "<root>")


def write(dest: Path = GOLDEN) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        for name in plant(root):
            d = dest / name
            d.mkdir(parents=True, exist_ok=True)
            for key, df in frames(root, name).items():
                (d / f"{key}.csv").write_text(to_csv(df, root), encoding="utf-8")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="(re)write the goldens")
    if ap.parse_args().write:
        write()
