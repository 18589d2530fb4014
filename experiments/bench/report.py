"""The bench's verdicts (targets) and its Markdown (docs/BENCH.md for the full size)."""

from __future__ import annotations

from typing import Any


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    sec = res["sections"]
    t: list[dict[str, Any]] = []

    def add(name: str, goal: str, value: float | None, met: bool | None) -> None:
        t.append({"target": name, "goal": goal, "measured": value, "met": met})

    tr = sec.get("train", {}).get("baseline_vs_hf")
    if tr:
        v = tr["speedup_ours_over_hf"]["median"]
        add("baseline training throughput vs HF", ">= 1.2x", v, v >= 1.2)
    ov = sec.get("free", {}).get("overhead", {})
    if ov.get("bits"):
        h = min(ov["bits"].values(), key=lambda r: r["H"])
        v = h["step_ratio"]["median"] - 1.0
        goal = ov["paper_overhead"] + 0.02
        add(f"FT/baseline step-time overhead at H={h['H']}",
            f"<= 1/L + 2% = {goal:.3f}", v, v <= goal)
    mp = sec.get("mapper", {}).get("rows")
    if mp:
        r = max(mp, key=lambda r: (r["H"], r["tokens"]))
        add(f"mapper peak memory ours/dense at H={r['H']}, {r['tokens']} tokens", "<= 0.1",
            r["memory_ratio"], r["memory_ratio"] <= 0.1)
    gen = sec.get("generate", {})
    if "kv_speedup_over_recompute" in gen:
        v = gen["kv_speedup_over_recompute"]["median"]
        add(f"KV cache vs recompute at {gen['new_tokens']} new tokens", ">= 5x", v, v >= 5)
    gb = sec.get("generate_batch", {})
    if "speedup_ours_over_hf" in gb:
        v = gb["speedup_ours_over_hf"]["median"]
        add(f"batched generation ours vs HF generate at batch {gb['batch']}", ">= 1.5x", v,
            v >= 1.5)
    mmlu = sec.get("eval", {}).get("tasks", {}).get("mmlu_5shot", {})
    v = mmlu["speedup_ours_over_hf"]["median"] if "speedup_ours_over_hf" in mmlu else None
    add("5-shot MMLU-like MC eval ours vs lm-eval hf", ">= 2x", v, None if v is None else v >= 2)
    return t


def _med(d: dict[str, Any]) -> str:
    return f"{d['median']:.3f} [{d['min']:.3f}, {d['max']:.3f}]"


def _x(d: dict[str, Any]) -> str:
    return f"{d['median']:.2f}x [{d['min']:.2f}, {d['max']:.2f}]"


def _mb(b: float) -> str:
    return f"{b / 2**20:.1f}"


def _load(la: list[float] | None) -> str:
    return "n/a" if not la else "/".join(f"{x:.1f}" for x in la)


def _table(head: str, rows: list[list[Any]]) -> list[str]:
    """A Markdown table: `head` is its columns joined by ' | ', each row a list of cells."""
    return [f"| {head} |", "|" + "---|" * (head.count("|") + 1),
            *(f"| {' | '.join(map(str, r))} |" for r in rows), ""]


def _train(tr: dict[str, Any], st: dict[str, Any]) -> list[str]:
    b = tr["baseline_vs_hf"]
    rows = [[name, f"{e['params']:,}", _med(e["step_s"]), f"{e['tokens_per_s']:.0f}",
             f"{e['model_flops_s'] / 1e9:.1f}", f"{e['frac_of_matmul']:.0%}", sp]
            for name, e, sp in (("ours baseline", b["ours"], ""),
                                ("HF LlamaForCausalLM (sdpa)", b["hf"],
                                 _x(b["speedup_ours_over_hf"])))]
    return ["## Training step (fwd + bwd + AdamW)", "",
            f"B={tr['batch']}, T={tr['seq_len']}, preset `{st['preset']}`, fp32. "
            "Model FLOPs from `model.train_flops_per_token`; 'of matmul' = model FLOP/s over "
            f"a {b['matmul']['n']}^3 fp32 matmul measured in the same loop "
            f"({b['matmul']['flops_s'] / 1e9:.1f} GFLOP/s): the CPU analogue of MFU. "
            "HF gets our baseline's weights; max |logit difference| = "
            f"{b['hf_logits_max_abs_diff_same_weights']:.1e}, so the configs are identical.", "",
            *_table("contender | params | step s | tokens/s | model GFLOP/s | of matmul | "
                    "speedup of ours", rows)]


