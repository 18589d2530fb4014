"""The bench's sections, one function each: train, free (overhead), mapper, generate, eval."""

from __future__ import annotations

import gc
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import model as ftmodel
from experiments.eval.hf_export import to_llama
from model import count_parameters as n_params
from model.free_transformer import latent_embedding, sample_codes

from .contenders import (
    XT_MISMATCHES,
    dense_mapper,
    exported_baseline,
    make_optimizer,
    mc_requests,
    mmlu_requests,
    our_config,
    recompute_generate,
    train_step_fn,
    xt_free_transformer,
)
from .harness import (
    Ctx,
    interleaved,
    matmul_fn,
    paired_ratio,
    peak_alloc_bytes,
    summary,
)


def _tokens(ctx: Ctx, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (ctx.size.batch, ctx.size.seq_len + 1), generator=g).to(
        ctx.device)


def _train_entry(times: list[float], tokens_per_step: int, flops_per_token: float | None,
                 matmul_flops_s: float, params: int) -> dict[str, Any]:
    med = statistics.median(times)
    tps = tokens_per_step / med
    e: dict[str, Any] = {"step_s": summary(times), "tokens_per_s": tps, "params": params,
                         "tokens_per_step": tokens_per_step}
    if flops_per_token is not None:
        e["flops_per_token"] = flops_per_token
        e["model_flops_s"] = flops_per_token * tps
        e["frac_of_matmul"] = e["model_flops_s"] / matmul_flops_s
    return e


def section_train(ctx: Ctx) -> dict[str, Any]:
    s, dev = ctx.size, ctx.device
    torch.manual_seed(0)
    cfg = our_config(s)
    T = s.seq_len
    tok = _tokens(ctx, cfg.vocab_size)
    out: dict[str, Any] = {"batch": s.batch, "seq_len": T, "config": cfg.to_dict()}

    # --- group 1: baseline vs HF LlamaForCausalLM (+ the matmul reference)
    ours = ftmodel.build_model(cfg).to(dev)
    hf = to_llama(ours, attn_implementation="sdpa").to(dev)  # same shape, same weights
    with torch.no_grad():
        ours.eval()
        hf.eval()
        parity = float((ours(tok[:1, :-1]).logits - hf(input_ids=tok[:1, :-1]).logits)
                       .abs().max())
    mm, mm_flops = matmul_fn(s.matmul_n, dev)
    if n_params(ours) != n_params(hf):
        ctx.notes.append(f"param count differs: ours {n_params(ours)} vs HF {n_params(hf)}")
    times = interleaved({"ours": train_step_fn("ours", ours, tok),
                         "hf": train_step_fn("hf", hf, tok), "matmul": mm},
                        s.reps, s.warmup, dev)
    mm_fs = mm_flops / statistics.median(times["matmul"])
    fpt = ftmodel.train_flops_per_token(cfg, T).total
    out["baseline_vs_hf"] = {
        "matmul": {"n": s.matmul_n, "s": summary(times["matmul"]), "flops_s": mm_fs},
        "ours": _train_entry(times["ours"], s.batch * T, fpt, mm_fs, n_params(ours)),
        "hf": _train_entry(times["hf"], s.batch * T, fpt, mm_fs, n_params(hf)),
        "speedup_ours_over_hf": paired_ratio(times["hf"], times["ours"]),
        "hf_attn_implementation": hf.config._attn_implementation,
        "hf_logits_max_abs_diff_same_weights": parity,
    }
    return out  # the runner collects garbage after every section


