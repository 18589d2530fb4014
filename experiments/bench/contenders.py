"""What the bench compares: our models, x-transformers' Free Transformer, the dense mapper,
cacheless decoding, the HF export of our baseline, and the eval section's requests."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import model as ftmodel
from model.free_transformer import code_bits

from .harness import Ctx, Size


def our_config(size: Size, **kw: Any) -> ftmodel.ModelConfig:
    return ftmodel.get_preset(size.preset, **{**size.overrides, **kw})


XT_MISMATCHES = [
    "x-transformers' SwiGLU input projection has a bias (its GLU ignores ff_no_bias): "
    "+2*ffn_dim parameters per block",
    "x-transformers adds the latent condition to the already-normalised key/value input of the "
    "first tail block; ours normalises x + r (same FLOPs up to one RMSNorm)",
    "x-transformers' forward takes T+1 tokens and trains on T (we pass T+1 so both train on T)",
    "x-transformers' binary mapper materialises the (tokens x 2^H) one-hot and G and runs the "
    "post-sampler as a dense 2^H -> D matmul; ours gathers in the forward and chunks the "
    "backward (this is the point of the comparison, not a config mismatch)",
    "x-transformers' RMSNorm is F.normalize(x) * sqrt(d) * g (no epsilon inside the root); "
    "same cost class, not bit-identical to ours",
    "x-transformers' RoPE base is fixed at 10000 (equal to our preset's rope_theta); its "
    "rotary_emb_dim is set to the full head dim (its default rotates half)",
]


def xt_free_transformer(cfg: ftmodel.ModelConfig) -> torch.nn.Module:
    """x-transformers' FreeTransformer at the config closest to ours."""
    from x_transformers.free_transformer import FreeTransformer as XFT

    half = cfg.n_layers // 2
    return XFT(num_tokens=cfg.vocab_size, dim=cfg.dim, dec_head_depth=half,
               dec_tail_depth=cfg.n_layers - half, max_seq_len=cfg.max_seq_len + 1,
               enc_depth=1, attn_dim_head=cfg.head_dim, heads=cfg.n_heads,
               latent_bits=cfg.latent_bits, kl_loss_threshold=cfg.kappa_bits * math.log(2),
               attn_kv_heads=cfg.n_kv_heads, ff_glu=True, ff_swish=True,
               ff_mult=cfg.ffn_dim / cfg.dim, ff_no_bias=True, attn_flash=True,
               rotary_emb_dim=cfg.head_dim)  # its RoPE base is fixed at 10000 (= ours)


def make_optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
    # The same AdamW (default implementation choice) for every contender.
    return torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))