def _free(fr: dict[str, Any]) -> list[str]:
    ov, xt = fr["overhead"], fr["ft_vs_xtransformers"]
    bl = ov["baseline"]
    rows = [["baseline", f"{bl['params']:,}", _med(bl["step_s"]), f"{bl['tokens_per_s']:.0f}",
             1, 1, "", "", f"{bl['frac_of_matmul']:.0%}"]]
    rows += [[f"FT H={r['H']}", f"{r['params']:,}", _med(r["step_s"]),
              f"{r['tokens_per_s']:.0f}", _x(r["step_ratio"]),
              f"{r['analytic_flops_ratio']:.3f}", f"{1 + ov['paper_overhead']:.3f}",
              f"{r['mapper_backward_share']:.1%}", f"{r['frac_of_matmul']:.0%}"]
             for r in ov["bits"].values()]
    L = ["## Free Transformer overhead (step time FT / our baseline)", "",
         f"B={ov['batch']}, T={ov['seq_len']}, fwd + bwd + AdamW, all contenders of this "
         f"and the next table interleaved in one loop. Paper: one extra block, "
         f"1/L = {ov['paper_overhead']:.3f} at L={ov['n_layers']}. The analytic ratio "
         "(`model.train_flops_per_token`) counts the encoder block, its readout and the "
         "mapper's backward, which is dense over the 2^H codes (2·D·2^H FLOPs per token "
         "for dL/dG alone).", "",
         *_table("contender | params | step s | tokens/s | measured ratio | analytic FLOPs "
                 "ratio | 1 + 1/L | mapper bwd share of FLOPs | of matmul", rows)]
    if pp := ov.get("analytic_at_paper_presets", {}):
        L[-1:] = ["", "Analytic FLOPs ratio at the paper's presets (T=4096): " + "; ".join(
            f"{n}: H=8 {v['H8']:.3f}, H=16 {v['H16']:.3f} (1 + 1/L = {1 + v['1/L']:.3f})"
            for n, v in pp.items()) + ".", ""]
    L += ["## Our Free Transformer vs x-transformers' FreeTransformer", ""]
    if "skipped" in xt:
        return [*L, f"Skipped: {xt['skipped']}", ""]
    rows = [[k[1:], f"{r['ours']['params']:,}", f"{r['xt']['params']:,}",
             _med(r["ours"]["step_s"]), _med(r["xt"]["step_s"]),
             f"{r['ours']['tokens_per_s']:.0f}", f"{r['xt']['tokens_per_s']:.0f}",
             _x(r["speedup_ours_over_xt"])] for k, r in xt.items() if k.startswith("H")]
    return [*L, *_table("H | ours params | x-t params | ours step s | x-t step s | "
                        "ours tokens/s | x-t tokens/s | speedup of ours", rows),
            "Mismatches with x-transformers we could not remove:", "",
            *(f"- {m}" for m in xt["mismatches"]), ""]


def _mapper(mp: dict[str, Any]) -> list[str]:
    rows = [[r["H"], r["tokens"], _med(r["ours_s"]), _med(r["dense_s"]), _x(r["speedup"]),
             _mb(r["ours_peak_bytes"]), _mb(r["dense_peak_bytes"]),
             f"{r['memory_ratio']:.3f}", _mb(r["weight_grad_bytes"])] for r in mp["rows"]]
    return ["## Binary mapper: `latent_embedding` vs dense `(one_hot + G - G.detach()) @ W.T`",
            "", f"Forward + backward, D={mp['rows'][0]['dim']}. Memory: {mp['method']}.", "",
            *_table("H | tokens | ours s | dense s | speedup | ours peak MiB | dense peak MiB "
                    "| ours/dense memory | W.grad MiB", rows)]


def _generate(gen: dict[str, Any]) -> list[str]:
    rows = [[k, _med(v["s"]), f"{v['tokens_per_s']:.1f}"] for k, v in gen.items()
            if isinstance(v, dict) and "tokens_per_s" in v]
    L = ["## Generation", "",
         f"Batch 1, prompt {gen['prompt_len']} tokens, {gen['new_tokens']} new tokens, "
         f"greedy. KV-cache output equals recompute output: {gen['kv_equals_recompute']}.", "",
         *_table("contender | s | tokens/s", rows),
         f"KV cache over recompute: {_x(gen['kv_speedup_over_recompute'])}."]
    if "hf_export" in gen:
        L.append(f"HF model from {gen['hf_export']}.")
    if "kv_speedup_over_hf" in gen:
        L.append(f"KV cache (ours) over HF `generate`: {_x(gen['kv_speedup_over_hf'])}; "
                 f"greedy tokens agreeing with HF: {gen['hf_token_agreement']:.0%}.")
    elif "hf" in gen:
        L.append(f"HF generate: {gen['hf']['skipped']}.")
    return [*L, ""]