def section_free(ctx: Ctx) -> dict[str, Any]:
    """Our baseline, our FT at each H, x-transformers' FT at xt_bits: one interleaved loop (the
    FT's step-time overhead beside the analytic FLOPs ratio, ours vs x-transformers')."""
    s, dev = ctx.size, ctx.device
    cfg = our_config(s)
    T = s.seq_len
    tok = _tokens(ctx, cfg.vocab_size, seed=1)
    mm, mm_flops = matmul_fn(s.matmul_n, dev)
    fns: dict[str, Callable[[], object]] = {"matmul": mm}
    params: dict[str, int] = {}
    torch.manual_seed(0)
    m = ftmodel.build_model(cfg).to(dev)
    params["baseline"] = n_params(m)
    fns["baseline"] = train_step_fn("ours", m, tok)
    for H in s.overhead_bits:
        torch.manual_seed(0)
        m = ftmodel.build_model(cfg.replace(latent_bits=H)).to(dev)
        params[f"H{H}"] = n_params(m)
        fns[f"H{H}"] = train_step_fn("ours", m, tok)
    xt_error = None
    try:
        for H in s.xt_bits:
            torch.manual_seed(0)
            m = xt_free_transformer(cfg.replace(latent_bits=H)).to(dev)
            params[f"xt_H{H}"] = n_params(m)
            fns[f"xt_H{H}"] = train_step_fn("xt", m, tok)
    except ImportError as e:
        xt_error = f"x-transformers not importable: {e}"
    del m
    times = interleaved(fns, s.reps, s.warmup, dev)
    mm_fs = mm_flops / statistics.median(times["matmul"])
    base_flops = ftmodel.train_flops_per_token(cfg, T).total
    ntok = s.batch * T
    ov: dict[str, Any] = {
        "n_layers": cfg.n_layers, "paper_overhead": 1.0 / cfg.n_layers, "batch": s.batch,
        "seq_len": T,
        "matmul": {"n": s.matmul_n, "s": summary(times["matmul"]), "flops_s": mm_fs},
        "baseline": _train_entry(times["baseline"], ntok, base_flops, mm_fs,
                                 params["baseline"]),
        "bits": {}}
    for H in s.overhead_bits:
        fb = ftmodel.train_flops_per_token(cfg.replace(latent_bits=H), T)
        ov["bits"][f"H{H}"] = {
            "H": H, **_train_entry(times[f"H{H}"], ntok, fb.total, mm_fs, params[f"H{H}"]),
            "step_ratio": paired_ratio(times[f"H{H}"], times["baseline"]),
            "analytic_flops_ratio": fb.total / base_flops,
            "mapper_backward_share": fb.mapper_backward / fb.total,
            "flops_breakdown": asdict(fb),
        }
    # the same ratios analytically at the paper's presets, for scale
    ov["analytic_at_paper_presets"] = {
        name: {f"H{H}": ftmodel.train_flops_per_token(
            ftmodel.get_preset(name, latent_bits=H), 4096).total
            / ftmodel.train_flops_per_token(ftmodel.get_preset(name), 4096).total
            for H in (8, 16)} | {"1/L": 1.0 / ftmodel.get_preset(name).n_layers}
        for name in ("1.5B", "8B")}
    xt: dict[str, Any] = {"mismatches": XT_MISMATCHES}
    if xt_error:
        xt = {"skipped": xt_error}
    else:
        for H in s.xt_bits:
            k = f"H{H}"
            xt[k] = {"ours": ov["bits"][k] if k in ov["bits"] else None,
                     "xt": _train_entry(times[f"xt_{k}"], ntok, None, mm_fs,
                                        params[f"xt_{k}"]),
                     "speedup_ours_over_xt": paired_ratio(times[f"xt_{k}"], times[k])}
    return {"overhead": ov, "ft_vs_xtransformers": xt}