def train_step_fn(kind: str, m: torch.nn.Module, tokens: torch.Tensor) -> Callable[[], float]:
    """One fwd + bwd + AdamW step; ``tokens`` is (B, T+1)."""
    opt = make_optimizer(m)
    m.train()
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> float:
        if kind == "ours":
            loss = m(inp, targets=tgt).loss
        elif kind == "hf":
            loss = m(input_ids=inp, labels=inp).loss  # HF shifts the labels itself
        elif kind == "xt":
            loss = m(tokens)  # x-transformers splits (B, T+1) into inputs and labels
        else:
            raise ValueError(kind)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def dense_mapper(o: torch.Tensor, w: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The paper's formula, materialised: (one_hot(codes) + G - G.detach()) @ W.T."""
    H = o.shape[-1]
    bits = code_bits(H, o.device)
    log_g = F.logsigmoid(o) @ bits.t() + F.logsigmoid(-o) @ (1.0 - bits).t()
    G = log_g.exp()
    Y = F.one_hot(codes, 1 << H).to(o.dtype)
    return (Y + G - G.detach()) @ w.t()


def recompute_generate(m: torch.nn.Module, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy decoding with no cache: a full forward over the whole sequence every step."""
    seq = prompt
    for _ in range(n):
        nxt = m(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[:, prompt.shape[1]:]


@dataclass
class Exported:
    """Our baseline, its tokenizer, and the HF LlamaForCausalLM it exports to."""

    ours: torch.nn.Module
    tok: Any  # tokenizers.Tokenizer
    texts: list[str]
    hf: torch.nn.Module
    hf_dir: Path  # the from_pretrained directory
    how: str


def exported_baseline(ctx: Ctx, workdir: Path) -> Exported:
    """Build our baseline with a BPE tokenizer, save it, export it with experiments.eval.hf_export
    (the path a user takes) and load the export with ``from_pretrained`` (sdpa)."""
    from transformers import LlamaForCausalLM

    from experiments.corpus.tokenizer import tokenizer_ref
    from experiments.eval.hf_export import export

    cfg = our_config(ctx.size)
    tok, texts = bench_tokenizer(cfg.vocab_size, 8 if ctx.size.preset == "1M" else 60)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} > {cfg.vocab_size} ids")
    torch.manual_seed(0)
    ours = ftmodel.build_model(cfg).to(ctx.device).eval()
    ck = ftmodel.save_checkpoint(workdir / "ckpt.pt", ours,
                                 tokenizer=tokenizer_ref(tok, "bench-bpe"))
    out = Path(export(ck, workdir / "hf"))
    hf = LlamaForCausalLM.from_pretrained(out, attn_implementation="sdpa", dtype=torch.float32)
    # generation runs to the token budget (no eos) and pads with 0, as ours does
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
    return Exported(ours, tok, texts, hf.to(ctx.device).eval(), out,
                    "experiments.eval.hf_export.export + LlamaForCausalLM.from_pretrained")


def bench_tokenizer(vocab_size: int, n_files: int) -> Any:
    """A byte-level BPE (experiments.corpus.tokenizer.train_bpe, cached) on stdlib sources."""
    import sysconfig

    from experiments.corpus.tokenizer import train_bpe

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n_files]
    texts = [f.read_text(encoding="utf-8", errors="ignore") for f in files]
    return train_bpe(texts, vocab_size), texts


def mc_requests(texts: list[str], n_requests: int, seed: int = 0) -> list[Any]:
    """4-choice loglikelihood requests (lm-eval Instances) cut from real text."""

    from lm_eval.api.instance import Instance

    rng = random.Random(seed)
    body = [t for t in texts if len(t) > 2000]
    reqs = []
    for i in range(max(1, n_requests // 4)):
        t = rng.choice(body)
        a = rng.randrange(0, len(t) - 800)
        ctx = t[a:a + rng.randrange(150, 400)]
        for j in range(4):
            b = rng.randrange(0, len(t) - 100)
            cont = t[b:b + rng.randrange(10, 60)]
            reqs.append(Instance(request_type="loglikelihood", doc={"i": i}, idx=j,
                                 arguments=(ctx, " " + cont.strip() or "x")))
    return reqs




def mmlu_requests(texts: list[str], n_requests: int, shots: int = 5, subjects: int = 4,
                  chars: int = 120, seed: int = 0) -> list[Any]:
    """MMLU-like 5-shot requests: per subject one fixed few-shot header, then a question with
    four options and "Answer:"; the continuations are the four one-token letters."""
    from lm_eval.api.instance import Instance

    rng = random.Random(seed)
    body = [t for t in texts if len(t) > 2000]

    def item(t: str, answer: str | None) -> str:
        a = rng.randrange(0, len(t) - chars)
        q = " ".join(t[a:a + chars].split())
        opts = []
        for letter in "ABCD":
            b = rng.randrange(0, len(t) - 40)
            opts.append(f"{letter}. {' '.join(t[b:b + rng.randrange(8, 30)].split())}")
        return f"{q}\n" + "\n".join(opts) + "\nAnswer:" + (f" {answer}\n\n" if answer else "")

    headers = []
    for s in range(subjects):
        t = rng.choice(body)
        headers.append((t, f"The following are multiple choice questions (with answers) about "
                           f"subject {s}.\n\n" + "".join(item(t, rng.choice("ABCD"))
                                                          for _ in range(shots))))
    reqs = []
    for i in range(max(1, n_requests // 4)):
        t, head = headers[i % subjects]
        ctx = head + item(t, None)
        for j, letter in enumerate("ABCD"):
            reqs.append(Instance(request_type="loglikelihood", doc={"i": i}, idx=j,
                                 arguments=(ctx, f" {letter}")))
    return reqs
