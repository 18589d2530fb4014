"""The baseline decoder (paper §4.2; docs/DESIGN.md, "The model"): a Llama-style decoder.

One trunk loop, `_trunk`, with a hook `_kv_input(i, x, ctx)` for block i's key/value input: the
Free Transformer overrides only that hook to add Z after block L/2. `_run` is the single entry
for a full forward, a prefill and a cached decode step, so the KV cache path is the training
path. Batched generation left-pads internally with per-row RoPE positions and a key mask, so a
row's output does not depend on the other rows. Scoring never holds (B, T, V) logits: the
readout runs over chunks of `readout_chunk_bytes` (model/readout.py), a memory knob that the
config, run-ids and checkpoints do not see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import Block, KVCache, RMSNorm, rope_table
from .readout import (
    IGNORE_INDEX,
    READOUT_CHUNK_BYTES,
    TokenScores,
    float_dtype,
    linear_cross_entropy,
    score_readout,
)


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # (B, T, V); None where not computed (readout=False,
    # scores=True, or the chunked training loss)
    loss: torch.Tensor | None = None  # ce + free-bits penalty
    ce: torch.Tensor | None = None  # mean cross-entropy in nats
    kl: torch.Tensor | None = None  # mean KL per token in nats (0 for the baseline)
    codes: torch.Tensor | None = None  # (B, T) latent codes used, Free Transformer only
    kl_tokens: torch.Tensor | None = None  # (B, T) KL per token when the encoder ran
    hidden: torch.Tensor | None = None  # (B, T, D) the readout's input, with readout=False
    scores: TokenScores | None = None  # per-token scores of the targets, with scores=True


@dataclass
class Generation:
    tokens: list[list[int]]  # new tokens per row, the stop sequence removed
    codes: list[list[int]] | None  # FT: codes of prompt + new tokens that were run, per row
    stopped: list[bool]  # True where a stop sequence or eos ended the row


@dataclass
class LowerHalf:
    """What `forward_lower` hands to `forward_upper`."""

    hidden: torch.Tensor  # (B, T, D) output of blocks [0, split_at): block split_at's input
    bit_logits: torch.Tensor | None = None  # (B, T, H) FT encoder bit logits; None: baseline


@dataclass
class _Ctx:
    """Everything one pass of `_run` needs besides the tokens; the FT hook reads and writes it."""

    rope: tuple[torch.Tensor, torch.Tensor]
    mask: torch.Tensor | None = None  # (B, 1, Tq, S) bool, None = plain causal
    cache: list[KVCache] | None = None
    z: object = None  # "posterior" | "prior" | LongTensor (B, Tq)
    enc_mask: torch.Tensor | None = None  # (B, 1, Tq, Tq) bool for the encoder, None = all;
    # a key-padding mask (the same row for every query, expanded) so no tensor meets GQA
    prefix_len: torch.Tensor | None = None  # (B,) encoder sees only tokens before this
    generator: torch.Generator | None = None
    codes: torch.Tensor | None = None
    kl_tokens: torch.Tensor | None = None


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_emb.weight
        cos, sin = rope_table(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Memory and speed knobs of the instance, set by a run's trainer or evaluator; the
        # config, the run-id and checkpoints never hold them (same values either way).
        # The budget of the one float32 (tokens x V) buffer of a readout chunk when scoring
        # (and in the chunked training loss): chunks of budget // (V x 4) tokens.
        self.readout_chunk_bytes = READOUT_CHUNK_BYTES
        # `forward(tokens, targets)` computes the cross-entropy over chunks of tokens
        # (`linear_cross_entropy`, its gradients made in the forward): no (B, T, V) logits,
        # `ModelOutput.logits` is None; same values and gradients (tested in float64).
        self.chunked_loss = False
        # On CUDA each chunk's work after its matmul runs compiled (`compiled_chunk_loss`: one
        # fused pass); `compile_units` (train.compile) turns it on; CPU chunks stay eager.
        self.compile_loss = False
        self.reset_parameters()

    # ------------------------------------------------------------------ init
    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    @property
    def device(self) -> torch.device:
        return self.tok_emb.weight.device

    # ------------------------------------------------------------------ trunk
    def _rope(self, pos: torch.Tensor | None, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        if pos is None:  # positions 0..T-1 for every row
            return self.rope_cos[:T, None, :], self.rope_sin[:T, None, :]  # (T, 1, hd)
        return self.rope_cos[pos][:, :, None, :], self.rope_sin[pos][:, :, None, :]

    def _kv_input(self, i: int, x: torch.Tensor, ctx: _Ctx) -> torch.Tensor | None:
        """Key/value input of block i; the baseline attends to its own input."""
        return None

    def _trunk(self, x: torch.Tensor, ctx: _Ctx, lo: int = 0, hi: int | None = None
               ) -> torch.Tensor:
        """Blocks lo..hi-1 (default: all)."""
        for i in range(lo, len(self.blocks) if hi is None else hi):
            blk = self.blocks[i]
            kv = self._kv_input(i, x, ctx)
            cache = ctx.cache[i] if ctx.cache is not None else None
            x = blk(x, ctx.rope, kv_in=kv, mask=ctx.mask, cache=cache)
        return x

    def _hidden(self, tokens: torch.Tensor, ctx: _Ctx, logits_from: int = 0) -> torch.Tensor:
        """The readout's input (the final RMSNorm's output) at positions >= logits_from."""
        x = self.tok_emb(tokens)  # (B, T, D)
        x = self._trunk(x, ctx)
        return self.norm(x[:, logits_from:])  # (B, T - logits_from, D)

    def _run(self, tokens: torch.Tensor, ctx: _Ctx, logits_from: int = 0) -> torch.Tensor:
        # the readout (D x V per position) only where logits are wanted
        return self.output(self._hidden(tokens, ctx, logits_from))  # (B, T - logits_from, V)

    def _check_len(self, T: int) -> None:
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.cfg.max_seq_len}")

    # ------------------------------------------------------------------ forward
    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None, z: object = None,
                prefix_len: torch.Tensor | None = None,
                generator: torch.Generator | None = None, logits_from: int = 0,
                readout: bool = True, scores: bool = False) -> ModelOutput:
        """Full teacher-forced pass. `z` and `prefix_len` matter only to the Free Transformer.

        targets: (B, T) with -100 for positions not scored. logits_from: return logits (and
        score targets) for positions >= logits_from only, sparing the readout elsewhere.
        readout=False: no logits; `hidden` holds the readout's input (for `score_hidden`).
        scores=True (with targets, without gradient): no (B, T, V) logits; `scores` holds the
        targets' per-token log-probs and greedy flags (`score_hidden`), and `ce` / `loss` are
        computed from them. With `chunked_loss` on, targets alone also skip the logits.
        """
        B, T = tokens.shape
        self._check_len(T)
        if not 0 <= logits_from < T:
            raise ValueError(f"logits_from={logits_from} must be in [0, {T})")
        if scores and targets is None:
            raise ValueError("scores=True needs targets (B, T)")
        if not readout and (targets is not None or scores):
            raise ValueError("readout=False returns the readout's input: pass no targets and "
                             "scores=False")
        if scores and torch.is_grad_enabled():
            raise ValueError("scores=True is an evaluation path without gradient: call it "
                             "under torch.no_grad() or torch.inference_mode()")
        ctx = _Ctx(rope=self._rope(None, T), z=z, prefix_len=prefix_len, generator=generator)
        h = self._hidden(tokens, ctx, logits_from)
        if targets is not None:
            targets = targets[:, logits_from:]
        chunked = targets is not None and (scores or self.chunked_loss)
        logits = self.output(h) if readout and not chunked else None
        out = ModelOutput(logits=logits, codes=ctx.codes, kl_tokens=ctx.kl_tokens,
                          kl=ctx.kl_tokens.mean() if ctx.kl_tokens is not None
                          else h.new_zeros(()))
        if not readout:
            out.hidden = h
        if targets is None:
            return out
        if scores:
            out.scores = self.score_hidden(h, targets)
            n = (targets != IGNORE_INDEX).sum()
            out.ce = -out.scores.logprob.sum() / n  # the mean over scored targets, as below
        elif chunked:
            out.ce = linear_cross_entropy(h.flatten(0, 1), self.output.weight, targets.flatten(),
                                          self.readout_chunk_bytes,
                                          compiled=self.compile_loss and h.is_cuda)
        else:
            # at least float32 (bf16 logits under autocast), float64 for a float64 model
            out.ce = F.cross_entropy(logits.flatten(0, 1).to(float_dtype(logits.dtype)),
                                     targets.flatten(), ignore_index=IGNORE_INDEX)
        out.loss = out.ce + self._latent_penalty(ctx)
        return out

    # ------------------------------------------------------------------ scoring
    def score(self, tokens: torch.Tensor, targets: torch.Tensor, z: object = None,
              prefix_len: torch.Tensor | None = None, generator: torch.Generator | None = None,
              logits_from: int = 0) -> TokenScores:
        """`forward(tokens, targets, ..., scores=True).scores`, through the module's call (so
        DDP/FSDP hooks run): per-token log p(target) and greedy flags (B, T - logits_from), Z as
        in `forward` (the FT's codes and KL: call `forward(..., scores=True)`). No gradient."""
        with torch.no_grad():
            out = self(tokens, targets, z=z, prefix_len=prefix_len, generator=generator,
                       logits_from=logits_from, scores=True)
        assert out.scores is not None
        return out.scores

    def score_hidden(self, hidden: torch.Tensor, targets: torch.Tensor,
                     mixture: bool = False) -> TokenScores:
        """Readout inputs (`forward` / `extend` / `forward_upper` with readout=False) -> the
        targets' per-token log-probs and greedy flags, over chunks of `readout_chunk_bytes`
        (no (tokens x V) tensor for more than one chunk). No gradient.

        hidden (..., D), targets (...) long, -100 = not scored (log-prob 0, greedy True).
        mixture=True: hidden (k, ..., D) holds k draws of Z for the same positions; logprob is
        (k, ...), one row per draw, and greedy (...) is under the mean of the k distributions.
        """
        return score_readout(self.output, hidden, targets, self.cfg.vocab_size,
                             self.readout_chunk_bytes, mixture=mixture)

    def _latent_penalty(self, ctx: _Ctx) -> torch.Tensor:
        return torch.zeros((), device=self.device)

    # ------------------------------------------------------------------ split forward
    @property
    def split_at(self) -> int:
        """Blocks [0, split_at) are the lower half; the Free Transformer's Z enters the keys and
        values of block split_at (its `inject_at`). The baseline splits at the same block."""
        return self.cfg.n_layers // 2

    def forward_lower(self, tokens: torch.Tensor) -> LowerHalf:
        """`forward`'s lower half, teacher-forced from position 0 without a cache: the hidden
        state entering block `split_at`. The Free Transformer adds the encoder's bit logits."""
        T = tokens.shape[1]
        self._check_len(T)
        ctx = _Ctx(rope=self._rope(None, T))
        return LowerHalf(hidden=self._trunk(self.tok_emb(tokens), ctx, 0, self.split_at))

    def forward_upper(self, hidden: torch.Tensor, codes: torch.Tensor | None = None,
                      logits_from: int = 0, readout: bool = True) -> torch.Tensor:
        """`forward_lower(tokens).hidden` -> the logits of `forward(tokens)` (B, T - logits_from,
        V); readout=False: the readout's input (B, T - logits_from, D) instead. The baseline has
        no latent, so `codes` must be None (the Free Transformer pins them)."""
        self._check_codes(codes)
        h = self._upper(hidden, codes, logits_from)
        return self.output(h) if readout else h

    def score_upper(self, hidden: torch.Tensor, targets: torch.Tensor,
                    codes: torch.Tensor | None = None, logits_from: int = 0) -> TokenScores:
        """`forward_upper`'s counterpart of `score`: hidden (B, T, D) from `forward_lower`,
        targets (B, T) (-100 = not scored), codes as in `forward_upper` -> per-token scores
        (B, T - logits_from), over chunks (`score_hidden`). No gradient. It does not go through
        the module's call: for an unwrapped model (evaluation loads weights-only exports)."""
        self._check_codes(codes)
        if targets.shape != hidden.shape[:2]:
            raise ValueError(f"targets must have shape {tuple(hidden.shape[:2])}, got "
                             f"{tuple(targets.shape)}")
        with torch.no_grad():
            h = self._upper(hidden, codes, logits_from)
        return self.score_hidden(h, targets[:, logits_from:])

    def _check_codes(self, codes: torch.Tensor | None) -> None:
        if codes is not None:
            raise ValueError("the baseline has no latent codes: forward_upper takes codes=None")

    def _upper(self, hidden: torch.Tensor, codes: torch.Tensor | None,
               logits_from: int) -> torch.Tensor:
        """Blocks [split_at, L) from pinned codes -> the readout's input at >= logits_from."""
        T = hidden.shape[1]
        self._check_len(T)
        if not 0 <= logits_from < T:
            raise ValueError(f"logits_from={logits_from} must be in [0, {T})")
        ctx = _Ctx(rope=self._rope(None, T), z=codes)
        x = self._trunk(hidden, ctx, self.split_at)
        return self.norm(x[:, logits_from:])

    # ------------------------------------------------------------------ shared-context scoring
    def fork_cache(self, cache: list[KVCache], rows: int, max_len: int) -> list[KVCache]:
        """A new cache of `rows` rows and capacity max_len holding a copy of `cache`'s filled
        positions (one source row is broadcast to every row): a context run once, then extended
        by several continuations."""
        n = cache[0].len
        if max_len < n:
            raise ValueError(f"max_len={max_len} is shorter than the cached {n} positions")
        out = self.new_cache(rows, max_len)
        for dst, src in zip(out, cache, strict=True):
            dst.k[:, :, :n] = src.k[:, :, :n]
            dst.v[:, :, :n] = src.v[:, :, :n]
            dst.len = n
        return out

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, cache: list[KVCache], z: object = None,
               prefix_len: torch.Tensor | None = None, generator: torch.Generator | None = None,
               logits_from: int = 0, readout: bool = True) -> ModelOutput:
        """Run tokens (B, T) at positions cache.len .. cache.len + T - 1 on top of a KV cache
        (empty = a prefill), appending their keys/values: the scoring path of `forward`, split
        at any point (tested equal to the full forward). Rows may be right-padded: the trunk is
        causal, so padding never reaches an earlier position. z/prefix_len as in `forward`; the
        Free Transformer's encoder runs only from an empty cache. readout=False: `hidden` holds
        the readout's input (B, T - logits_from, D) instead of logits (for `score_hidden`)."""
        B, T = tokens.shape
        s0 = cache[0].len
        self._check_len(s0 + T)
        if not 0 <= logits_from < T:
            raise ValueError(f"logits_from={logits_from} must be in [0, {T})")
        rope = self.rope_cos[s0:s0 + T, None, :], self.rope_sin[s0:s0 + T, None, :]
        # no mask: query i (absolute s0 + i) sees keys 0..s0 + i (Attention: causal aligned to
        # the lower right on a filled cache, a form CUDA's flash kernel takes with grouped heads)
        ctx = _Ctx(rope=rope, cache=cache, z=z, prefix_len=prefix_len, generator=generator)
        h = self._hidden(tokens, ctx, logits_from)
        if not readout:
            return ModelOutput(logits=None, hidden=h, codes=ctx.codes)
        return ModelOutput(logits=self.output(h), codes=ctx.codes)

    # ------------------------------------------------------------------ generation
    def new_cache(self, batch: int, max_len: int) -> list[KVCache]:
        p = self.tok_emb.weight
        return [KVCache(batch, self.cfg.n_kv_heads, max_len, self.cfg.head_dim, p.device, p.dtype)
                for _ in self.blocks]

    @staticmethod
    def _rows(prompt: torch.Tensor | Sequence[Sequence[int]]) -> list[list[int]]:
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 2:
                raise ValueError(f"prompt must be (B, P), got shape {tuple(prompt.shape)}")
            return prompt.tolist()
        return [list(map(int, r)) for r in prompt]

    def _sample(self, logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
        """logits (B, V) -> (B,) next tokens."""
        if temperature <= 0:
            # max(-1).indices is argmax (the first maximal index on ties, NaN counted as the
            # maximum) at a third of the CPU cost of argmax's kernel
            return logits.max(-1).indices
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if top_p < 1.0:
            sp, si = probs.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always the top token)
            drop = (sp.cumsum(-1) - sp) >= top_p
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, si, sp)
        gdev = generator.device if generator is not None else probs.device
        nxt = torch.multinomial(probs.to(gdev), 1, generator=generator).squeeze(-1)
        return nxt.to(logits.device)

    def _gen_codes(self, z: object, B: int, P: int, max_new: int) -> tuple[object, object]:
        """Split a `z` argument into (prompt spec, generated-token spec); FT overrides."""
        return None, None

    def _query_dtype(self) -> torch.dtype:
        """The dtype attention queries get: autocast's where it is on, else the weights'."""
        dev = self.device.type
        if torch.is_autocast_enabled(dev):
            return torch.get_autocast_dtype(dev)
        return self.tok_emb.weight.dtype

    @torch.inference_mode()
    def generate(self, prompt: torch.Tensor | Sequence[Sequence[int]], max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, z: object = "prior",
                 stop: Sequence[Sequence[int]] | None = None,
                 generator: torch.Generator | None = None,
                 eos_id: int | None = None,
                 stop_when: Callable[[list[int]], bool] | None = None) -> Generation:
        """KV-cache generation, batched.

        prompt: (B, P) LongTensor or a list of token lists of any lengths (left-padded inside).
        stop: token sequences that end a row (removed from the output).
        stop_when(new tokens of a row) -> True also ends the row, its tokens kept (the caller's
        test on the decoded text, e.g. a stop string however it was tokenized).
        z (Free Transformer): "prior" = the encoder prefills the prompt, a uniform code per new
        token; a LongTensor (B, max_new_tokens) pins the new tokens' codes; a LongTensor
        (B, P + max_new_tokens) pins every code (unpadded prompts only).
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        rows = self._rows(prompt)
        B = len(rows)
        if B == 0 or any(len(r) == 0 for r in rows):
            raise ValueError("every prompt row needs at least one token")
        lens = torch.tensor([len(r) for r in rows])
        P = int(lens.max())
        total = P + max_new_tokens
        self._check_len(total)
        dev = self.device
        pad = (P - lens).to(dev)  # left padding per row
        toks = torch.zeros(B, P, dtype=torch.long, device=dev)
        for b, r in enumerate(rows):
            toks[b, P - len(r):] = torch.tensor(r, dtype=torch.long)
        t_idx = torch.arange(total, device=dev)
        pos = (t_idx[None, :] - pad[:, None]).clamp(min=0)  # (B, total)
        valid = t_idx[None, :] >= pad[:, None]  # (B, total)
        padded = bool((pad > 0).any())
        z_prompt, z_new = self._gen_codes(z, B, P, max_new_tokens)
        if padded and isinstance(z_prompt, torch.Tensor):
            raise ValueError("pinning prompt codes needs prompts of equal length")

        mask = enc_mask = None  # unpadded: the prefill is plain causal, the encoder sees all
        if padded:
            q, k = t_idx[:P, None], t_idx[None, :P]
            mask = ((valid[:, None, :P] & (k <= q)[None])  # the diagonal keeps pad rows finite
                    | (k == q)[None])[:, None]
            # every query of the encoder sees the row's real keys (pad queries too: their codes
            # are dropped); the same row for every query, expanded without a copy
            enc_mask = valid[:, None, None, :P].expand(B, 1, P, P)
        cache = self.new_cache(B, total)
        ctx = _Ctx(rope=self._rope(pos[:, :P], P), mask=mask, cache=cache,
                   z="posterior" if z_prompt is None else z_prompt, enc_mask=enc_mask,
                   generator=generator)
        logits = self._run(toks, ctx, P - 1)[:, -1]
        prompt_codes = ctx.codes
        # Decode steps read their RoPE rows and key mask as slices of tables built once: a step's
        # query at s0 sees keys 0..s0 except the row's left padding, and SDPA would turn a bool
        # mask into this same 0/-inf mask of the query's dtype at every layer of every step.
        cos_all, sin_all = self.rope_cos[pos], self.rope_sin[pos]  # (B, total, hd)
        add_mask = None
        if padded:
            add_mask = torch.zeros(B, 1, 1, total, device=dev, dtype=self._query_dtype())
            add_mask.masked_fill_(~valid[:, None, None, :], float("-inf"))
        new_codes: list[list[int]] = [[] for _ in range(B)]  # FT: codes of the fed new tokens
        stops = [list(s) for s in (stop or []) if len(s) > 0]
        out: list[list[int]] = [[] for _ in range(B)]
        done = [False] * B
        stopped = [False] * B
        active = list(range(B))  # the original row of each batch row still running
        for i in range(max_new_tokens):
            nxt = self._sample(logits, temperature, top_p, generator)
            for b, t in zip(active, nxt.tolist(), strict=True):
                out[b].append(t)
                if eos_id is not None and t == eos_id:
                    out[b].pop()
                    done[b] = stopped[b] = True
                for s in stops:
                    if len(out[b]) >= len(s) and out[b][-len(s):] == s:
                        del out[b][-len(s):]
                        done[b] = stopped[b] = True
                        break
                if not done[b] and stop_when is not None and stop_when(out[b]):
                    done[b] = stopped[b] = True
            if all(done) or i == max_new_tokens - 1:
                break
            keep = [j for j, b in enumerate(active) if not done[b]]
            if len(keep) < len(active):
                # finished rows leave the batch and the KV cache: the decode cost follows the
                # rows still running, not the longest one
                idx = torch.tensor(keep, device=dev)
                # the kept rows' filled positions move to the first rows of the same buffers
                # (no new cache of the full capacity); the cache becomes a view of those rows
                n, s_fill = len(keep), cache[0].len
                for c in cache:
                    c.k[:n, :, :s_fill] = c.k[:, :, :s_fill].index_select(0, idx)
                    c.v[:n, :, :s_fill] = c.v[:, :, :s_fill].index_select(0, idx)
                    c.k, c.v = c.k[:n], c.v[:n]
                cos_all, sin_all, nxt = cos_all[idx], sin_all[idx], nxt[idx]
                if add_mask is not None:
                    add_mask = add_mask[idx]
                if isinstance(z_new, torch.Tensor):
                    z_new = z_new[idx.to(z_new.device)]
                active = [active[j] for j in keep]
            s0 = P + i
            zi = z_new[:, i:i + 1] if isinstance(z_new, torch.Tensor) else "prior"
            rope = cos_all[:, s0:s0 + 1, None, :], sin_all[:, s0:s0 + 1, None, :]
            ctx = _Ctx(rope=rope, mask=None if add_mask is None else add_mask[..., :s0 + 1],
                       cache=cache, z=zi, generator=generator)
            logits = self._run(nxt[:, None], ctx)[:, -1]
            if ctx.codes is not None:
                for b, c in zip(active, ctx.codes[:, 0].tolist(), strict=True):
                    new_codes[b].append(c)
        code_rows = None
        if prompt_codes is not None:
            pc = prompt_codes.tolist()
            # codes of every position that went through the model (the last new token did not)
            code_rows = [pc[b][P - len(r):] + new_codes[b][:len(out[b])]
                         for b, r in enumerate(rows)]
        return Generation(tokens=out, codes=code_rows, stopped=stopped)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

