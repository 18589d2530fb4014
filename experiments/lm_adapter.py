"""A native lm-evaluation-harness `LM` for our checkpoints, Free-Transformer aware (DESIGN.md §6).

Design choices:
- subclass of lm-eval's `TemplateLM`; context and continuation are tokenized *together* and the
  score is the sum over the joint encoding's last n tokens, n = the continuation's token count
  (the shortest suffix covering its characters; see `_encode_pair`; STYLE.md item 7);
- requests are length-sorted and batched with lm-eval's own `Collator`, grouped by input so the
  choices of one question share one forward pass (and, for the Free Transformer, one draw of Z);
  batches are right-padded (the trunk is causal: padding never reaches a scored position);
- a context longer than the model's window is cut on the left, as lm-eval's hf backend does;
- Free Transformer: `z="prior"` (default) calls the model with `prefix_len` = the context's length
  in the window, so the encoder reads the context only and every continuation position gets a
  uniform code. `prior-k` scores each request under k draws of Z and returns the log of the mean
  likelihood (the Monte-Carlo estimate of the marginal); the k per-draw values are kept in
  `draw_logliks` for the spread. `posterior` lets the encoder read the scored tokens: it leaks
  and is only a diagnostic; its rows are batched by equal length so padding never enters the
  non-causal encoder;
- generation uses the model's KV-cache `generate` (encoder prefills the prompt, a prior code per
  new token), greedy unless the task asks to sample; string stop sequences are applied to the
  decoded text, and their single-encoding token ids stop the loop early;
- every finished request goes to lm-eval's cache hook at once, so with `use_cache` (sqlite) an
  interrupted evaluation resumes from the requests it finished.
Registered as `ftbench` (alias `freetransformer`) in lm-eval's model registry, so
`lm_eval.simple_evaluate(model="ftbench", model_args="checkpoint=...,z=prior-k,k=4")` works, and
`python -m experiments.lm_adapter run --model ftbench --model_args checkpoint=... --tasks ...` is
the stock `lm_eval` CLI with this module imported (lm-eval offers no plugin hook for models).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from experiments.tokenizer import TextTokenizer, tokenizer_from_ref
from model import load_checkpoint

Z_MODES = ("prior", "prior-k", "posterior")


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint file, or a run dir -> its checkpoints/final.pt, else the newest step_N.pt."""
    p = Path(path)
    if p.is_file():
        return p
    ck = p / "checkpoints" if (p / "checkpoints").is_dir() else p
    if (ck / "final.pt").is_file():
        return ck / "final.pt"
    steps = sorted(ck.glob("step_*.pt"), key=lambda q: int(q.stem.split("_")[1]))
    if steps:
        return steps[-1]
    raise FileNotFoundError(f"no checkpoint at {path} (looked for final.pt and step_N.pt)")


def _bool(v: Any) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")


