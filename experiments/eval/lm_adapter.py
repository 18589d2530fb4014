"""A native lm-evaluation-harness `LM` for our checkpoints, Free-Transformer aware. The protocol
(what Z sees per request type, long continuations, generation, the modes) is docs/DESIGN.md,
"Honest evaluation"; `protocol()` writes it into every eval file. How it is implemented:
- context and continuation are tokenized together; the continuation is the joint encoding's
  shortest token suffix covering its characters (`_encode_pair`);
- each distinct context runs once into a KV cache and its continuations extend copies
  (`model.fork_cache`), batched; every draw of Z comes from a generator keyed by what is scored,
  so a score equals the request's score alone (tests/test_shared_context.py). lm-eval's
  `Collator(group_by="contexts")` is not used: it would share a pass between ([5,6],[7,8]) and
  ([5,6,7],[9]), whose encoder prefixes differ;
- `posterior` runs each distinct input as a row of its own, so padding never enters the encoder;
- every finished request goes to lm-eval's cache hook at once (an interrupted evaluation
  resumes); under torchrun (`DataParallel`) each rank scores whole units and rank 0 gathers,
  the results equal one process's.
Registered as `ftbench` (alias `freetransformer`) in lm-eval's registry.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

import model.free_transformer as ftm
from common import arms
from common.paths import RunDir, checkpoint_step_of
from common.records import check_z, effective_k
from experiments.corpus.tokenizer import TextTokenizer, tokenizer_from_ref
from model.checkpoint import load_weights
from model.transformer import Transformer

PRECISIONS = ("auto", "fp32", "bf16")
DEFAULT_GEN_TOKS = 256
"""The generation budget asked for when neither the task nor the caller sets one; capped at
half the model's window (`default_gen_toks`)."""
REQUEST_TYPES = ("loglikelihood", "loglikelihood_rolling", "generate_until", "long_continuation")
log = logging.getLogger(__name__)