def section_mapper(ctx: Ctx) -> dict[str, Any]:
    s, dev = ctx.size, ctx.device
    D = s.mapper_dim
    rows = []
    for H in s.mapper_bits:
        for N in s.mapper_tokens:
            g = torch.Generator().manual_seed(H * 7919 + N)
            o = torch.randn(N, H, generator=g).to(dev).requires_grad_(True)
            w = (0.02 * torch.randn(D, 1 << H, generator=g)).to(dev).requires_grad_(True)
            codes = sample_codes(o.detach(), g)
            up = torch.randn(N, D, generator=g).to(dev)

            def run(f: Callable[..., torch.Tensor], o=o, w=w, codes=codes, up=up
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                o.grad = w.grad = None
                y = f(o, w, codes)
                y.backward(up)
                return y.detach(), o.grad, w.grad

            ours = lambda run=run: run(latent_embedding)
            dense = lambda run=run: run(dense_mapper)
            ya, ga, wa = ours()
            yb, gb, wb = dense()
            err = {"value": float((ya - yb).abs().max()),
                   "grad_logits_rel": float((ga - gb).abs().max() / gb.abs().max().clamp_min(
                       1e-30)),
                   "grad_weight": float((wa - wb).abs().max())}
            del ya, ga, wa, yb, gb, wb
            o.grad = w.grad = None
            mem_ours = peak_alloc_bytes(ours, dev)
            o.grad = w.grad = None
            mem_dense = peak_alloc_bytes(dense, dev)
            o.grad = w.grad = None
            times = interleaved({"ours": ours, "dense": dense}, s.reps, 1, dev)
            o.grad = w.grad = None
            rows.append({
                "H": H, "tokens": N, "dim": D,
                "ours_s": summary(times["ours"]), "dense_s": summary(times["dense"]),
                "speedup": paired_ratio(times["dense"], times["ours"]),
                "ours_peak_bytes": mem_ours, "dense_peak_bytes": mem_dense,
                "memory_ratio": mem_ours / max(mem_dense, 1),
                "weight_grad_bytes": 4 * D * (1 << H),
                "max_abs_err": err,
            })
            del o, w, codes, up
            gc.collect()
    return {"method": "peak of the running sum of torch allocator events (torch.profiler "
                      "profile_memory) during forward+backward; includes the output and the "
                      "gradients it creates (W.grad is D*2^H*4 bytes in both)", "rows": rows}


@torch.no_grad()
def section_generate(ctx: Ctx) -> dict[str, Any]:
    s, dev = ctx.size, ctx.device
    cfg = our_config(s)
    work = tempfile.TemporaryDirectory(prefix="ftbench-gen-")
    exp = exported_baseline(ctx, Path(work.name))
    base = exp.ours
    torch.manual_seed(0)
    Hg = max(s.overhead_bits)
    ft = ftmodel.build_model(cfg.replace(latent_bits=Hg)).to(dev).eval()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, cfg.vocab_size, (1, s.gen_prompt), generator=g).to(dev)
    n = s.gen_new
    out: dict[str, Any] = {"batch": 1, "prompt_len": s.gen_prompt, "new_tokens": n,
                           "decoding": "greedy"}
    fns: dict[str, Callable[[], object]] = {
        "kv_cache": lambda: base.generate(prompt, n),
        "recompute": lambda: recompute_generate(base, prompt, n),
        f"ft_H{Hg}_kv_cache": lambda: ft.generate(prompt, n, z="prior"),
    }
    kv_tokens = base.generate(prompt, n).tokens[0]
    re_tokens = recompute_generate(base, prompt, n)[0].tolist()
    out["kv_equals_recompute"] = kv_tokens == re_tokens
    try:
        hf = exp.hf
        out["hf_export"] = exp.how
        mask = torch.ones_like(prompt)

        def hf_gen() -> torch.Tensor:
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, use_cache=True)

        fns["hf_generate"] = hf_gen
        hf_tokens = hf_gen()[0, s.gen_prompt:].tolist()
        agree = sum(int(a == b) for a, b in zip(hf_tokens, kv_tokens, strict=False))
        out["hf_token_agreement"] = agree / max(1, len(kv_tokens))
    except Exception as e:  # noqa: BLE001
        out["hf"] = {"skipped": f"export failed: {type(e).__name__}: {e}"}
    times = interleaved(fns, s.reps, 1, dev)
    work.cleanup()
    for k, v in times.items():
        out[k] = {"s": summary(v), "tokens_per_s": n / statistics.median(v)}
    out["kv_speedup_over_recompute"] = paired_ratio(times["recompute"], times["kv_cache"])
    if "hf_generate" in times:
        out["kv_speedup_over_hf"] = paired_ratio(times["hf_generate"], times["kv_cache"])
    return out


