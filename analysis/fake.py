"""Fabricated result files laid out per docs/RESULTS.md, for tests and for trying the report.

`write_fake_sweep(root, name)` writes a manifest, config.yaml, metrics.jsonl and eval JSON for a
small grid (baseline, Free Transformers, optional equal-FLOPs control), with per-item scores drawn
from fixed probabilities so tests know the answers. Cells listed in `pending` get a manifest entry
and nothing else, as a sweep still running would.

    python -m analysis.fake --root /tmp/r --name fake   # then: python -m analysis.report ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import yaml

N_LAYERS = 4
TASKS = {  # task -> (primary, item keys, higher_is_better, n items)
    "humaneval_plus": ("pass@1_plus", ["base", "plus"], True, 40),
    "gsm8k": ("exact_match", ["exact_match"], True, 50),
    "arc_easy": ("acc", ["acc", "acc_norm"], True, 60),
    "gsm8k_gold_bpb": ("bpb", ["bpb"], False, 30),
}


def _p(arm: str, kappa: float | None) -> float:
    """Success probability of a fabricated arm (Free Transformers a little better)."""
    if arm == "free":
        return 0.45 if kappa and kappa < 4 else 0.2
    return 0.3


def _run_id(cell: str, name: str) -> str:
    return hashlib.sha256(f"{name}/{cell}".encode()).hexdigest()[:12]


def write_fake_sweep(root: str | Path, name: str = "fake", kappas: tuple = (0.5, 2.0, 4.0),
                     seeds: tuple = (0, 1), controls: tuple = ("baseline_flops",),
                     pending: tuple = (), with_items: bool = True) -> Path:
    """Write a fabricated sweep; return its manifest path."""
    root = Path(root)
    cells = [("baseline", None, s) for s in seeds]
    cells += [("free", k, s) for k in kappas for s in seeds]
    cells += [(c, None, s) for c in controls for s in seeds]
    out = []
    for arm, kappa, seed in cells:
        cell = f"{arm}-s{seed}" if kappa is None else f"free-k{kappa:g}-H16-s{seed}"
        rid = _run_id(cell, name)
        state = "pending" if cell in pending else "done"
        out.append({"cell": cell, "arm": arm, "kappa_bits": kappa,
                    "latent_bits": 16 if arm == "free" else 0, "seed": seed, "run_id": rid,
                    "overrides": [], "job_id": f"local-{rid[:4]}", "state": state,
                    "reason": None, "eval": {"state": state, "job_id": None}})
        if state != "done":
            continue
        _write_run(root / "runs" / rid, rid, arm, kappa, seed, with_items)
    man = {"name": name, "created": "2026-01-01T00:00:00Z", "git_commit": "f" * 40,
           "launcher": "local",
           "grid": {"kappa_bits": list(kappas), "latent_bits": [16], "seeds": list(seeds),
                    "preset": "tiny", "data": "stdlib", "tokens": 100000, "flops": None,
                    "controls": list(controls)},
           "shared": {"lr": 1e-3}, "data_checksums": {"stdlib": "a" * 64}, "cells": out}
    path = root / "sweeps" / name / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(man, indent=1), encoding="utf-8")
    return path


def _write_run(d: Path, rid: str, arm: str, kappa: float | None, seed: int,
               with_items: bool) -> None:
    d.mkdir(parents=True, exist_ok=True)
    free = arm == "free"
    n_layers = N_LAYERS + (1 if arm == "baseline_plus1" else 0)
    base_fpt = 1.0e6 * n_layers / N_LAYERS
    overhead = 0.3 if free else 0.0
    tokens = 100000 * (1.3 if arm == "baseline_flops" else 1.0)
    cfg = {"run_id": rid, "arm": "free" if free else "baseline",
           "model": {"vocab_size": 512, "dim": 64, "n_layers": n_layers,
                     "latent_bits": 16 if free else 0, "kappa_bits": kappa or 0.5},
           "data": {"name": "stdlib"}, "optim": {"lr": 1e-3},
           "train": {"seed": seed, "seq_len": 128, "batch_size": 8, "grad_accum": 1,
                     "tokens": tokens, "flops": None, "compute_match": None},
           "accounting": {"params": {"total": 1000000},
                          "flops_per_token": base_fpt * (1 + overhead),
                          "flops_per_token_baseline_part": base_fpt,
                          "flops_overhead": overhead},
           "provenance": {"git_commit": "f" * 40, "git_dirty": False, "argv": ["fake"],
                          "created": "2026-01-01T00:00:00Z",
                          "versions": {"python": "3.11", "torch": "2.13.0"},
                          "data_checksums": {"stdlib": "a" * 64}, "tokenizer_sha256": "b" * 64}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    fpt = cfg["accounting"]["flops_per_token"]
    lines = []
    k_bits = kappa or 0.0
    for step in range(1, 11):
        tok = tokens * step / 10
        ce = 5.0 - 0.2 * step + 0.01 * seed
        kl = min(k_bits, 0.5 * step) if free else 0.0
        lines.append({"kind": "train", "step": step, "tokens": tok, "flops": tok * fpt, "ce": ce,
                      "kl_nats": kl * math.log(2), "kl_bits": kl, "loss": ce, "lr": 1e-3,
                      "grad_norm": 1.0, "tokens_per_s": 1000.0 / (1 + 1.5 * overhead),
                      "time": step})
        if step % 5 == 0:
            v = {"kind": "val", "step": step, "tokens": tok, "flops": tok * fpt,
                 "val_ce": ce + 0.1, "val_bpb": (ce + 0.1) / math.log(2) / 3}
            if free:
                collapsed = k_bits >= 4
                prior = ce + 0.1 + (0.5 if collapsed else 0.01 * k_bits)
                post = ce + 0.1 - 0.6 * k_bits * math.log(2)
                v.update(val_ce=prior, val_ce_prior=prior, val_ce_posterior=post,
                         val_kl_nats=k_bits * math.log(2), val_kl_bits=k_bits,
                         val_elbo=post + k_bits * math.log(2), frac_kl_above_kappa=0.1,
                         val_bpb=prior / math.log(2) / 3)
            lines.append(v)
    lines.append({"kind": "final", "step": 10, "tokens": tokens, "flops": tokens * fpt,
                  "wall_s": 10.0})
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines),
                                     encoding="utf-8")
    rng = np.random.default_rng([seed, int(10 * (kappa or 0)), len(arm)])
    tasks = {}
    for task, (primary, keys, hib, n) in TASKS.items():
        items = []
        for i in range(n):
            it = {"doc_id": i}
            for key in keys:
                it[key] = (float(rng.random() < _p(arm, kappa)) if hib
                           else float(1.5 + 0.2 * rng.standard_normal()))
            items.append(it)
        metrics = {}
        for key in keys:
            name = f"pass@1_{key}" if task == "humaneval_plus" else key
            vals = np.array([it[key] for it in items])
            metrics[name] = {"value": float(vals.mean()),
                             "stderr": float(vals.std(ddof=1) / math.sqrt(n)), "n": n}
        tasks[task] = {"primary": primary, "higher_is_better": hib, "n": n, "fewshot": 0,
                       "metrics": metrics, "items": items if with_items else []}
    ev = {"schema": "ftbench-eval-v1", "run_id": rid, "checkpoint": f"runs/{rid}/final.pt",
          "suite": "lm-eval", "arm": cfg["arm"], "z_mode": "prior", "k": 1, "leaks": False,
          "seed": 0, "limit": None,
          "versions": {"lm_eval": "0.4.13", "evalplus": "0.3.1", "torch": "2.13.0"},
          "data_checksums": {"gsm8k/test.jsonl": "c" * 64}, "git_commit": "f" * 40,
          "elapsed_s": 1.0, "requests_per_s": 10.0, "tasks": tasks}
    (d / "eval").mkdir(exist_ok=True)
    (d / "eval" / "lm-eval.json").write_text(json.dumps(ev), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="results")
    ap.add_argument("--name", default="fake")
    ap.add_argument("--pending", nargs="*", default=[])
    a = ap.parse_args()
    print(write_fake_sweep(a.root, a.name, pending=tuple(a.pending)))


if __name__ == "__main__":
    main()