def default_gen_toks(max_length: int) -> int:
    """The default generation budget for a model window: 256 tokens, at most half the window
    (so a prompt of half a window still gets its full budget)."""
    return max(1, min(DEFAULT_GEN_TOKS, max_length // 2))


class GenPlan(NamedTuple):
    """How one generation request is run: prompt tokens given, kept, and the token budget."""

    prompt_tokens: int
    kept: int
    budget: int
    requested: int

    @property
    def cut(self) -> int:
        return self.prompt_tokens - self.kept


def plan_generation(prompt_tokens: int, requested: int, max_length: int) -> GenPlan:
    """The one rule for prompt vs budget in a window of max_length tokens: the budget shrinks
    first (a prompt that leaves room for one new token is kept whole, the budget what is left,
    at most `requested`); only a prompt that alone fills the window is cut from the left, to
    max_length - min(requested, max_length // 2) tokens."""
    if max_length < 2:
        raise ValueError(f"max_length={max_length}: generation needs a window of >= 2 tokens")
    requested = max(1, int(requested))
    n = max(1, prompt_tokens)  # an empty prompt runs as the EOT token
    if n < max_length:
        return GenPlan(prompt_tokens, prompt_tokens, min(requested, max_length - n), requested)
    budget = min(requested, max_length // 2)
    return GenPlan(prompt_tokens, max_length - budget, budget, requested)


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """The text before the earliest occurrence of any stop string (a streaming engine's rule;
    lm-eval's hf backend, which splits on each in turn, agrees for every stock task's set)."""
    cut = min((i for s in until if s and (i := text.find(s)) >= 0), default=len(text))
    return text[:cut]


def text_stop(until: Sequence[str],
              decode: Callable[[list[int]], str]) -> Callable[[list[int]], bool] | None:
    """`generate`'s stop_when for lm-eval's stop strings, however the model tokenized them: a
    row stops once its decoded text holds a stop string and none starting earlier is still
    being written (`cut_at_stop` then keeps what generating to the budget would have)."""
    subs = [s for s in until if s]
    if not subs:
        return None

    def check(tokens: list[int]) -> bool:
        text = decode(tokens)
        found = [i for s in subs if (i := text.find(s)) >= 0]
        if not found:
            return False
        first = min(found)
        n = len(text)
        # a longer stop string begun before `first` may still complete and cut the text earlier
        return not any(s.startswith(text[p:]) for s in subs
                       for p in range(max(0, n - len(s) + 1), min(first, n)))
    return check


def _bool(v: Any) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")


def share(costs: Sequence[float], world: int) -> list[int]:
    """The rank of each unit of work: largest first, each to the least-loaded rank (ties: the
    lower index and rank). Deterministic, so every rank computes the same assignment."""
    load = [0.0] * world
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner


class DataParallel:
    """The job's processes (torchrun: gloo on CPU; NCCL on GPU with a gloo group beside it for
    the object collectives); how a batch is shared out: the module docstring."""

    def __init__(self, rank: int, world: int, group: Any = None, owns_group: bool = False
                 ) -> None:
        self.rank, self.world, self.group, self.owns_group = rank, world, group, owns_group

    @classmethod
    def from_env(cls, device: str | torch.device) -> DataParallel | None:
        """The job's process group when torchrun started several processes (WORLD_SIZE > 1),
        initialized here if nobody has; None for a single process."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group("nccl" if torch.device(device).type == "cuda" else "gloo")
        group = dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else None
        return cls(dist.get_rank(), dist.get_world_size(), group, owns)

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def local_device(device: str) -> str:
    """Under torchrun on CUDA, each process takes its own GPU (LOCAL_RANK)."""
    if torch.device(device).type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        idx = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(idx)
        return f"cuda:{idx}"
    return device


@register_model("ftbench", "freetransformer")
class FTBenchLM(TemplateLM):
    """Scores our baseline / Free Transformer checkpoints under lm-eval."""

    def __init__(self, checkpoint: str | RunDir | None = None,
                 model: torch.nn.Module | None = None,
                 tokenizer: TextTokenizer | dict | None = None, z: str = "prior", k: int = 1,
                 seed: int = 0, batch_size: int | str = 16, max_gen_toks: int | None = None,
                 device: str = "cpu", max_length: int | None = None,
                 progress: bool | str = True, precision: str = "auto",
                 data_parallel: DataParallel | None = None, **_: Any) -> None:
        super().__init__()
        check_z(z)
        self.checkpoint_step: int | None = None
        if checkpoint is not None:  # a RunDir, or what lm-eval's --model_args names: a run or a .pt
            run = checkpoint if isinstance(checkpoint, RunDir) else RunDir.at(checkpoint)
            path = run.checkpoint()
            ck = load_weights(path, device)  # weights only: never the optimizer state
            model, tokenizer = ck.model, ck.tokenizer
            # the training step it holds: its recorded `extra["step"]`, else step_N.pt
            step = (ck.extra or {}).get("step")
            self.checkpoint_step = step if isinstance(step, int) and not isinstance(
                step, bool) else checkpoint_step_of(path)
        if model is None or tokenizer is None:
            raise ValueError("FTBenchLM needs checkpoint=... or both model= and tokenizer=")
        self.model = model.eval()
        self.tok = tokenizer if isinstance(tokenizer, TextTokenizer) else \
            tokenizer_from_ref(tokenizer)
        # the model's kind (its Arm record): whether it has a Z to draw, and what its files say
        self.arm = arms.of_model(int(getattr(self.model.cfg, "latent_bits", 0) or 0))
        self.z = z
        self.k = effective_k(z, k)
        if self.k < 1:
            raise ValueError(f"k={k}: need k >= 1")
        self.seed = int(seed)
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 16
        # the window: the length the model was trained at (run.py passes the run's seq_len),
        # never past the positions the model has
        self.max_length = min(int(max_length or self.model.cfg.max_seq_len),
                              int(self.model.cfg.max_seq_len))
        self.max_gen_toks = int(max_gen_toks) if max_gen_toks not in (None, "", "None") \
            else default_gen_toks(self.max_length)
        if self.max_gen_toks < 1:
            raise ValueError(f"max_gen_toks={max_gen_toks}: need >= 1")
        self.progress = _bool(progress)
        self._device = torch.device(device)
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r}: allowed {PRECISIONS}")
        # bf16 autocast on CUDA by default (a runtime setting, not part of the spec); fp32 else
        self.precision = ("bf16" if self._device.type == "cuda" else "fp32") \
            if precision == "auto" else precision
        self.dp = data_parallel
        self._in_shard = False  # computing this rank's share: no further dispatch
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
        shortest token suffix covering its characters. lm-eval's default cuts at
        len(encode(context)), which feeds a sequence no tokenizer would produce where a token
        merges across the boundary ("    ret" + "urn x") and drops characters from the scored
        span. Trailing context whitespace moves to the continuation, as in lm-eval."""
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
        return self.arm.latent and self.z == "posterior"

    def protocol(self) -> dict[str, str]:
        """What Z saw, per request type (written into every eval file as `protocol`)."""
        if not self.arm.latent:
            return dict.fromkeys(REQUEST_TYPES, "no latent Z (baseline model)")
        draws = f"; {self.k} draws of Z per request, likelihoods averaged" if self.k > 1 else ""
        gen = ("encoder: the prompt only (cut from the left only if it alone fills the window); "
               "a prior code for every generated token")
        if self.z == "posterior":
            leak = "(posterior: leaks the scored tokens; a diagnostic, not a score)"
            return {"loglikelihood": f"encoder: context and continuation {leak}",
                    "loglikelihood_rolling": f"encoder: every token of the window {leak}",
                    "generate_until": gen,
                    "long_continuation": "windows of max_length sliding by half a window; "
                                         f"encoder: every token of the window {leak}"}
        return {"loglikelihood": "encoder: context only (the last tokens that fit the window); "
                                 "a prior code for every continuation token" + draws,
                "loglikelihood_rolling": "encoder: the first window's EOT prefix only; a prior "
                                         "code for every scored token in every window" + draws,
                "generate_until": gen,
                "long_continuation": "windows of max_length sliding by half a window, the same "
                                     "for both arms; encoder: the original context's tokens "
                                     "still in the window (none once it has slid past), never "
                                     "a continuation token; a prior code for every "
                                     "continuation token in every window, scored or already "
                                     "scored" + draws}

    # ------------------------------------------------------------------ data parallel
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "bf16":
            return torch.autocast(self._device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _dispatch(self, kind: str, payload: Any) -> dict[int, Any]:
        """{item index: result} for one batch of requests. Alone: all of it here. On rank 0
        with workers: every rank gets the batch, scores its share, and rank 0 gathers them."""
        if self.dp is None or self._in_shard:
            return self._shard(kind, payload, 0, 1)
        self.dp.broadcast((kind, payload))
        err: BaseException | None = None
        try:
            got = self._shard(kind, payload, 0, self.dp.world)
        except Exception as e:  # noqa: BLE001 - gather first, so the workers are not left
            err, got = e, {}
        parts = self.dp.gather(None) or []
        if err is not None:
            raise err
        for part in parts[1:]:
            if "error" in part:
                raise RuntimeError(part["error"])
            got |= part["items"]
            self.n_forward_tokens += part["tokens"]
            self.n_requests += part["requests"]
        return got

    def _shard(self, kind: str, payload: Any, rank: int, world: int) -> dict[int, Any]:
        outer, self._in_shard = self._in_shard, True  # a rolling share scores through here
        try:
            with self._autocast():  # kind: "score", "rolling" or "generate"
                return getattr(self, f"_{kind}_share")(*payload, rank, world)
        finally:
            self._in_shard = outer

    def serve(self) -> None:
        """A worker rank (> 0): score its share of every batch rank 0 hands out, until rank 0
        says stop (`stop_workers`)."""
        assert self.dp is not None and self.dp.rank > 0
        while True:
            kind, payload = self.dp.broadcast(None)
            if kind == "stop":
                return
            t0, r0 = self.n_forward_tokens, self.n_requests
            try:
                items = self._shard(kind, payload, self.dp.rank, self.dp.world)
                out: dict[str, Any] = {"items": items, "tokens": self.n_forward_tokens - t0,
                                       "requests": self.n_requests - r0}
            except Exception as e:  # noqa: BLE001 - reported to rank 0, which raises it
                log.exception("rank %d: %s failed", self.dp.rank, kind)
                out = {"error": f"rank {self.dp.rank}: {type(e).__name__}: {e}"}
            self.dp.gather(out)

    def stop_workers(self) -> None:
        """Rank 0: release the workers from `serve` (call once, when done or failing)."""
        if self.dp is not None and self.dp.rank == 0:
            self.dp.broadcast(("stop", None))

    # ------------------------------------------------------------------ scoring core
    def _window(self, ctx: list[int], cont: list[int],
                n_enc: int | None = None) -> tuple[list[int], int, int]:
        """(input tokens, prefix_len, n_cont): the last max_length tokens of ctx + cont[:-1];
        prefix_len = how many of the first n_enc tokens of ctx (default: all of ctx, the
        tokens the encoder may read) are still in the window."""
        if not cont:
            raise ValueError("empty continuation")
        if len(cont) > self.max_length:
            raise ValueError(f"continuation of {len(cont)} tokens exceeds the window "
                             f"{self.max_length}")
        full = ctx + cont
        start = max(0, len(full) - (self.max_length + 1))  # where the window begins in full
        n_enc = len(ctx) if n_enc is None else min(n_enc, len(ctx))
        return full[start:-1], max(0, n_enc - start), len(cont)

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False, n_enc: Sequence[int] | None = None,
                              **kw: Any) -> list[tuple[float, bool]]:
        """Score (key, context tokens, continuation tokens) requests. n_enc[i]: how many leading
        context tokens of request i the encoder may read (default: the whole context)."""
        self.n_requests += len(requests)
        enc = [len(c) for _, c, _ in requests] if n_enc is None else list(n_enc)
        # A continuation longer than the window (a gold answer, say) is scored in pieces of half
        # a window, each conditioned on as much preceding text as fits (a sliding window). The
        # encoder still reads only the original context: scored tokens before a piece are
        # conditioning for the trunk, with prior codes, never encoder input.
        step = max(1, self.max_length // 2)
        pieces: list[tuple[list[int], list[int], int]] = []
        owner: list[int] = []
        for i, (_, ctx, cont) in enumerate(requests):
            if len(cont) <= self.max_length:
                pieces.append((ctx, cont, enc[i]))
                owner.append(i)
                continue
            for j in range(0, len(cont), step):
                pieces.append((ctx + cont[:j], cont[j:j + step], enc[i]))
                owner.append(i)
        got = self._dispatch("score", (pieces, disable_tqdm))  # `_score_share`, over the ranks
        scored = [got[i] for i in range(len(pieces))]
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

    def _gen_for(self, draw: int, *parts: object) -> torch.Generator:
        """A generator seeded by (seed, draw, what is being drawn for): a request's Z no longer
        depends on which requests it is batched or shared with, or in what order."""
        h = hashlib.blake2b(repr((self.seed, draw, parts)).encode(), digest_size=8).digest()
        return torch.Generator(device="cpu").manual_seed(int.from_bytes(h, "little") >> 1)

    @torch.no_grad()
    def _score_share(self, pieces: list[tuple[list[int], list[int], int]], disable_tqdm: bool,
                     rank: int = 0, world: int = 1) -> dict[int, tuple[list[float], bool]]:
        """This rank's share of `_loglikelihood_tokens`'s pieces by whole units (a posterior
        input row, a run of contexts sharing a prefix), {piece index: result}; a context's codes
        come from a generator keyed by the context, a row's prior codes from one keyed by
        context and row."""
        wins = [self._window(*p) for p in pieces]
        draws = self.k if self.arm.latent else 1  # the baseline is deterministic
        # Each piece keeps its continuation's readout inputs, (n_cont, D) per draw, never
        # vocabulary-wide rows: they live only until the piece's draws are all in, then are
        # scored over chunks of tokens (`score_hidden`, mixture over the draws) and reduced to
        # (per-draw sum, greedy) at once, so memory grows neither with the number of requests
        # nor with the vocabulary (2^17 x 4 bytes per continuation token before)
        lps: list[list[torch.Tensor]] = [[] for _ in pieces]
        res: list[tuple[list[float], bool] | None] = [None] * len(pieces)

        def reduce(members: list[int]) -> None:
            for i in members:
                res[i] = _reduce_draws(self.model, pieces[i][1], lps[i])
                lps[i] = []

        bar = tqdm(total=len(pieces) * draws, desc="loglikelihood",
                   disable=disable_tqdm or not self.progress)
        if self.arm.latent and self.z == "posterior":
            # the leaking diagnostic: the encoder reads the scored tokens, so nothing is shared
            # but identical inputs; one row per input, each with its own generator
            rows: dict[tuple[int, ...], list[int]] = {}
            for i, (inp, _, _) in enumerate(wins):
                rows.setdefault(tuple(inp), []).append(i)
            units = list(rows.items())
            owner = share([len(inp) * len(m) for inp, m in units], world)
            for u, (inp, members) in enumerate(units):
                if owner[u] != rank:
                    continue
                for d in range(draws):  # each draw's generator is keyed: the order is free
                    lf = min(len(inp) - wins[i][2] for i in members)
                    hid = self.model(torch.tensor([inp], device=self.device), z="posterior",
                                     generator=self._gen_for(d, "posterior", inp),
                                     logits_from=lf, readout=False).hidden[0]
                    self.n_forward_tokens += len(inp)
                    for i in members:
                        n = wins[i][2]
                        lps[i].append(hid[len(inp) - n - lf:][:n])
                    bar.update(len(members))
                reduce(members)
        else:
            ctxs: dict[tuple[tuple[int, ...], int], list[int]] = {}
            for i, (inp, pre, n) in enumerate(wins):
                ctxs.setdefault((tuple(inp[:len(inp) - n + 1]), pre), []).append(i)
            runs = self._header_runs(sorted(ctxs))
            owner = share([sum(len(key[0]) + sum(len(pieces[i][1]) for i in ctxs[key])
                               for key in run) for run, _ in runs], world)
            for u, (run, h) in enumerate(runs):
                if owner[u] != rank:
                    continue
                head = None
                if h:  # baseline only (one draw)
                    head = self.model.new_cache(1, h)
                    self.model.extend(torch.tensor([run[0][0][:h]], device=self.device),
                                      head, logits_from=h - 1)
                    self.n_forward_tokens += h
                for key in run:
                    for d in range(draws):
                        self._score_context(key, ctxs[key], pieces, d, head, h, lps)
                        bar.update(len(ctxs[key]))
                    reduce(ctxs[key])
        bar.close()
        return {i: r for i, r in enumerate(res) if r is not None}

    MIN_SHARED_PREFIX = 32
    """Contexts share a cached prefix only from this many common tokens on (below, the copy
    and the extra call cost more than they save)."""

    def _header_runs(self, keys: list[tuple[tuple[int, ...], int]]
                     ) -> list[tuple[list[tuple[tuple[int, ...], int]], int]]:
        """Sorted context keys -> runs of consecutive contexts with the length of the prefix
        they all share (0 = none). Baseline only: the Free Transformer's encoder reads the
        whole context, so its codes (hence every block from L/2 on) differ per context."""
        if self.arm.latent:
            return [([k], 0) for k in keys]
        runs: list[tuple[list[tuple[tuple[int, ...], int]], int]] = []
        for k in keys:
            if runs:
                run, h = runs[-1]
                prev = run[-1][0]
                lcp = next((j for j, (a, b) in enumerate(zip(prev, k[0], strict=False))
                            if a != b),
                           min(len(prev), len(k[0])))
                h2 = min(h if len(run) > 1 else len(prev) - 1, lcp, len(k[0]) - 1)
                if h2 >= self.MIN_SHARED_PREFIX and (len(run) == 1 or h2 >= h // 2):
                    runs[-1] = (run + [k], h2)
                    continue
            runs.append(([k], 0))
        return runs

    def _score_context(self, key: tuple[tuple[int, ...], int], members: list[int],
                       pieces: list[tuple[list[int], list[int], int]], draw: int,
                       head: list | None, h: int, lps: list[list[torch.Tensor]]) -> None:
        """Run one context window (from a cached shared prefix of h tokens when given), then
        its continuation rows in batches; append each member's (n_cont, D) readout inputs."""
        c_in, pre = key
        m, dev = self.model, self.device
        tails: dict[tuple[int, ...], list[int]] = {}
        for i in members:
            tails.setdefault(tuple(pieces[i][1][:-1]), []).append(i)
        longest = max(map(len, tails))
        cap = len(c_in) + longest
        if head is not None:
            cache = m.fork_cache(head, 1, cap)
            out = m.extend(torch.tensor([c_in[h:]], device=dev), cache,
                           logits_from=len(c_in) - h - 1, readout=False)
            self.n_forward_tokens += len(c_in) - h
        else:
            cache = m.new_cache(1, cap)
            kw: dict[str, Any] = {}
            if self.arm.latent:
                kw = {"z": "prior", "prefix_len": torch.tensor([pre], device=dev),
                      "generator": self._gen_for(draw, "context", c_in, pre)}
            out = m.extend(torch.tensor([c_in], device=dev), cache,
                           logits_from=len(c_in) - 1, readout=False, **kw)
            self.n_forward_tokens += len(c_in)
        last = out.hidden[0, -1:]  # (1, D): predicts the continuation's first token
        rows = [t for t in tails if t]
        for s in range(0, len(rows), self.batch_size):
            chunk = rows[s:s + self.batch_size]
            T = max(map(len, chunk))
            toks = torch.zeros(len(chunk), T, dtype=torch.long)
            for b, t in enumerate(chunk):
                toks[b, :len(t)] = torch.tensor(t, dtype=torch.long)
            kw = {}
            if self.arm.latent:
                # every continuation position gets its own prior code (pinned here so the draw
                # is the row's, whatever it is batched with); padding's code is never read
                H = m.cfg.latent_bits
                codes = torch.zeros(len(chunk), T, dtype=torch.long)
                for b, t in enumerate(chunk):
                    codes[b, :len(t)] = ftm.uniform_codes(
                        (1, len(t)), H, self._gen_for(draw, "tail", c_in, pre, t), dev)[0]
                kw = {"z": codes.to(dev)}
            ext = m.extend(toks.to(dev), m.fork_cache(cache, len(chunk), cap), readout=False,
                           **kw).hidden
            self.n_forward_tokens += len(chunk) * T
            for b, t in enumerate(chunk):
                hb = torch.cat([last, ext[b, :len(t)]])
                for i in tails[t]:
                    lps[i].append(hb)
        for i in tails.get((), []):
            lps[i].append(last)

    def loglikelihood_pairs(self, pairs: Sequence[tuple[str, str]],
                            disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """loglikelihood on bare (context, continuation) strings (no lm-eval Instance)."""
        return self.loglikelihood([SimpleNamespace(args=p) for p in pairs],
                                  disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        strings = [req.args[0] for req in requests]
        got = self._dispatch("rolling", (strings, disable_tqdm))
        out = [got[i] for i in range(len(strings))]
        if self.dp is not None:  # alone, each went to the cache as it finished
            for string, total in zip(strings, out, strict=True):
                self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    def _rolling_share(self, strings: list[str], disable_tqdm: bool, rank: int = 0,
                       world: int = 1) -> dict[int, float]:
        """This rank's share of the rolling requests, whole requests, {index: total}."""
        owner = share([len(s) for s in strings], world)
        out: dict[int, float] = {}
        for i in tqdm([i for i in range(len(strings)) if owner[i] == rank],
                      desc="loglikelihood_rolling", disable=disable_tqdm or not self.progress):
            string = strings[i]
            wins = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(string), self.eot_token_id, self.max_length, 1)]
            # every token is scored: the encoder may read the first window's EOT prefix only
            # (later windows' contexts are tokens scored by earlier windows)
            scores = self._loglikelihood_tokens(
                [(None, c, x) for c, x in wins], disable_tqdm=True,
                n_enc=[len(c) if j == 0 else 0 for j, (c, _) in enumerate(wins)])
            total = sum(s for s, _ in scores)
            out[i] = total
            if self.dp is None:
                self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    # ------------------------------------------------------------------ generation
    def plan_generation(self, context: str, gen_kwargs: dict | None = None) -> GenPlan:
        """How a generate_until request (context, gen_kwargs) runs in this model's window."""
        req = (gen_kwargs or {}).get("max_gen_toks", self.max_gen_toks)
        return plan_generation(len(self.tok_encode(context)), int(req), self.max_length)

    def truncation_record(self, args: Iterable[tuple[str, dict]]) -> dict[str, Any]:
        """The per-task "truncation" record of the eval files (docs/RESULTS.md) for
        generate_until requests given by their args (context, gen_kwargs), computed from the
        rule alone: it covers cached requests too."""
        plans = [self.plan_generation(c, g) for c, g in args]
        return {"n_requests": len(plans), "n_truncated": sum(p.cut > 0 for p in plans),
                "max_tokens_cut": max((p.cut for p in plans), default=None),
                "min_prompt_tokens_kept": min((p.kept for p in plans), default=None),
                "gen_budget_min": min((p.budget for p in plans), default=None),
                "n_budget_shrunk": sum(p.budget < p.requested for p in plans),
                "gen_budget_requested": max((p.requested for p in plans), default=None)}

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        reqs = [tuple(r.args) for r in requests]
        self.n_requests += len(reqs)
        n_cut = sum(self.plan_generation(c, g).cut > 0 for c, g in reqs)
        got = self._dispatch("generate", (reqs, disable_tqdm))
        res = [got[i] for i in range(len(reqs))]
        if self.dp is not None:  # alone, each went to the cache as its batch finished
            for r, text in zip(reqs, res, strict=True):
                self.cache_hook.add_partial("generate_until", r, text)
        if n_cut:
            log.warning("generate_until: %d of %d prompts were cut from the left to fit the "
                        "%d-token window (recorded as the task's truncation)", n_cut, len(reqs),
                        self.max_length)
        return res

    @torch.no_grad()
    def _generate_share(self, reqs: list[tuple[str, dict]], disable_tqdm: bool, rank: int = 0,
                        world: int = 1) -> dict[int, str]:
        """This rank's share of the generation batches (as one process forms them), {request
        index: text}; a batch's draws come from a generator keyed by its requests, not by the
        rank or the batch's position."""
        eos = self.tok.decode([self.tok.eos_id]) if self.tok.eos_id is not None else None
        enc = [self.tok_encode(c) for c, _ in reqs]
        coll = Collator(list(enumerate(reqs)), sort_fn=lambda r: (-len(enc[r[0]]), r[0]),
                        group_fn=lambda r: r[1][1], group_by="gen_kwargs")
        chunks = [[i for i, _ in chunk] for chunk in coll.get_batched(n=self.batch_size)]
        owner = share([sum(len(enc[i]) for i in idx) + len(idx) for idx in chunks], world)
        mine = [idx for j, idx in enumerate(chunks) if owner[j] == rank]
        out: dict[int, str] = {}
        bar = tqdm(total=sum(map(len, mine)), desc="generate_until",
                   disable=disable_tqdm or not self.progress)
        for idx in mine:
            kw = dict(reqs[idx[0]][1])
            stop_arg = kw.pop("until", None)  # a copy: lm-eval's helper appends eos in place,
            # which would change the request (and the key of its draws) for the next caller
            until = handle_stop_sequences(list(stop_arg) if isinstance(stop_arg, list)
                                          else stop_arg, eos)
            requested = int(kw.pop("max_gen_toks", self.max_gen_toks))
            do_sample = _bool(kw.pop("do_sample", False))
            temperature = float(kw.pop("temperature", 0.0)) if do_sample else 0.0
            top_p = float(kw.pop("top_p", 1.0) or 1.0)
            stops = [ids for s in until if (ids := self.tok_encode(s))]
            plans = {i: plan_generation(len(enc[i]), requested, self.max_length) for i in idx}
            # rows of one generate call share its budget: run each budget apart, so a row's
            # budget never depends on its batch mates
            for budget in sorted({p.budget for p in plans.values()}, reverse=True):
                rows = [i for i in idx if plans[i].budget == budget]
                prompts = [(enc[i][len(enc[i]) - plans[i].kept:] if plans[i].kept else [])
                           or [self.eot_token_id] for i in rows]
                g = self._gen_for(0, "generate", [reqs[i] for i in rows], budget)
                gen = self.model.generate(prompts, max_new_tokens=budget,
                                          temperature=temperature, top_p=top_p, z="prior",
                                          stop=stops, generator=g, eos_id=self.tok.eos_id,
                                          stop_when=text_stop(until, self.tok_decode))
                self.n_forward_tokens += sum(map(len, prompts)) + sum(map(len, gen.tokens))
                for j, i in enumerate(rows):
                    out[i] = cut_at_stop(self.tok_decode(gen.tokens[j]), until)
            if self.dp is None:
                for i in idx:
                    self.cache_hook.add_partial("generate_until", reqs[i], out[i])
            bar.update(len(idx))
        bar.close()
        return out


def _reduce_draws(model: Transformer, cont: list[int], hs: list[torch.Tensor]
                  ) -> tuple[list[float], bool]:
    """k draws of a continuation's (n, D) readout inputs -> (its log-likelihood per draw,
    whether it is the greedy continuation under the draws' mean distribution), the readout
    over chunks of tokens (`score_hidden`): no (k, n, V) tensor."""
    h_k = torch.stack(hs)  # (k, n, D)
    tgt = torch.tensor(cont, device=h_k.device)
    s = model.score_hidden(h_k, tgt, mixture=True)
    return [float(x) for x in s.logprob.sum(-1)], bool(s.greedy.all())


def _logmeanexp(xs: Sequence[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs) / len(xs))

