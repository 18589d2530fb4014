"""The lm-eval adapter scores what it should: teacher-forced sums, the Z modes, stop strings.
What Z sees per request type: test_eval_protocol.py (the adapter) and test_model.py's
test_encoder_is_noncausal_but_prefill_sees_only_prompt (the model)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from experiments.eval.lm_adapter import FTBenchLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAIRS = [
    ("Question: What is 2 + 3?\nAnswer:", " 5"),
    ("Answer: ", "42"),  # trailing space moves into the continuation
    ("    ret", "urn x"),  # joint tokenization merges across the boundary
    ("y = sel", "f.x"),
    ("x = Non", "e"),
    ("The following are multiple choice questions.\nA. red\nB. blue\nAnswer:", " B"),
    ("x", " = [i for i in range(10)]"),
]


@pytest.fixture(scope="module")
def base_ckpt(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy_checkpoint(tmp_path_factory.mktemp("b") / "run" / "checkpoints" / "final.pt")


@pytest.fixture(scope="module")
def free_ckpt(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy_checkpoint(tmp_path_factory.mktemp("f") / "run" / "checkpoints" / "final.pt",
                          free=True)


def _split(tok, ctx: str, cont: str) -> tuple[list[int], int]:
    """Encode ctx+cont once; the context is the longest token prefix whose text is inside ctx."""
    n_sp = len(ctx) - len(ctx.rstrip())
    if n_sp:
        ctx, cont = ctx[:-n_sp], ctx[-n_sp:] + cont
    whole = tok.encode(ctx + cont)
    n_ctx = max(k for k in range(len(whole)) if ctx.startswith(tok.decode(whole[:k])))
    assert n_ctx >= 1
    return whole, n_ctx


def _direct(model: torch.nn.Module, tok, ctx: str, cont: str) -> tuple[float, bool, list[int]]:
    """Teacher-forced sum written out by hand over the joint encoding."""
    whole, n_ctx = _split(tok, ctx, cont)
    cont_ids = whole[n_ctx:]
    x = torch.tensor([whole[:-1]])
    with torch.no_grad():
        logp = F.log_softmax(model(x).logits[0].float(), -1)
    total, greedy = 0.0, True
    for j, t in enumerate(cont_ids):
        pos = n_ctx - 1 + j  # the position whose output predicts cont token j
        total += float(logp[pos, t])
        greedy &= int(logp[pos].argmax()) == t
    return total, greedy, cont_ids


def test_loglikelihood_equals_teacher_forced_sum(base_ckpt: Path) -> None:
    lm = FTBenchLM(checkpoint=str(base_ckpt), batch_size=4, progress=False)
    got = lm.loglikelihood_pairs(PAIRS)
    boundary_cases = 0
    for (ctx, cont), (ll, greedy) in zip(PAIRS, got, strict=True):
        want, want_greedy, cont_ids = _direct(lm.model, lm.tok, ctx, cont)
        assert ll == pytest.approx(want, abs=1e-4), (ctx, cont)
        assert greedy == want_greedy
        assert ll < 0
        c = ctx.rstrip()
        boundary_cases += lm.tok.encode(ctx.rstrip())[: len(lm.tok.encode(c))] != \
            lm.tok.encode(c + ctx[len(c):] + cont)[: len(lm.tok.encode(c))]
    # the toy strings include real boundary merges (where lm-eval's default slicing differs)
    assert boundary_cases >= 2
    # batched scores equal each request's alone: test_shared_context.py, every arm and Z mode


def test_loglikelihood_rolling(base_ckpt: Path) -> None:
    lm = FTBenchLM(checkpoint=str(base_ckpt), progress=False)
    text = "def add(a, b):\n    return a + b\n"
    (roll,) = lm.loglikelihood_rolling([_Req(text)])
    ids = lm.tok.encode(text)
    x = torch.tensor([[lm.eot_token_id] + ids[:-1]])
    with torch.no_grad():
        logp = F.log_softmax(lm.model(x).logits[0], -1)
    assert roll == pytest.approx(float(logp[torch.arange(len(ids)), ids].sum()), abs=1e-4)
    # greedy generation against full forwards: test_eval_protocol.py's
    # test_generation_keeps_the_prompt_and_records_cuts


def test_z_modes(free_ckpt: Path) -> None:
    kw = dict(checkpoint=str(free_ckpt), progress=False, seed=7)
    prior = FTBenchLM(z="prior", **kw)
    again = FTBenchLM(z="prior", **kw)
    a = prior.loglikelihood_pairs(PAIRS)
    assert a == again.loglikelihood_pairs(PAIRS)  # seeded: reproducible
    pk = FTBenchLM(z="prior-k", k=3, **kw)
    b = pk.loglikelihood_pairs(PAIRS)
    for (ctx, cont), (ll, _) in zip(PAIRS, b, strict=True):
        draws = pk.draw_logliks[(ctx, cont)]
        assert len(draws) == 3
        mx = max(draws)
        assert ll == pytest.approx(mx + math.log(sum(math.exp(d - mx) for d in draws) / 3))
    assert any(len(set(pk.draw_logliks[p])) > 1 for p in PAIRS)  # Z matters: draws differ
    post = FTBenchLM(z="posterior", **kw)
    assert post.leaks and not prior.leaks and not pk.leaks
    assert len(post.loglikelihood_pairs(PAIRS)) == len(PAIRS)
    with pytest.raises(ValueError):
        FTBenchLM(z="encoder", **kw)


def test_registered_with_lm_eval(free_ckpt: Path) -> None:
    from lm_eval.api.registry import get_model

    cls = get_model("ftbench")
    assert cls is FTBenchLM
    lm = cls.create_from_arg_string(f"checkpoint={free_ckpt},z=prior-k,k=2,seed=5,batch_size=4")
    assert (lm.z, lm.k, lm.seed, lm.batch_size, lm.arm.latent) == ("prior-k", 2, 5, 4, True)


def test_continuation_longer_than_the_window_is_scored_in_sliding_pieces(base_ckpt: Path) -> None:
    # gold answers can exceed a small model's window: each half-window piece is scored with as
    # much preceding text as fits, instead of failing the whole evaluation
    lm = FTBenchLM(checkpoint=str(base_ckpt), batch_size=4, progress=False, max_length=16)
    g = torch.Generator().manual_seed(0)
    V = lm.model.cfg.vocab_size
    ctx = torch.randint(1, V, (5,), generator=g).tolist()
    cont = torch.randint(1, V, (40,), generator=g).tolist()
    (ll, _), = lm._loglikelihood_tokens([(None, ctx, cont)])
    want = 0.0
    for j in range(0, len(cont), 8):
        piece = cont[j:j + 8]
        seen = (ctx + cont[:j] + piece)[-17:-1]  # at most 16 tokens of input
        with torch.no_grad():
            logp = F.log_softmax(lm.model(torch.tensor([seen])).logits[0].float(), -1)
        first = len(seen) - len(piece)  # the position predicting the piece's first token
        want += sum(float(logp[first + i, t]) for i, t in enumerate(piece))
    assert ll == pytest.approx(want, abs=1e-3)
    # a continuation that fits is one piece, as before
    (short, _), = lm._loglikelihood_tokens([(None, ctx, cont[:10])])
    assert math.isfinite(short) and short < 0


def _until(text: str, until: list[str]) -> str:
    """Independent reference: the shortest prefix followed by a stop string."""
    for n in range(len(text) + 1):
        if any(s and text[n:].startswith(s) for s in until):
            return text[:n]
    return text


def test_text_stop_keeps_exactly_what_the_full_generation_keeps() -> None:
    # Independent check on planted text: stop at the first step text_stop allows, and the kept
    # text equals the full text's, for overlapping and nested stop strings.
    import random

    from experiments.eval.lm_adapter import cut_at_stop, text_stop

    def decode(toks: list[int]) -> str:
        return "".join(chr(ord("a") + t) if t < 4 else "\n" for t in toks)

    rng = random.Random(0)
    sets = [["\n\n"], ["abc", "b"], ["ab", "ba", "\n"], ["aaa", "aa\n"], ["cd", "dcd"]]
    hits = 0
    for _ in range(3000):
        until = rng.choice(sets)
        toks = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
        check = text_stop(until, decode)
        k = next((i for i in range(1, len(toks) + 1) if check(toks[:i])), None)
        if k is not None:
            hits += 1
            assert _until(decode(toks[:k]), until) == _until(decode(toks), until), (until, toks)
        assert cut_at_stop(decode(toks), until) == _until(decode(toks), until)
    assert hits > 1000
    # lm-eval's hf rule (split on each in turn): the test after this one
    assert text_stop(["", ""], decode) is None
    check = text_stop(["abc", "b"], decode)
    assert not check([0, 1])  # "ab": "abc" may still complete before the "b"
    assert check([0, 1, 3])  # "abd": it cannot


class _Req:
    def __init__(self, *a: object) -> None:
        self.args = a
        self.task_name = "t"


def test_stop_strings_end_rows_early_with_the_same_text(base_ckpt: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import experiments.eval.lm_adapter as adapter

    lm = FTBenchLM(checkpoint=str(base_ckpt), batch_size=4, progress=False)
    prompts = ["def f(x):\n", "Question: 1 + 1?\nAnswer:", "import os\n", "x = [",
               "class A:\n    def"]
    until = [" ", "e", "\n"]  # strings a random model writes soon, in many tokenizations
    reqs = [_Req(p, {"until": until, "max_gen_toks": 24}) for p in prompts]
    with monkeypatch.context() as m:  # no stop_when: every row generates to its budget
        m.setattr(adapter, "text_stop", lambda *a: None)
        n0 = lm.n_forward_tokens
        full = lm.generate_until(reqs)
        n_full = lm.n_forward_tokens - n0
    n0 = lm.n_forward_tokens
    early = lm.generate_until(reqs)
    assert early == full
    assert lm.n_forward_tokens - n0 < n_full  # rows really stopped early


def test_earliest_stop_equals_lm_eval_split_on_the_stop_sets_we_run() -> None:
    # cut_at_stop (earliest occurrence) vs lm-eval hf's split on each string in turn, on texts
    # stitched from pieces of the stop strings themselves, for every stop set the suite runs
    import random

    from experiments.eval.evalplus_suite import STOP
    from experiments.eval.lm_adapter import cut_at_stop

    sets = [["Question:", "</s>", "<|im_end|>"], ["\n", ".", ","], list(STOP)]
    rng = random.Random(1)
    for until in sets:
        pieces = [s[i:j] for s in until for i in range(len(s)) for j in range(i + 1, len(s) + 1)]
        pieces += ["a", " ", "x = 1", "\n"]
        for _ in range(3000):
            text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))
            seq = text
            for s in until:
                seq = seq.split(s)[0]
            assert cut_at_stop(text, until) == seq, (until, text)


@pytest.mark.parametrize("free,k", [(False, 1), (True, 3)])
def test_vocabulary_wide_rows_do_not_pile_up(base_ckpt: Path, free_ckpt: Path, free: bool,
                                             k: int) -> None:
    # Each context's (n_cont, V) log-probs are reduced as soon as its draws are in: the rows
    # alive at any time are one context's, not the task's (HellaSwag's were ~40 GB).
    kw = {"z": "prior-k", "k": k} if free else {}
    lm = FTBenchLM(checkpoint=str(free_ckpt if free else base_ckpt), batch_size=4,
                   progress=False, **kw)
    pending: list[int] = []
    orig = lm._score_context

    def spy(key, members, pieces, draw, head, h, lps):  # noqa: ANN001
        pending.append(sum(len(x) for x in lps))
        return orig(key, members, pieces, draw, head, h, lps)

    lm._score_context = spy  # type: ignore[method-assign]
    pairs = [(f"Question {i}: what is {i} + {i}?\nAnswer:", f" {c}{i}")
             for i in range(12) for c in "ab"]
    got = lm.loglikelihood_pairs(pairs)
    assert len(pending) == 12 * k  # one context per question, k draws each
    assert max(pending) <= 2 * (k - 1)  # at most the current context's earlier draws
    ref = FTBenchLM(checkpoint=str(free_ckpt if free else base_ckpt), batch_size=4,
                    progress=False, **kw).loglikelihood_pairs(pairs[:2])
    assert got[:2] == ref  # and each score is the request's own, as before
