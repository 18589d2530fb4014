"""Every score honest (issue 12), through the real adapter and a real tiny Free Transformer:

- what Z saw, per request type, read off the model's actual codes and encoder mask: the encoder
  reads context tokens only, every continuation / scored / generated token gets a prior code
  (loglikelihood, rolling, generation, and continuations longer than the window);
- a Free Transformer's shared pass gives each request its own context as encoder input (its
  scores equal each request's alone: test_shared_context.py);
- generation prompts are not cut to fit a budget, and every cut is recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import model.free_transformer as ftm
from experiments.eval.lm_adapter import FTBenchLM
from model import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENC = 255  # the code every encoder-derived position gets below (all 8 bits on)
PRIOR = 0  # the code every prior position gets below


class _R:
    def __init__(self, *a: object) -> None:
        self.args = a


@pytest.fixture(scope="module")
def base_ckpt(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy_checkpoint(tmp_path_factory.mktemp("b") / "run" / "checkpoints" / "final.pt")


@pytest.fixture(scope="module")
def free_ckpt(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy_checkpoint(tmp_path_factory.mktemp("f") / "run" / "checkpoints" / "final.pt",
                          free=True)


class Probe:
    """A Free Transformer whose codes say where they came from: the encoder always yields code
    255 (bit logits +100), the uniform prior always code 0. Records, per scored row, the
    tokens, the codes used and the encoder's key mask."""

    def __init__(self, ckpt: Path, monkeypatch: pytest.MonkeyPatch, **kw: object) -> None:
        ck = load_checkpoint(ckpt)
        self.m = ck.model.eval()
        self.lm = FTBenchLM(model=self.m, tokenizer=ck.tokenizer, progress=False, **kw)
        H = self.m.cfg.latent_bits
        assert (1 << H) - 1 == ENC
        self.gens: list[tuple[list[list[int]], list[list[int]], list[list[int]]]] = []
        self._mask: list[torch.Tensor | None] = []

        def encode(x: torch.Tensor, ctx: object) -> torch.Tensor:
            self._mask.append(getattr(ctx, "enc_mask", None))
            return x.new_full((*x.shape[:2], H), 100.0)

        monkeypatch.setattr(self.m, "encode", encode)
        monkeypatch.setattr(ftm, "uniform_codes", lambda shape, n_bits, generator, device:
                            torch.full(shape, PRIOR, dtype=torch.long, device=device))
        gen = self.m.generate

        def generate(prompts: list[list[int]], *a: object, **k: object):
            out = gen(prompts, *a, **k)
            self.gens.append(([list(p) for p in prompts], out.tokens, out.codes))
            return out

        # the scoring path runs a context into a KV cache once (`extend` from an empty cache)
        # and extends copies of it (`fork_cache`) with each continuation: rebuild every row's
        # whole input and codes from those calls, and keep the rows nothing extended further
        self._all: list[tuple[list[int], list[int], torch.Tensor | None]] = []
        self._extended: set[int] = set()
        self._hist: dict[int, tuple[object, list[int]]] = {}
        ext, fork = self.m.extend, self.m.fork_cache

        def extend(tokens: torch.Tensor, cache: list, *a: object, **k: object):
            self._mask.clear()
            out = ext(tokens, cache, *a, **k)
            mask = self._mask[0] if self._mask else None
            parents = self._hist[id(cache)][1] if id(cache) in self._hist else None
            idx = []
            for b in range(tokens.shape[0]):
                t0, c0, m0 = self._all[parents[b]] if parents else ([], [], None)
                if parents:
                    self._extended.add(parents[b])
                codes = out.codes[b].tolist() if out.codes is not None else []
                self._all.append((t0 + tokens[b].tolist(), c0 + codes,
                                  m0 if mask is None else mask[b, 0]))
                idx.append(len(self._all) - 1)
            self._hist[id(cache)] = (cache, idx)
            return out

        def fork_cache(cache: list, rows: int, max_len: int):
            new = fork(cache, rows, max_len)
            (src,) = self._hist[id(cache)][1]
            self._hist[id(new)] = (new, [src] * rows)
            return new

        monkeypatch.setattr(self.m, "generate", generate)
        monkeypatch.setattr(self.m, "extend", extend)
        monkeypatch.setattr(self.m, "fork_cache", fork_cache)

    @property
    def rows(self) -> list[tuple[list[int], list[int], torch.Tensor | None]]:
        """Every whole model input scored: the KV-cache rows nothing extended (scoring never
        runs a plain forward; a row scored another way would be missing and fail the counts)."""
        return [r for i, r in enumerate(self._all) if i not in self._extended]