def _generate_batch(gb: dict[str, Any]) -> list[str]:
    rows = [[k, _med(gb[k]["s"]), f"{gb[k]['tokens_per_s']:.1f}"] for k in ("ours", "hf_generate")]
    return ["## Batched generation", "",
            f"Batch {gb['batch']}, prompts of {min(gb['prompt_lens'])}-{max(gb['prompt_lens'])}"
            f" tokens (left-padded), up to {gb['max_new_tokens']} new tokens, greedy, "
            f"{gb['stop_sequences']} stop sequences ({gb['rows_stopped']} rows stopped early);"
            f" {gb['new_tokens_kept']} tokens kept. Rows equal to HF's: "
            f"{gb['hf_rows_equal']}/{gb['batch']}.", "",
            *_table("contender | s | kept tokens/s", rows),
            f"Ours over HF `generate` (same export, StoppingCriteria on the token stop "
            f"sequences): {_x(gb['speedup_ours_over_hf'])}.", ""]


def _eval(ev: dict[str, Any]) -> list[str]:
    L = ["## Evaluation (multiple-choice loglikelihood requests/s)", ""]
    rows = [[name, t["requests"], t["contexts"], f"{t['tokens_per_request_mean']:.0f}",
             _med(t["ours"]["s"]), _med(t["hf"]["s"]), f"{t['ours']['requests_per_s']:.1f}",
             f"{t['hf']['requests_per_s']:.1f}", _x(t["speedup_ours_over_hf"]),
             f"{t['max_abs_loglik_diff']:.1e}"] for name, t in ev.get("tasks", {}).items()]
    return [*L, "Each context runs once into a KV cache and every continuation extends a "
            "copy of it; baseline contexts sharing a few-shot header run the header once "
            "(`experiments.eval.lm_adapter`). lm-eval `hf` runs one forward per context "
            "+ continuation[:-1] group.", "",
            *_table("task type | requests | contexts | tokens/request | ours s | hf s | "
                    "ours req/s | hf req/s | ours over hf | max abs loglik diff", rows),
            "mc_continuations: 4-choice items cut from stdlib text, multi-token "
            "continuations; mmlu_5shot: 4 subjects, each with a fixed 5-shot header, "
            "one-token answer letters (`contenders.mmlu_requests`). Batch size "
            f"{ev['batch_size']} for both, HF model from {ev['hf_export']}.", ""]


def _save(sv: dict[str, Any]) -> list[str]:
    return ["## Checkpoint staging (a step checkpoint's host copy)", "",
            f"Weights and AdamW state, {_mb(sv['bytes'])} MiB: DCP's default stager (a fresh "
            f"copy per save) {_med(sv['dcp_default_s'])} s, the trainer's cached one "
            f"(`experiments.train.checkpointer.stager`) {_med(sv['cached_s'])} s: "
            f"{_x(sv['speedup'])}. Not measurable here: {sv['cpu_only']}.", ""]


def render_markdown(res: dict[str, Any]) -> str:
    m, st, sec = res["machine"], res["settings"], res["sections"]
    L = [f"# Benchmarks (`make bench`, size `{st['size']}`)", "",
         f"Generated by `{res['command']}` into `{res['json_path']}`. "
         "Every figure is the median of "
         f"{st['reps']} reps after warm-up, with [min, max]; contenders of one table ran "
         "interleaved in one process, and ratios are medians of per-rep paired ratios.", "",
         f"Machine: {m['cpu']}, {m['threads']} torch threads "
         f"({m['cpu_count']} CPUs), "
         f"torch {m['torch']}, transformers {m.get('transformers')}, x-transformers "
         f"{m.get('x_transformers')}, lm-eval {m.get('lm_eval')}, device {m['device']}, "
         f"load average (1/5/15 min) at start {_load(m.get('loadavg_start'))}, at end "
         f"{_load(m.get('loadavg_end'))}. On a shared machine absolute times drift with the "
         "load; the ratios, measured pairwise within each rep, are the figures to compare.", ""]
    if tg := res.get("targets", []):
        L += ["## Targets", "", *_table("target | goal | measured | met", [
            [t["target"], t["goal"],
             "not measured" if t["measured"] is None else f"{t['measured']:.3f}",
             "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")] for t in tg])]
    for name, part in (("train", lambda s: _train(s, st)), ("free", _free), ("mapper", _mapper),
                       ("generate", _generate), ("generate_batch", _generate_batch),
                       ("eval", _eval), ("save", _save)):
        if sec.get(name):
            L += part(sec[name])
    if res.get("errors"):
        L += ["## Errors", ""] + [f"- `{k}`: {v.splitlines()[-1]}" for k, v in
                                  res["errors"].items()] + [""]
    if res.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    return "\n".join(L)