@register_model("ftbench", "freetransformer")
class FTBenchLM(TemplateLM):
    """Scores our baseline / Free Transformer checkpoints under lm-eval."""

    def __init__(self, checkpoint: str | None = None, model: torch.nn.Module | None = None,
                 tokenizer: TextTokenizer | dict | None = None, z: str = "prior", k: int = 1,
                 seed: int = 0, batch_size: int | str = 16, max_gen_toks: int = 256,
                 device: str = "cpu", max_length: int | None = None,
                 progress: bool | str = True, **_: Any) -> None:
        super().__init__()
        if z not in Z_MODES:
            raise ValueError(f"z={z!r}: allowed {Z_MODES}")
        if checkpoint is not None:
            ck = load_checkpoint(resolve_checkpoint(checkpoint), map_location=device)
            model, tokenizer = ck.model, ck.tokenizer
        if model is None or tokenizer is None:
            raise ValueError("FTBenchLM needs checkpoint=... or both model= and tokenizer=")
        self.model = model.eval()
        self.tok = tokenizer if isinstance(tokenizer, TextTokenizer) else \
            tokenizer_from_ref(tokenizer)
        self.is_free = bool(getattr(self.model.cfg, "is_free", False))
        self.z = z
        self.k = int(k) if z == "prior-k" else 1
        if self.k < 1:
            raise ValueError(f"k={k}: need k >= 1")
        self.seed = int(seed)
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 16
        self.max_gen_toks = int(max_gen_toks)
        self.max_length = int(max_length or self.model.cfg.max_seq_len)
        self.progress = _bool(progress)
        self._device = torch.device(device)
        self.generator = torch.Generator(device="cpu").manual_seed(self.seed)
        self._token_bytes = self.tok.token_bytes()
        self.draw_logliks: dict[tuple[str, str], list[float]] = {}
        self.n_forward_tokens = 0
        self.n_requests = 0  # requests the model actually ran (cache hits excluded)

    # ------------------------------------------------------------------ lm-eval plumbing
    @property
    def eot_token_id(self) -> int:
        for t in (self.tok.eos_id, self.tok.bos_id):
            if t is not None:
                return int(t)
        return 0

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "name", "ftbench"))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kw: Any) -> list[int]:
        return list(self.tok.encode(string))

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tok.decode(list(tokens))

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Tokenize context + continuation together; the continuation is the joint encoding's
        shortest token suffix that covers its characters.

        lm-eval's default keeps `encode(context)` as the context and the joint encoding's tail
        past len(encode(context)) as the continuation; where a token merges across the boundary
        ("    ret" + "urn x" -> "    return x") that feeds the model a sequence no tokenizer
        would produce and drops characters from the scored span. Here the model reads the joint
        encoding itself, and the token straddling the boundary (if any) is scored with the
        continuation. Trailing context whitespace moves to the continuation, as in lm-eval.
        """
        n_sp = len(context) - len(context.rstrip())
        if n_sp:
            context, continuation = context[:-n_sp], context[-n_sp:] + continuation
        whole = self.tok_encode(context + continuation)
        budget = len(context.encode("utf-8"))
        k, used = 0, 0
        for t in whole:
            used += self._token_bytes[t]
            if used > budget:
                break
            k += 1
        k = min(k, len(whole) - 1)
        if k == 0:  # the first token already reaches into the continuation
            return [self.prefix_token_id], whole
        return whole[:k], whole[k:]

    @property
    def leaks(self) -> bool:
        return self.is_free and self.z == "posterior"

    # ------------------------------------------------------------------ scoring core
    def _window(self, ctx: list[int], cont: list[int]) -> tuple[list[int], int, int]:
        """(input tokens, prefix_len, n_cont): the last max_length tokens of ctx + cont[:-1]."""
        if not cont:
            raise ValueError("empty continuation")
        if len(cont) > self.max_length:
            raise ValueError(f"continuation of {len(cont)} tokens exceeds the window "
                             f"{self.max_length}")
        inp = (ctx + cont)[-(self.max_length + 1):][:-1]
        return inp, len(inp) - len(cont) + 1, len(cont)

    def _logits(self, toks: torch.Tensor, prefix: torch.Tensor, lf: int = 0) -> torch.Tensor:
        """One draw of the model's logits (B, T - lf, V) under the configured z-mode."""
        if not self.is_free:
            return self.model(toks, logits_from=lf).logits
        if self.z == "posterior":
            return self.model(toks, z="posterior", generator=self.generator,
                              logits_from=lf).logits
        return self.model(toks, z="prior", prefix_len=prefix, generator=self.generator,
                          logits_from=lf).logits

    @torch.no_grad()
    def _cont_logprobs(self, rows: list[tuple[list[int], int, int]]) -> list[torch.Tensor]:
        """Per row, the log-probs (k, n_cont, V) at the positions that predict the continuation."""
        draws = self.k if self.is_free else 1  # the baseline is deterministic
        out: list[list[torch.Tensor]] = [[] for _ in rows]
        if self.is_free and self.z == "posterior":
            # the non-causal encoder would read right padding: run equal lengths together
            groups: dict[int, list[int]] = {}
            for i, r in enumerate(rows):
                groups.setdefault(len(r[0]), []).append(i)
            parts = list(groups.values())
        else:
            parts = [list(range(len(rows)))]
        for _ in range(draws):
            for idx in parts:
                T = max(len(rows[i][0]) for i in idx)
                toks = torch.zeros(len(idx), T, dtype=torch.long)
                for b, i in enumerate(idx):
                    toks[b, :len(rows[i][0])] = torch.tensor(rows[i][0], dtype=torch.long)
                prefix = torch.tensor([rows[i][1] for i in idx], device=self.device)
                # logits only from the first position that predicts a continuation token
                lf = min(len(rows[i][0]) - rows[i][2] for i in idx)
                logits = self._logits(toks.to(self.device), prefix, lf)  # (B, T - lf, V)
                self.n_forward_tokens += len(idx) * T
                for b, i in enumerate(idx):
                    inp, _, n = rows[i]
                    sl = logits[b, len(inp) - n - lf:len(inp) - lf]
                    out[i].append(F.log_softmax(sl.float(), -1))
        return [torch.stack(o) for o in out]

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False,
                              **kw: Any) -> list[tuple[float, bool]]:
        self.n_requests += len(requests)
        # A continuation longer than the window (a gold answer, say) is scored in pieces of half
        # a window, each conditioned on as much preceding text as fits, as a sliding window
        # would; the encoder still sees only what precedes the scored piece.
        step = max(1, self.max_length // 2)
        pieces: list[tuple[Any, list[int], list[int]]] = []
        owner: list[int] = []
        for i, (_, ctx, cont) in enumerate(requests):
            if len(cont) <= self.max_length:
                pieces.append((None, ctx, cont))
                owner.append(i)
                continue
            for j in range(0, len(cont), step):
                pieces.append((None, ctx + cont[:j], cont[j:j + step]))
                owner.append(i)
        scored = self._score_tokens(pieces, disable_tqdm)
        draws: list[list[float]] = [[] for _ in requests]
        greedy = [True] * len(requests)
        for i, (d, g) in zip(owner, scored, strict=True):
            draws[i] = d if not draws[i] else [a + b for a, b in zip(draws[i], d, strict=True)]
            greedy[i] = greedy[i] and g
        res = []
        for (key, _, _), d, g in zip(requests, draws, greedy, strict=True):
            ans = (_logmeanexp(d), g)
            res.append(ans)
            if key is not None:
                self.draw_logliks[key] = d
                self.cache_hook.add_partial("loglikelihood", key, ans)
        return res

    def _score_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                      disable_tqdm: bool) -> list[tuple[list[float], bool]]:
        """Per request: the continuation's log-likelihood per draw of Z, and whether greedy."""
        # group_by="contexts": requests with the same input (context + continuation[:-1], e.g.
        # the answer letters of one MMLU question) share one forward pass, hence one draw of Z
        coll = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
                        group_fn=lambda r: r[-2] + r[-1][:-1], group_by="contexts")
        res: list[tuple[list[float], bool]] = []
        bar = tqdm(total=len(requests), desc="loglikelihood",
                   disable=disable_tqdm or not self.progress)
        for chunk in coll.get_batched(n=self.batch_size):
            lps = self._cont_logprobs([self._window(c, x) for _, c, x in chunk])
            for (key, ctx, cont), lp in zip(chunk, lps, strict=True):
                k, n, V = lp.shape
                flat = lp.reshape(1, k, n * V)  # get_cache expands dim 0 per sharing request
                for _, cont2, lp2 in coll.get_cache(req_str=key, cxt_toks=ctx,
                                                    cont_toks=cont, logits=flat):
                    lp2 = lp2.reshape(k, n, V)
                    tgt = torch.tensor(cont2, device=lp2.device)
                    per_draw = lp2.gather(-1, tgt[None, :, None].expand(k, n, 1)).sum((1, 2))
                    greedy = bool((lp2.exp().mean(0).argmax(-1) == tgt).all())
                    res.append(([float(x) for x in per_draw], greedy))
                    bar.update(1)
        bar.close()
        return coll.get_original(res)

    def loglikelihood_pairs(self, pairs: Sequence[tuple[str, str]],
                            disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """loglikelihood on bare (context, continuation) strings (no lm-eval Instance)."""

        class _Req:
            def __init__(self, a: tuple[str, str]) -> None:
                self.args = a

        return self.loglikelihood([_Req(p) for p in pairs], disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in tqdm(requests, desc="loglikelihood_rolling",
                        disable=disable_tqdm or not self.progress):
            (string,) = req.args
            wins = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(string), self.eot_token_id, self.max_length, 1)]
            scores = self._loglikelihood_tokens([(None, c, x) for c, x in wins],
                                                disable_tqdm=True)
            total = sum(s for s, _ in scores)
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok.decode([self.tok.eos_id]) if self.tok.eos_id is not None else None
        reqs = [r.args for r in requests]
        enc = [self.tok_encode(c) for c, _ in reqs]
        self.n_requests += len(reqs)

        coll = Collator(list(enumerate(reqs)), sort_fn=lambda r: (-len(enc[r[0]]), r[0]),
                        group_fn=lambda r: r[1][1], group_by="gen_kwargs")
        res: list[str] = []
        bar = tqdm(total=len(reqs), desc="generate_until",
                   disable=disable_tqdm or not self.progress)
        for chunk in coll.get_batched(n=self.batch_size):
            idx = [i for i, _ in chunk]
            kw = dict(chunk[0][1][1])
            until = handle_stop_sequences(kw.pop("until", None), eos)
            max_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
            max_new = max(1, min(max_new, self.max_length - 1))
            do_sample = _bool(kw.pop("do_sample", False))
            temperature = float(kw.pop("temperature", 0.0)) if do_sample else 0.0
            top_p = float(kw.pop("top_p", 1.0) or 1.0)
            keep = self.max_length - max_new
            prompts = [enc[i][-keep:] or [self.eot_token_id] for i in idx]
            stops = [ids for s in until if (ids := self.tok_encode(s))]
            gen = self.model.generate(prompts, max_new_tokens=max_new, temperature=temperature,
                                      top_p=top_p, z="prior", stop=stops,
                                      generator=self.generator, eos_id=self.tok.eos_id)
            self.n_forward_tokens += sum(len(p) for p in prompts) + sum(map(len, gen.tokens))
            for j, i in enumerate(idx):
                text = self.tok_decode(gen.tokens[j])
                for s in until:
                    if s:
                        text = text.split(s)[0]
                res.append(text)
                self.cache_hook.add_partial("generate_until", reqs[i], text)
            bar.update(len(idx))
        bar.close()
        return coll.get_original(res)


def _logmeanexp(xs: Sequence[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs) / len(xs))


def main() -> None:
    """The stock lm-eval CLI with `ftbench` registered (lm-eval has no model plugin hook):
    `python -m experiments.lm_adapter run --model ftbench --model_args checkpoint=<ckpt>,z=prior
    --tasks arc_easy [--include_path <offline task dir>] ...` takes exactly `lm_eval`'s arguments.
    """
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
