"""Every path that scores text runs the readout over chunks of tokens (issue 36): trainer
validation, the likelihood bound and the probe's per-row CE. Each equals the unchunked
computation it replaced (float64, both arms, chunks of 1 and 7 tokens), written out here from
the full logits. The lm-eval adapter scores through `score_hidden` (mixture over the draws),
whose chunks tests/test_model_readout.py holds to the full logits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from experiments.eval.likelihood import log_likelihood_bound
from experiments.eval.probe import row_ce
from experiments.train.plan import chunked_loss
from experiments.train.trainer import evaluate
from model import ModelConfig, build_model
from model.free_transformer import sample_codes, uniform_codes

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 53
ARMS = {"baseline": 0, "free": 4}


def seeded(latent_bits: int, chunk_tokens: int):
    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=V, dim=32, n_layers=4, n_heads=4, n_kv_heads=2,
                                ffn_dim=64, max_seq_len=64, latent_bits=latent_bits,
                                kappa_bits=0.5)).double().eval()
    m.readout_chunk_bytes = chunk_tokens * V * 8  # float64: chunk_tokens tokens per chunk
    return m


def rows(n: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (n, t), generator=torch.Generator().manual_seed(seed))


class _Corpus:
    def __init__(self, seqs: torch.Tensor) -> None:
        self.x, self.y = seqs[:, :-1], seqs[:, 1:]
        self.token_bytes = torch.arange(V) % 3 + 1

    def val_batches(self, bs: int):
        for s in range(0, len(self.x), bs):
            yield self.x[s:s + bs], self.y[s:s + bs]


def _ce(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("chunk", [1, 7])
def test_validation_equals_the_unchunked_cross_entropy(arm: str, chunk: int) -> None:
    """Values, and the form: the trainer's validation never runs the readout on more positions
    than one chunk holds (at the paper's shape, 16 x 4096 x 2^17 float32 logits were 34 GB;
    what a chunk costs there: test_model_readout's test_memory_at_the_paper_shape_*)."""
    m = seeded(ARMS[arm], chunk)
    corpus = _Corpus(rows(5, 17))
    seen: list[int] = []  # positions per readout call
    hook = m.output.register_forward_hook(lambda _m, _a, o: seen.append(o.shape[:-1].numel()))
    got = evaluate(m, corpus, 2, 0.5, lambda: torch.autocast("cpu", enabled=False))
    hook.remove()
    assert seen and max(seen) <= chunk
    free = ARMS[arm] > 0
    g = torch.Generator().manual_seed(12345)  # evaluate's generator, drawn in its order
    s_prior = s_post = n = 0.0
    with torch.no_grad():
        for x, y in corpus.val_batches(2):
            s_prior += float(_ce(m(x, z="prior" if free else None, generator=g).logits, y)) \
                * y.numel()
            if free:
                s_post += float(_ce(m(x, z="posterior", generator=g).logits, y)) * y.numel()
            n += y.numel()
    assert got["val_ce"] == pytest.approx(s_prior / n, rel=1e-12)
    nbytes = int(corpus.token_bytes[corpus.y].sum())
    assert got["val_bpb"] == pytest.approx(s_prior / (math.log(2) * nbytes), rel=1e-12)
    if free:
        assert got["val_ce_posterior"] == pytest.approx(s_post / n, rel=1e-12)


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("method", ["prior", "iwae"])
def test_likelihood_bound_equals_the_unchunked_sum(arm: str, method: str) -> None:
    m = seeded(ARMS[arm], 7)
    tokens = rows(3, 12)
    k = 3
    got = log_likelihood_bound(m, tokens, method, k, torch.Generator().manual_seed(4))
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    B, T = inp.shape
    with torch.no_grad():
        if not ARMS[arm]:
            want = -_ce(m(inp).logits, tgt, "none").view(B, T).sum(-1)
        else:  # the bound's own draws, in its order, then the full logits per draw
            H = m.cfg.latent_bits
            low = m.forward_lower(inp)
            g = torch.Generator().manual_seed(4)
            if method == "prior":
                codes = uniform_codes((k, B, T), H, g, m.device)
                ratio = torch.zeros(k, B, dtype=torch.float64)
            else:
                o = low.bit_logits.float()  # the bound's log q is float32, as before
                codes = sample_codes(low.bit_logits.expand(k, B, T, H), g)
                bits = (codes[..., None] >> torch.arange(H)) & 1
                logq = torch.where(bits.bool(), F.logsigmoid(o), F.logsigmoid(-o)).sum((-1, -2))
                ratio = -T * H * math.log(2) - logq
            lp = torch.stack([-_ce(m.forward_upper(low.hidden, codes[j]), tgt, "none")
                              .view(B, T).sum(-1) for j in range(k)])
            want = torch.logsumexp(lp + ratio, 0) - math.log(k)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("chunk", [1, 7])
def test_probe_row_ce_equals_the_unchunked_cross_entropy(chunk: int) -> None:
    m = seeded(ARMS["free"], chunk)
    x = rows(5, 10)
    y = rows(5, 10, seed=2)
    y[0, :3] = -100  # not scored: 0, as F.cross_entropy's reduction="none" gives
    with torch.no_grad():
        low = m.forward_lower(x)
        codes = uniform_codes((5, 10), m.cfg.latent_bits, torch.Generator().manual_seed(0),
                              m.device)
        want = _ce(m.forward_upper(low.hidden, codes), y, "none").view(5, 10).mean(1)
    got = row_ce(m, low.hidden, codes, y, batch_size=2)
    torch.testing.assert_close(got, want.double(), rtol=1e-10, atol=1e-12)


def test_training_loss_is_chunked_where_a_micro_batch_exceeds_one_chunk() -> None:
    small = ModelConfig(vocab_size=8192, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                        ffn_dim=64, max_seq_len=4096)
    # the study's shape (16 x 256 x 8192: 134 MB of float32 logits) stays unchunked, bit for
    # bit as before; the paper's (1 x 4096 x 2^17: 2.1 GB) is chunked
    assert not chunked_loss(small, 16, 256)
    assert chunked_loss(small.replace(vocab_size=131072), 1, 4096)