class _StopSequences:
    """HF StoppingCriteria for token stop sequences: a (B,) bool, as HF wants per row."""

    def __init__(self, stops: list[list[int]], prompt_len: int) -> None:
        self.stops = [torch.tensor(x) for x in stops]
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        new = input_ids.shape[1] - self.prompt_len
        for st in self.stops:
            if new >= len(st):
                done |= (input_ids[:, -len(st):] == st.to(input_ids.device)).all(1)
        return done


def _cut_at_stop(row: list[int], stops: list[list[int]]) -> tuple[list[int], bool]:
    """The tokens before the first completed stop sequence (as our generate returns them)."""
    for i in range(1, len(row) + 1):
        for st in stops:
            if i >= len(st) and row[i - len(st):i] == st:
                return row[:i - len(st)], True
    return row, False


@torch.no_grad()
def section_generate_batch(ctx: Ctx) -> dict[str, Any]:
    """Batched greedy generation, mixed prompt lengths and stop sequences: ours vs HF generate.
    Stop sequences are bigrams from other rows' unstopped output, so rows end at different
    steps; both contenders get the same list for the whole batch."""
    from transformers import StoppingCriteriaList

    s, dev = ctx.size, ctx.device
    cfg = our_config(s)
    work = tempfile.TemporaryDirectory(prefix="ftbench-genb-")
    exp = exported_baseline(ctx, Path(work.name))
    base, B, n = exp.ours, s.gen_batch, s.gen_new
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(max(1, s.gen_prompt // 4), s.gen_prompt + 1, (B,), generator=g).tolist()
    rows = [torch.randint(1, cfg.vocab_size, (L,), generator=g).tolist() for L in lens]
    free = base.generate(rows, n).tokens
    stops = []
    for b in range(0, B, 2):
        e = max(2, round(n * (b + 1) / (B + 1)))
        if len(free[b]) >= e and free[b][e - 2:e] not in stops:
            stops.append(free[b][e - 2:e])
    ours = base.generate(rows, n, stop=stops)
    P = max(lens)
    ids = torch.zeros(B, P, dtype=torch.long)
    mask = torch.zeros(B, P, dtype=torch.long)
    for b, r in enumerate(rows):  # left padding, as HF decoder-only generation needs
        ids[b, P - len(r):] = torch.tensor(r)
        mask[b, P - len(r):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    hf = exp.hf
    crit = StoppingCriteriaList([_StopSequences(stops, P)])

    def hf_gen() -> torch.Tensor:
        return hf.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                           use_cache=True, stopping_criteria=crit)

    hf_rows = [_cut_at_stop(r, stops) for r in hf_gen()[:, P:].tolist()]
    fns: dict[str, Callable[[], object]] = {
        "ours": lambda: base.generate(rows, n, stop=stops), "hf_generate": hf_gen}
    times = interleaved(fns, s.reps, 1, dev)
    work.cleanup()
    kept = sum(len(t) for t in ours.tokens)
    out: dict[str, Any] = {
        "batch": B, "prompt_lens": lens, "max_new_tokens": n, "decoding": "greedy",
        "stop_sequences": len(stops), "rows_stopped": sum(ours.stopped),
        "new_tokens_kept": kept, "hf_export": exp.how,
        "hf_rows_equal": sum(int(a == (t, st)) for a, t, st in
                             zip(hf_rows, ours.tokens, ours.stopped, strict=True)),
    }
    for k, v in times.items():
        out[k] = {"s": summary(v), "tokens_per_s": kept / statistics.median(v)}
    out["speedup_ours_over_hf"] = paired_ratio(times["hf_generate"], times["ours"])
    return out


def section_eval(ctx: Ctx) -> dict[str, Any]:
    """MC loglikelihood requests/s: experiments.eval.lm_adapter vs lm-eval's hf backend."""
    from lm_eval.models.huggingface import HFLM

    from experiments.corpus.tokenizer import BPETokenizer
    from experiments.eval.lm_adapter import FTBenchLM

    s, dev = ctx.size, ctx.device
    cfg = our_config(s)
    work = tempfile.TemporaryDirectory(prefix="ftbench-eval-")
    exp = exported_baseline(ctx, Path(work.name))
    tok, texts, how = exp.tok, exp.texts, exp.how
    bs = 16
    ours = FTBenchLM(model=exp.ours, tokenizer=BPETokenizer(tok), batch_size=bs,
                        device=str(dev), progress=False)
    # lm-eval's hf backend loads the export as a user would
    theirs = HFLM(pretrained=str(exp.hf_dir), batch_size=bs, device=str(dev), dtype="float32",
                  max_length=cfg.max_seq_len)
    tasks = {"mc_continuations": mc_requests(texts, s.eval_requests),
             "mmlu_5shot": mmlu_requests(texts, s.eval_requests)}
    out: dict[str, Any] = {
        "hf_attn_implementation": getattr(theirs.model.config, "_attn_implementation", None),
        "batch_size": bs, "hf_export": how, "tasks": {}}
    for name, reqs in tasks.items():
        a = [x[0] for x in ours.loglikelihood(reqs, disable_tqdm=True)]
        b = [x[0] for x in theirs.loglikelihood(reqs, disable_tqdm=True)]
        times = interleaved({"ours": lambda r=reqs: ours.loglikelihood(r, disable_tqdm=True),
                             "hf": lambda r=reqs: theirs.loglikelihood(r, disable_tqdm=True)},
                            s.reps, 1, dev)
        n = len(reqs)
        out["tasks"][name] = {
            "requests": n,
            "contexts": len({r.args[0] for r in reqs}),
            "tokens_per_request_mean": statistics.mean(
                len(tok.encode(r.args[0] + r.args[1]).ids) for r in reqs),
            "max_abs_loglik_diff": max(abs(x - y) for x, y in zip(a, b, strict=True)),
            "ours": {"s": summary(times["ours"]),
                     "requests_per_s": n / statistics.median(times["ours"])},
            "hf": {"s": summary(times["hf"]),
                   "requests_per_s": n / statistics.median(times["hf"])},
            "speedup_ours_over_hf": paired_ratio(times["hf"], times["ours"]),
        }
    work.cleanup()
    return out


def section_save(ctx: Ctx) -> dict[str, Any]:
    """A step checkpoint's staging: DCP's default (a fresh copy per save) vs the trainer's
    stager (buffers reused, pinned on CUDA)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from experiments.train.checkpointer import stager
    from experiments.train.parallel import training_state

    dev = ctx.device
    torch.manual_seed(0)
    m = ftmodel.build_model(our_config(ctx.size)).to(dev)
    opt = make_optimizer(m)
    tok = _tokens(ctx, m.cfg.vocab_size)
    m(tok[:, :-1], targets=tok[:, 1:]).loss.backward()
    opt.step()  # AdamW's moments exist, as in every step checkpoint
    sd = training_state(m, opt)
    cached = stager(dev.type == "cuda")

    def default() -> None:  # what dcp.async_save makes and closes per save
        st = DefaultStager(StagingOptions(False, False, False, False))
        st.stage(sd)
        st.close()

    times = interleaved({"dcp_default": default, "cached": lambda: cached.stage(sd)},
                        ctx.size.reps, 1, dev)  # the warm-up's save allocates the cache
    cached.close()
    nbytes = sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(sd)
                 if isinstance(t, torch.Tensor))
    return {"bytes": nbytes, "dcp_default_s": summary(times["dcp_default"]),
            "cached_s": summary(times["cached"]),
            "speedup": paired_ratio(times["dcp_default"], times["cached"]),
            "cpu_only": "pinned staging, pinned batches, no host sync per step and the "
                        "compiled chunked loss act on CUDA only (dev/gpu/second_contact.sh)"}


SECTIONS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "train": section_train, "free": section_free, "mapper": section_mapper,
    "generate": section_generate, "generate_batch": section_generate_batch,
    "eval": section_eval, "save": section_save,
}


