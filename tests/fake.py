"""Test data: fabricated result files laid out per docs/RESULTS.md (tests import it as
`from fake import ...`; pytest puts tests/ on the path).

`write_fake_sweep(root, name)` writes a manifest, config.yaml, metrics.jsonl and eval JSON for a
small grid (baseline, Free Transformers, optional equal-FLOPs control), with per-item scores drawn
from fixed probabilities so tests know the answers. Cells listed in `pending` get a manifest entry
and nothing else, as a sweep still running would.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from common.records import (
    EvalFile,
    EvalSpec,
    EvalState,
    Manifest,
    ManifestCell,
    MetricsLine,
    RunRecord,
)

N_LAYERS = 4
TASKS = {  # task -> (primary, item keys, higher_is_better, n items)
    "humaneval_plus": ("pass@1_plus", ["base", "plus"], True, 40),
    "gsm8k": ("exact_match", ["exact_match"], True, 50),
    "arc_easy": ("acc", ["acc", "acc_norm"], True, 60),
    "gsm8k_gold_bpb": ("bpb", ["bpb"], False, 30),
}


def _p(arm: str, kappa: float | None, h: int = 16, seed: int = 0) -> float:
    """Success probability of a fabricated arm (Free Transformers a little better)."""
    if arm == "free":
        return 0.45 if kappa and kappa < 4 else 0.2
    return 0.3


def overhead(h: int) -> float:
    """Fabricated FLOPs overhead of a Free Transformer with H latent bits (0.3 at H = 16)."""
    return 0.3 * h / 16


def _run_id(cell: str, name: str) -> str:
    return hashlib.sha256(f"{name}/{cell}".encode()).hexdigest()[:12]


def _cells(kappas: tuple, seeds: tuple, controls: tuple, hs: tuple) -> list[tuple]:
    """(cell name, arm, kappa, the model's H, matched H, seed) in the grid's order, as
    sweeps.manifest.build writes them."""
    out = [(f"baseline-s{s}", "baseline", None, 0, None, s) for s in seeds]
    out += [(f"free-k{k:g}-H{h}-s{s}", "free", k, h, None, s)
            for h in hs for k in kappas for s in seeds]
    for c in controls:
        if c in ("baseline_flops", "baseline_plus1_flops"):
            out += [(f"{c}-H{h}-s{s}", c, None, 0, h, s) for h in hs for s in seeds]
        else:
            out += [(f"{c}-s{s}", c, None, 0, None, s) for s in seeds]
    return out


def write_fake_sweep(root: str | Path, name: str = "fake", kappas: tuple = (0.5, 2.0, 4.0),
                     seeds: tuple = (0, 1), controls: tuple = ("baseline_flops",),
                     pending: tuple = (), latent_bits: tuple = (16,),
                     flops_budget: float | None = None, provenance: dict | None = None,
                     prob: Callable | None = None, eval_spec_id: str | None = None,
                     tokens: float = 100000, checkpoint_step: int | None = None) -> Path:
    """Write a fabricated sweep; return its manifest path.

    latent_bits: the FT widths (one `baseline_flops` per H and seed); flops_budget: train every
    arm to this many FLOPs (the grid then has no equal-tokens arm); provenance: extra config
    provenance (host, threads, launcher) per arm name, or for all under key "*";
    prob(arm, kappa, h, seed) -> success probability; checkpoint_step: the eval files' (None:
    unknown, so the report has no evaluation points)."""
    root = Path(root)
    cells = []
    for cell, arm, kappa, lb, mh, seed in _cells(kappas, seeds, controls, latent_bits):
        rid = _run_id(cell, name)
        state = "pending" if cell in pending else "done"
        cells.append(ManifestCell(cell=cell, arm=arm, kappa_bits=kappa, latent_bits=lb,
                                  match_latent_bits=mh, seed=seed, run_id=rid, state=state,
                                  job_id=f"local-{rid[:4]}", eval=EvalState(state=state),
                                  extra={"overrides": []}))
        if state != "done":
            continue
        prov = dict((provenance or {}).get("*", {}))
        prov.update((provenance or {}).get(arm, {}))
        h = lb or mh or 0
        p = (prob or _p)(arm, kappa, h, seed)
        _write_run(root / "runs" / rid, rid, arm, kappa, seed, h=h, p=p,
                   flops_budget=flops_budget, prov=prov, tokens=tokens, ckpt_step=checkpoint_step)
    man = Manifest(name=name, cells=cells, grid={
        "kappa_bits": list(kappas), "latent_bits": list(latent_bits), "seeds": list(seeds),
        "preset": "tiny", "data": "stdlib", "tokens": None if flops_budget else tokens,
        "flops": flops_budget, "controls": list(controls)}, eval_spec_id=eval_spec_id,
        extra={"created": "2026-01-01T00:00:00Z", "git_commit": "f" * 40, "launcher": "local",
               "shared": {"lr": 1e-3}, "data_checksums": {"stdlib": "a" * 64}}).to_json()
    path = root / "sweeps" / name / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(man, indent=1), encoding="utf-8")
    return path


def _write_run(d: Path, rid: str, arm: str, kappa: float | None, seed: int, h: int = 16,
               p: float = 0.3, flops_budget: float | None = None, prov: dict | None = None,
               tokens: float = 100000, ckpt_step: int | None = None) -> None:
    """A run's config.yaml, metrics.jsonl and eval file; N_LAYERS layers (the +1 controls one
    more)."""
    d.mkdir(parents=True, exist_ok=True)
    free = arm == "free"
    layers = N_LAYERS + (1 if arm.startswith("baseline_plus1") else 0)
    base_fpt = 1.0e6 * layers / N_LAYERS
    ovh = overhead(h) if free else 0.0
    fpt = base_fpt * (1 + ovh)
    ft_fpt = 1.0e6 * (1 + overhead(h))  # the FT this arm is matched to
    if flops_budget:
        tokens = flops_budget / fpt
    elif arm in ("baseline_flops", "baseline_plus1_flops"):
        tokens = tokens * ft_fpt / fpt
    cfg = RunRecord(
        run_id=rid, arm="free" if free else "baseline",
        model={"vocab_size": 512, "dim": 64, "n_layers": layers,
               "latent_bits": h if free else 0, "kappa_bits": kappa or 0.5},
        data={"name": "stdlib"}, optim={"lr": 1e-3},
        train={"seed": seed, "seq_len": 128, "batch_size": 8, "grad_accum": 1,
               "tokens": tokens, "flops": flops_budget,
               "compute_match": "flops" if arm.endswith("_flops") else None,
               "match_latent_bits": h or 16},
        accounting={"params": {"total": 1000000}, "flops_per_token": fpt,
                    "flops_per_token_baseline_part": base_fpt, "flops_overhead": ovh,
                    "tokens": tokens, "flops": tokens * fpt, "tokens_per_step": 1024},
        provenance={"git_commit": "f" * 40, "git_dirty": False, "argv": ["fake"],
                    "created": "2026-01-01T00:00:00Z",
                    "versions": {"python": "3.11", "torch": "2.13.0"},
                    "data_checksums": {"stdlib": "a" * 64}, "tokenizer_sha256": "b" * 64,
                    **(prov or {})})
    (d / "config.yaml").write_text(yaml.safe_dump(cfg.to_json(), sort_keys=False),
                                   encoding="utf-8")
    lines = []
    k_bits = kappa or 0.0
    for step in range(1, 11):
        tok = tokens * step / 10
        ce = 5.0 - 0.2 * step + 0.01 * seed
        kl = min(k_bits, 0.5 * step) if free else 0.0
        lines.append({"kind": "train", "step": step, "tokens": tok, "flops": tok * fpt, "ce": ce,
                      "kl_nats": kl * math.log(2), "kl_bits": kl, "loss": ce, "lr": 1e-3,
                      "grad_norm": 1.0, "tokens_per_s": 1000.0 / (1 + 1.5 * ovh),
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
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps(MetricsLine.from_json(x).to_json()) + "\n" for x in lines),
        encoding="utf-8")
    rng = np.random.default_rng([seed, int(10 * (kappa or 0)), len(arm), h,
                                 zlib.crc32(arm.encode())])
    tasks = {}
    for task, (primary, keys, hib, n) in TASKS.items():
        items = []
        for i in range(n):
            it = {"doc_id": i}
            for key in keys:
                it[key] = (float(rng.random() < p) if hib
                           else float(1.5 + 0.2 * rng.standard_normal()))
            items.append(it)
        metrics = {}
        for key in keys:
            name = f"pass@1_{key}" if task == "humaneval_plus" else key
            vals = np.array([it[key] for it in items])
            metrics[name] = {"value": float(vals.mean()),
                             "stderr": float(vals.std(ddof=1) / math.sqrt(n)), "n": n}
        tasks[task] = {"primary": primary, "higher_is_better": hib, "n": n, "fewshot": 0,
                       "metrics": metrics, "items": items}
        if task in GEN_TASKS:  # generation: the prompt/budget record eval.py writes
            tasks[task]["truncation"] = fake_truncation(n, seed)
    sp = EvalSpec.from_json(fake_spec())
    ev = EvalFile(suite="lm-eval", spec=sp, spec_id=sp.id, run_id=rid,
                  checkpoint=f"runs/{rid}/final.pt", checkpoint_step=ckpt_step,
                  arm=cfg.arm, z_mode="prior", k=1, leaks=False, seed=0, limit=None,
                  tasks=tasks,
                  extra={"versions": {"lm_eval": "0.4.13", "evalplus": "0.3.1",
                                      "torch": "2.13.0"},
                         "data_checksums": {"gsm8k/test.jsonl": "c" * 64},
                         "git_commit": "f" * 40, "elapsed_s": 1.0, "requests_per_s": 10.0})
    (d / "eval").mkdir(exist_ok=True)
    (d / "eval" / "lm-eval.json").write_text(json.dumps(ev.to_json()), encoding="utf-8")


GEN_TASKS = ("humaneval_plus", "gsm8k")


def fake_truncation(n: int, seed: int) -> dict:
    """A truncation record (docs/RESULTS.md) with `seed + 1` prompts cut by up to 40 tokens."""
    cut = min(n, seed + 1)
    return {"n_requests": n, "n_truncated": cut, "max_tokens_cut": 40 + seed,
            "min_prompt_tokens_kept": 128, "gen_budget_min": 128, "n_budget_shrunk": cut + 2,
            "gen_budget_requested": 256}


def spec_id(spec: dict) -> str:
    """First 12 hex of sha256 of the canonical JSON of a spec (as docs/RESULTS.md defines it;
    written out here, independently of common.records, for the tests to check against)."""
    canon = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def fake_spec(limit: int | None = None) -> dict:
    """The eval spec the fabricated files carry (docs/RESULTS.md)."""
    return {"suite": "lm-eval", "tasks": sorted(TASKS), "limit": limit, "z_mode": "prior",
            "k": 1, "fewshot": None, "gen_tokens": 256,
            "data_checksums": {"gsm8k/test.jsonl": "c" * 64}}


def tiny(**kw: object) -> object:
    """The tests' small ModelConfig (vocabulary 97, 4 layers of width 32, GQA 4:2, 64
    positions, untied), with `kw` over it."""
    from model import ModelConfig

    return ModelConfig(**{**dict(vocab_size=97, dim=32, n_layers=4, n_heads=4, n_kv_heads=2,
                                 ffn_dim=64, max_seq_len=64, tie_embeddings=False), **kw})


def seeded(cfg: object, seed: int = 0, dtype: object = None) -> object:
    """build_model(cfg) with torch seeded at `seed`, in eval mode (and `dtype` if given)."""
    import torch

    from model import build_model

    torch.manual_seed(seed)
    m = build_model(cfg).eval()
    return m if dtype is None else m.to(dtype)