def _check_rows(rows: list, is_ctx) -> int:
    """Every non-pad position: encoder code iff it is a context token; the encoder's kept
    outputs (context positions) read context keys only. Returns the positions checked."""
    n = 0
    for toks, codes, mask in rows:
        ctx_pos = [t for t, tok in enumerate(toks) if is_ctx(t, tok)]
        for t, (tok, c) in enumerate(zip(toks, codes, strict=True)):
            if tok == 0:  # right padding
                continue
            n += 1
            assert c == (ENC if t in ctx_pos else PRIOR), (toks, codes, t)
        if mask is not None:
            for q in ctx_pos:  # an encoder output that is used saw context keys only
                seen = {k for k in range(mask.shape[-1]) if mask[q, k]}
                assert seen <= set(ctx_pos), (q, seen, ctx_pos)
    return n


# ------------------------------------------------------------------ long continuations
def test_long_continuation_encoder_never_sees_a_scored_token(
        free_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A continuation longer than the window is scored in sliding pieces; later pieces must
    not let the encoder read gold tokens scored by earlier ones (they were given encoder Z)."""
    p = Probe(free_ckpt, monkeypatch, max_length=16, batch_size=3)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(1, 100, (5,), generator=g).tolist()  # context tokens: 1..99
    cont = torch.randint(300, 590, (40,), generator=g).tolist()  # continuation: 300..589
    (ll, _), = p.lm._loglikelihood_tokens([(None, ctx, cont)])
    assert ll < 0
    assert len(p.rows) == 5  # pieces of half a window: 40 / 8
    # every continuation token (scored now or earlier) has a prior code in every piece, and
    # the context has encoder codes while it is in the window
    n = _check_rows(p.rows, lambda t, tok: 0 < tok < 100)
    assert n == sum(1 for r in p.rows for tok in r[0] if tok)
    assert any(PRIOR in r[1] and ENC in r[1] for r in p.rows)  # early pieces: both kinds
    assert sum(ENC not in r[1] for r in p.rows) >= 3  # later ones: the context slid out
    assert p.lm.protocol()["long_continuation"].count("prior code for every continuation")


# ------------------------------------------------------------------ protocol per request type
def test_protocol_loglikelihood_codes(free_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = Probe(free_ckpt, monkeypatch, batch_size=4)
    pairs = [("Question: What is 2 + 3?\nAnswer:", " 5"), ("    ret", "urn x"),
             ("The colour is", " red"), ("The colour is", " blue")]
    p.lm.loglikelihood_pairs(pairs)
    tok = p.lm.tok
    splits = {}
    for c, x in pairs:
        ctx, cont = p.lm._encode_pair(c, x)
        splits[tuple(ctx + cont[:-1])] = len(ctx)
    checked = 0
    for toks, codes, _ in p.rows:
        real = [t for t in toks if t]
        n_ctx = splits[tuple(real)]
        assert codes[:n_ctx] == [ENC] * n_ctx  # the context: encoder codes
        assert codes[n_ctx:len(real)] == [PRIOR] * (len(real) - n_ctx)  # continuation: prior
        checked += 1
    assert checked == len(p.rows) >= 3 and tok is not None
    assert p.lm.protocol()["loglikelihood"].startswith("encoder: context only")


def test_protocol_rolling_codes(free_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rolling log-likelihood scores every token: only the first window's EOT prefix may reach
    the encoder; a later window's context is tokens scored before (prior codes)."""
    p = Probe(free_ckpt, monkeypatch, max_length=16)
    text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n" * 3
    n_tok = len(p.lm.tok.encode(text))
    assert n_tok > 32  # several windows
    (roll,) = p.lm.loglikelihood_rolling([_R(text)])
    assert roll < 0
    eot = p.lm.eot_token_id
    first = [r for r in p.rows if r[0][0] == eot]
    assert len(first) == 1 and first[0][1][0] == ENC
    n = _check_rows(p.rows, lambda t, tok: t == 0 and tok == eot)
    assert n >= n_tok  # every token is input to some window; only the EOT is context
    assert p.lm.protocol()["loglikelihood_rolling"].startswith("encoder: the first window's EOT")


def test_protocol_generation_codes(free_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = Probe(free_ckpt, monkeypatch, max_length=64)
    prompts = ["Question: What is 2 + 3?\nAnswer:", "def f(x):\n    return"]
    p.lm.generate_until([_R(q, {"until": ["\n\n"], "max_gen_toks": 6}) for q in prompts])
    assert p.gens
    n_new = 0
    for ps, outs, codes in p.gens:
        for prompt, _, c in zip(ps, outs, codes, strict=True):
            assert c[:len(prompt)] == [ENC] * len(prompt)  # the encoder prefilled the prompt
            assert c[len(prompt):] == [PRIOR] * (len(c) - len(prompt))  # generated: prior
            n_new += len(c) - len(prompt)
    assert n_new >= 2  # generated tokens went through the model and were checked
    assert p.lm.protocol()["generate_until"].startswith("encoder: the prompt only")


def test_protocol_block_of_each_arm(base_ckpt: Path, free_ckpt: Path) -> None:
    base = FTBenchLM(checkpoint=str(base_ckpt), progress=False).protocol()
    assert set(base) == {"loglikelihood", "loglikelihood_rolling", "generate_until",
                         "long_continuation"}
    assert all("no latent Z" in v for v in base.values())
    pk = FTBenchLM(checkpoint=str(free_ckpt), progress=False, z="prior-k", k=3).protocol()
    assert "3 draws" in pk["loglikelihood"]
    post = FTBenchLM(checkpoint=str(free_ckpt), progress=False, z="posterior").protocol()
    assert "leaks" in post["loglikelihood"] and "leaks" in post["loglikelihood_rolling"]


# ------------------------------------------------------------------ shared inputs
def test_shared_inputs_free_transformer_prefix(free_ckpt: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """For the FT a shared pass is only right when the encoder span is the same: each request
    gets its own context as the encoder prefix; true shares keep one pass (one draw of Z)."""
    p = Probe(free_ckpt, monkeypatch, batch_size=16)
    reqs = [(None, [5, 6], [7, 8]), (None, [5, 6, 7], [9]), (None, [5, 6], [7, 9])]
    p.lm._loglikelihood_tokens(reqs)
    got = sorted((tuple(t for t in toks if t), codes[:len([t for t in toks if t])])
                 for toks, codes, _ in p.rows)
    assert got == sorted([((5, 6, 7), [ENC, ENC, PRIOR]),  # ([5,6],[7,8]) and ([5,6],[7,9])
                          ((5, 6, 7), [ENC, ENC, ENC])])  # ([5,6,7],[9]): 7 is context


# ------------------------------------------------------------------ generation budget
def test_generation_rule() -> None:
    from experiments.eval.lm_adapter import GenPlan, default_gen_toks, plan_generation

    assert plan_generation(10, 100, 32) == GenPlan(10, 10, 22, 100)  # budget shrinks
    assert plan_generation(31, 100, 32) == GenPlan(31, 31, 1, 100)  # down to 1 token
    assert plan_generation(40, 100, 32) == GenPlan(40, 16, 16, 100)  # cut: half a window
    assert plan_generation(40, 8, 32) == GenPlan(40, 24, 8, 8)
    assert plan_generation(0, 5, 32) == GenPlan(0, 0, 5, 5)
    assert default_gen_toks(256) == 128 and default_gen_toks(2048) == 256


def test_generation_keeps_the_prompt_and_records_cuts(base_ckpt: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lm = FTBenchLM(checkpoint=str(base_ckpt), progress=False, max_length=32)
    seen: list[tuple[list[list[int]], int]] = []
    gen = lm.model.generate

    def spy(prompts: list[list[int]], max_new_tokens: int, **k: object):
        seen.append(([list(p) for p in prompts], max_new_tokens))
        return gen(prompts, max_new_tokens=max_new_tokens, **k)

    monkeypatch.setattr(lm.model, "generate", spy)
    short = "Question: What is 2 + 3?\nAnswer:"
    ids = lm.tok.encode(short)
    assert 8 < len(ids) < 24
    (out,) = lm.generate_until([_R(short, {"until": ["\n\n"], "max_gen_toks": 100})])
    assert seen[-1] == ([ids], 32 - len(ids))  # whole prompt; the budget shrank
    assert lm.max_gen_toks == 16  # the default fits the window
    seq = list(ids)  # greedy over full forwards equals the adapter's answer
    for _ in range(32 - len(ids)):
        with torch.no_grad():
            seq.append(int(lm.model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert out == lm.tok.decode(seq[len(ids):]).split("\n\n")[0]
    rec = lm.truncation_record([(short, {"until": ["\n\n"], "max_gen_toks": 100})])
    assert rec["n_requests"] == 1 and rec["n_truncated"] == 0
    assert rec["gen_budget_min"] == 32 - len(ids) and rec["min_prompt_tokens_kept"] == len(ids)

    long_text = "def add(a, b):\n    return a + b\n" * 6
    long_ids = lm.tok.encode(long_text)
    assert len(long_ids) > 32
    reqs = [_R(long_text, {"until": ["\n\n"], "max_gen_toks": 100}),
            _R(short, {"until": ["\n\n"], "max_gen_toks": 100})]
    seen.clear()
    both = lm.generate_until(reqs)
    assert both[1] == out  # a batch mate with a smaller budget does not change the answer
    by_budget = {n: ps for ps, n in seen}
    assert by_budget[16] == [long_ids[-16:]]  # cut from the left to half the window
    assert by_budget[32 - len(ids)] == [ids]
    rec = lm.truncation_record([r.args for r in reqs])
    assert rec["n_requests"] == 2 and rec["n_truncated"] == 1
    assert rec["max_tokens_cut"] == len(long_ids) - 16
    assert rec["min_prompt_tokens_kept"] == 16
    assert rec["gen_budget_min"] == min(16, 32 - len(ids))
