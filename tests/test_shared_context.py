"""Shared-context scoring (issue 18): each context window runs once into a KV cache and every
continuation extends a copy of it; baseline contexts with a common few-shot header run the
header once. Every request must score exactly as if it were scored alone, and exactly as the
full forward over context + continuation with the same codes, for both arms and every Z mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import model.free_transformer as ftm
from experiments.eval.lm_adapter import FTBenchLM
from model import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARMS = {"base": False, "free": True}
MODES = [("base", "prior", 1), ("free", "prior", 1), ("free", "prior-k", 3),
         ("free", "posterior", 1)]


@pytest.fixture(scope="module")
def ckpts(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {arm: toy_checkpoint(tmp_path_factory.mktemp(arm) / "final.pt", free=free)
            for arm, free in ARMS.items()}


def _requests(V: int) -> list[tuple[None, list[int], list[int]]]:
    """MMLU-like: a 40-token few-shot header shared by three questions, four one-token answers
    each; HellaSwag-like: one context, four multi-token endings (one a prefix of another);
    plus a context that is a prefix of another one and a duplicate request."""
    g = torch.Generator().manual_seed(0)

    def r(n: int) -> list[int]:
        return torch.randint(1, V, (n,), generator=g).tolist()

    head = r(40)
    reqs = []
    for q in range(3):
        ctx = head + r(6 + 3 * q)
        reqs += [(None, ctx, [a]) for a in r(4)]
    ctx = r(9)
    e = r(5)
    reqs += [(None, ctx, e), (None, ctx, e[:3]), (None, ctx, r(2)), (None, ctx, r(7))]
    reqs += [(None, ctx[:5], ctx[5:] + e), (None, ctx, e)]
    return reqs


def _lm(ckpts: dict[str, Path], arm: str, z: str, k: int, **kw: object) -> FTBenchLM:
    return FTBenchLM(checkpoint=str(ckpts[arm]), z=z, k=k, seed=11, progress=False, **kw)


@pytest.mark.parametrize(("arm", "z", "k"), MODES)
@pytest.mark.parametrize("bs", [1, 16])
def test_shared_equals_alone(ckpts: dict[str, Path], arm: str, z: str, k: int,
                             bs: int) -> None:
    lm = _lm(ckpts, arm, z, k, batch_size=bs)
    reqs = _requests(lm.model.cfg.vocab_size)
    keyed = [((str(i), ""), c, x) for i, (_, c, x) in enumerate(reqs)]
    together = lm._loglikelihood_tokens(keyed)
    draws_together = dict(lm.draw_logliks)
    n_shared = lm.n_forward_tokens
    alone_lm = _lm(ckpts, arm, z, k, batch_size=bs)
    for i, req in enumerate(keyed):
        (ll, greedy), = alone_lm._loglikelihood_tokens([req])
        assert ll == pytest.approx(together[i][0], abs=1e-5), i
        assert greedy == together[i][1]
        assert alone_lm.draw_logliks[req[0]] == pytest.approx(draws_together[req[0]], abs=1e-5)
        assert len(draws_together[req[0]]) == k
    if z == "prior-k":  # the k draws are distinct draws of Z
        assert any(len({round(d, 6) for d in v}) > 1 for v in draws_together.values())
    if z != "posterior":  # work was shared: fewer tokens ran than alone
        assert n_shared < alone_lm.n_forward_tokens
    if z != "posterior" and bs == 16:  # and equal to one full forward with the draw's codes
        for key, ctx, cont in keyed:
            want = [_full_forward_ll(lm, ctx, cont, d) for d in range(k)]
            assert draws_together[key] == pytest.approx(want, abs=1e-5), key


def _full_forward_ll(lm: FTBenchLM, ctx: list[int], cont: list[int], draw: int) -> float:
    """The unshared reference: one full forward over ctx + cont[:-1] with the codes the
    adapter's draw uses (context codes from the encoder over the context only, prior codes for
    the continuation positions)."""
    m = lm.model
    inp = torch.tensor([ctx + cont[:-1]])
    kw: dict[str, object] = {}
    if lm.arm.latent:
        pre = torch.tensor([len(ctx)])
        with torch.no_grad():
            c_codes = m(torch.tensor([ctx]), z="prior", prefix_len=pre,
                        generator=lm._gen_for(draw, "context", tuple(ctx), len(ctx))).codes
        tail = tuple(cont[:-1])
        t_codes = ftm.uniform_codes((1, len(tail)), m.cfg.latent_bits,
                                    lm._gen_for(draw, "tail", tuple(ctx), len(ctx), tail),
                                    m.device) if tail else c_codes[:, :0]
        kw = {"z": torch.cat([c_codes, t_codes], 1)}
    with torch.no_grad():
        logp = F.log_softmax(m(inp, **kw).logits[0].float(), -1)
    n0 = len(ctx) - 1
    return sum(float(logp[n0 + j, t]) for j, t in enumerate(cont))


def test_baseline_header_runs_once(ckpts: dict[str, Path]) -> None:
    """The three MMLU-like questions share a 40-token header: it runs once, not three times."""
    lm = _lm(ckpts, "base", "prior", 1)
    reqs = _requests(lm.model.cfg.vocab_size)[:12]
    lm._loglikelihood_tokens(reqs)
    contexts = sum(len(c) for c in {tuple(c) for _, c, _ in reqs})
    assert lm.n_forward_tokens == contexts - 2 * 40  # the header once, each suffix once
    runs = lm._header_runs(sorted({(tuple(c), len(c)) for _, c, _ in reqs}))
    assert [(len(r), h) for r, h in runs] == [(3, 40)]


def test_encoder_refuses_a_filled_cache(ckpts: dict[str, Path]) -> None:
    """The Free Transformer's encoder is non-causal over the context: it cannot run on top of
    cached positions it would not see, so `extend` refuses instead of scoring wrongly."""
    m = load_checkpoint(ckpts["free"]).model.eval()
    cache = m.new_cache(1, 8)
    m.extend(torch.tensor([[1, 2, 3]]), cache, z="prior", prefix_len=torch.tensor([3]))
    with pytest.raises(ValueError, match="empty KV cache"):
        m.extend(torch.tensor([[4, 5]]), cache, z="prior", prefix_len=torch.tensor([2]))
