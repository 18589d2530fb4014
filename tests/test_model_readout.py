"""Chunked readout (issue 36): scoring and the training loss over chunks of tokens equal the
unchunked path (float64, values and gradients, both arms, every Z protocol), and their memory is
set by the chunk, not by batch x sequence x vocabulary (measured with torch's MemTracker on fake
tensors; the trainer's validation calls the readout one chunk at a time:
tests/test_chunked_wiring.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from fake import seeded as seeded32
from fake import tiny

from model import ModelConfig, TokenScores, build_model, linear_cross_entropy
from model.readout import READOUT_CHUNK_BYTES, chunk_tokens, score_readout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 97


def seeded(cfg: ModelConfig):
    return seeded32(cfg, dtype=torch.float64).train()


def chunk_bytes(tokens: int) -> int:
    """The budget of `tokens` float64 tokens per chunk (1 byte: still one token)."""
    return 1 if tokens == 1 else tokens * V * 8


B, T = 3, 20
# 1 token, 7 (does not divide B*T = 60 nor T), more than B*T
CHUNKS = [1, 7, 1000]
# (name, config overrides, forward kwargs builder, training mode)
CASES = {
    "baseline-untied": (dict(), {}, False),
    "baseline-tied": (dict(tie_embeddings=True), {}, False),
    "ft-posterior": (dict(latent_bits=4), {"z": "posterior"}, True),
    "ft-prior": (dict(latent_bits=4), {"z": "prior"}, False),
    "ft-pinned": (dict(latent_bits=4), {"z": "pinned"}, False),
    "ft-prefix": (dict(latent_bits=4), {"z": "prior", "prefix_len": True}, False),
    "ft-logits-from": (dict(latent_bits=4, tie_embeddings=True), {"z": "posterior",
                                                                   "logits_from": 9}, True),
    "z-cut": (dict(latent_bits=4, z_cut=True), {"z": "posterior"}, True),
}


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (B, T), generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    y[0, :5] = -100  # padding / ignored targets
    y[2, -3:] = -100
    return x, y


def kwargs(spec: dict, seed: int = 5) -> dict:
    kw: dict = {"generator": torch.Generator().manual_seed(seed)}
    z = spec.get("z")
    if z == "pinned":
        kw["z"] = torch.randint(0, 16, (B, T), generator=torch.Generator().manual_seed(7))
    elif z is not None:
        kw["z"] = z
    if spec.get("prefix_len"):
        kw["prefix_len"] = torch.tensor([4, 11, 20])
    if "logits_from" in spec:
        kw["logits_from"] = spec["logits_from"]
    return kw


def grads(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("case", list(CASES))
def test_chunked_loss_and_scores_equal_the_unchunked_path_in_float64(case, chunk):
    """forward(tokens, targets) with chunked_loss: the same ce, loss (CE + free bits) and
    gradient of every parameter as the unchunked path, and no logits. forward(..., scores=True)
    / score(): per-token log-probs and greedy flags equal log_softmax / argmax of the full
    logits; ignored targets give 0 and True; ce is the mean over scored targets, as
    F.cross_entropy's."""
    over, spec, train = CASES[case]
    x, y = batch()
    out = {}
    for chunked in (False, True):
        m = seeded(tiny(**over)).train(train)
        m.chunked_loss = chunked
        m.readout_chunk_bytes = chunk_bytes(chunk)
        o = m(x, targets=y, **kwargs(spec))
        o.loss.backward()
        out[chunked] = (o, grads(m))
    (ref, g_ref), (got, g_got) = out[False], out[True]
    assert got.logits is None and ref.logits is not None
    assert got.ce.dtype == torch.float64
    torch.testing.assert_close(got.ce, ref.ce, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-12, atol=1e-12)
    if train:  # the posterior path: the encoder ran, and its KL is in the loss
        assert got.kl_tokens is not None and float((got.loss - got.ce).detach()) >= 0
    assert g_got.keys() == g_ref.keys()
    for n in g_ref:
        torch.testing.assert_close(g_got[n], g_ref[n], rtol=1e-9, atol=1e-12, msg=n)

    m.eval().chunked_loss = False  # the same weights, scored against the full logits
    lf = kwargs(spec).get("logits_from", 0)
    with torch.no_grad():
        ref = m(x, targets=y, **kwargs(spec))
        got = m(x, targets=y, scores=True, **kwargs(spec))
        again = m.score(x, y, **kwargs(spec))
    assert got.logits is None and isinstance(got.scores, TokenScores)
    yy = y[:, lf:]
    lp = F.log_softmax(ref.logits, -1)
    keep = yy != -100
    want = torch.where(keep, lp.gather(-1, yy.clamp(min=0)[..., None]).squeeze(-1), 0.0)
    s = got.scores
    assert s.logprob.shape == yy.shape and s.logprob.dtype == torch.float64
    torch.testing.assert_close(s.logprob, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(s.greedy, (lp.argmax(-1) == yy) | ~keep)
    torch.testing.assert_close(got.ce, ref.ce, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(again.logprob, s.logprob, rtol=0, atol=0)
    if spec.get("z") == "prior":  # the same draws: the codes are returned as before
        assert torch.equal(got.codes, ref.codes)


def test_greedy_is_true_where_the_target_is_the_argmax():
    """The adversary: targets set to the argmax are all greedy, shifted ones are not."""
    m = seeded(tiny()).eval()
    x, _ = batch()
    with torch.no_grad():
        best = m(x).logits.argmax(-1)
        assert bool(m.score(x, best).greedy.all())
        assert not bool(m.score(x, (best + 1) % V).greedy.any())


@pytest.mark.parametrize("H", [0, 3])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_score_upper_equals_forward_upper(H, chunk):
    m = seeded(tiny(latent_bits=H)).eval()
    m.readout_chunk_bytes = chunk_bytes(chunk)
    x, y = batch()
    codes = torch.randint(0, 8, (B, T)) if H else None
    with torch.no_grad():
        low = m.forward_lower(x)
        for lf in (0, 6):
            logits = m.forward_upper(low.hidden, codes, logits_from=lf)
            h = m.forward_upper(low.hidden, codes, logits_from=lf, readout=False)
            assert h.shape == (B, T - lf, 32)
            s = m.score_upper(low.hidden, y, codes, logits_from=lf)
            yy = y[:, lf:]
            lp = F.log_softmax(logits, -1).gather(-1, yy.clamp(min=0)[..., None]).squeeze(-1)
            torch.testing.assert_close(s.logprob, torch.where(yy != -100, lp, 0.0),
                                       rtol=1e-12, atol=1e-12)
    if H:
        with pytest.raises(ValueError, match="pinned codes"):
            m.score_upper(low.hidden, y)
    else:
        with pytest.raises(ValueError, match="codes=None"):
            m.score_upper(low.hidden, y, torch.zeros(B, T, dtype=torch.long))
    with pytest.raises(ValueError, match="targets must have shape"):
        m.score_upper(low.hidden, y[:, 1:], codes)


@pytest.mark.parametrize("H", [0, 3])
def test_extend_hidden_and_mixture_scores(H):
    """extend(readout=False) gives the readout input of extend's logits; score_hidden over k
    draws gives each draw's log-probs and the greedy flag of the draws' mean distribution."""
    m = seeded(tiny(latent_bits=H)).eval()
    m.readout_chunk_bytes = chunk_bytes(5)
    x, y = batch()
    k = 4
    hs, lps = [], []
    with torch.no_grad():
        for d in range(k):
            kw = {"z": torch.randint(0, 8, (B, T), generator=torch.Generator().manual_seed(d))}\
                if H else {}
            c1, c2 = m.new_cache(B, T), m.new_cache(B, T)
            logits = m.extend(x, c1, logits_from=3, **kw).logits
            out = m.extend(x, c2, logits_from=3, readout=False, **kw)
            assert out.logits is None
            torch.testing.assert_close(m.output(out.hidden), logits, rtol=0, atol=0)
            hs.append(out.hidden)
            lps.append(F.log_softmax(logits, -1))
        s = m.score_hidden(torch.stack(hs), y[:, 3:], mixture=True)
    lp = torch.stack(lps)  # (k, B, T', V)
    yy = y[:, 3:]
    keep = yy != -100
    want = lp.gather(-1, yy.clamp(min=0)[None, ..., None].expand(k, -1, -1, 1)).squeeze(-1)
    assert s.logprob.shape == (k, B, T - 3) and s.greedy.shape == (B, T - 3)
    torch.testing.assert_close(s.logprob, torch.where(keep, want, 0.0), rtol=1e-12, atol=1e-12)
    mean_best = lp.exp().mean(0).argmax(-1)
    assert torch.equal(s.greedy, (mean_best == yy) | ~keep)
    # the adversary: targets at the mixture's argmax are greedy under the mixture
    assert bool(m.score_hidden(torch.stack(hs), mean_best, mixture=True).greedy.all())


def test_bad_arguments_say_what_to_do():
    m = seeded(tiny(latent_bits=3))
    x, y = batch()
    with pytest.raises(ValueError, match="no_grad"):
        m(x, targets=y, scores=True)
    with torch.no_grad():
        with pytest.raises(ValueError, match="needs targets"):
            m(x, scores=True)
        with pytest.raises(ValueError, match="readout=False"):
            m(x, targets=y, readout=False)
        with pytest.raises(ValueError, match="targets have shape"):
            m.score_hidden(torch.zeros(2, 5, 32, dtype=torch.float64), y)
    assert m.readout_chunk_bytes == READOUT_CHUNK_BYTES and m.chunked_loss is False
    with torch.no_grad():
        h = m(x, readout=False).hidden
    assert h.shape == (B, T, 32) and m(x).logits is not None
    for bad in (0, -1, 1.5, True):  # a knob of the instance, checked where the readout uses it
        m.readout_chunk_bytes = bad
        with torch.no_grad(), pytest.raises(ValueError, match="chunk_bytes"):
            m(x, targets=y, scores=True)


def test_chunk_tokens_follow_the_budget():
    assert chunk_tokens(READOUT_CHUNK_BYTES, 1 << 17, torch.bfloat16) == 512
    assert chunk_tokens(READOUT_CHUNK_BYTES, 1 << 17, torch.float64) == 256
    assert chunk_tokens(READOUT_CHUNK_BYTES, 1 << 17, torch.float32, rows=8) == 64
    assert chunk_tokens(1, 1 << 17, torch.float32) == 1


def _float64_against_reference(compiled: bool) -> tuple:
    """linear_cross_entropy against F.cross_entropy in float64 (values and both gradients; a
    shorter last chunk and ignored targets): the inputs and the reference loss."""
    torch.manual_seed(0)
    h = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 30, (50,))
    t[::4] = -100
    ref = F.cross_entropy(F.linear(h, w), t)
    got = linear_cross_entropy(h, w, t, chunk_bytes=7 * 30 * 8, compiled=compiled)
    torch.testing.assert_close(got, ref, rtol=1e-13, atol=1e-13)
    for a, b in zip(torch.autograd.grad(got, (h, w)), torch.autograd.grad(ref, (h, w)),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    return h, w, t, ref


def test_linear_cross_entropy_alone():
    """The function against F.cross_entropy: float64 values and gradients, every target ignored
    (nan, as F.cross_entropy), no gradient wanted, and one backward only."""
    h, w, t, ref = _float64_against_reference(compiled=False)
    # a gradient only for the weight (a frozen input)
    gw = torch.autograd.grad(linear_cross_entropy(h.detach(), w, t, 64), w)[0]
    torch.testing.assert_close(gw, torch.autograd.grad(F.cross_entropy(F.linear(h.detach(), w),
                                                                       t), w)[0])
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, t, 64), ref.detach())
    none = torch.full((50,), -100)
    assert torch.isnan(linear_cross_entropy(h, w, none, 64))
    assert torch.isnan(F.cross_entropy(F.linear(h, w), none))
    loss = linear_cross_entropy(h, w, t, 64)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward runs once"):
        loss.backward()
    with pytest.raises(ValueError, match="chunk_bytes"):
        linear_cross_entropy(h, w, t, 0)
    with pytest.raises(ValueError, match="targets must have shape"):
        linear_cross_entropy(h, w, t[:3], 64)


def test_chunked_loss_under_bf16_autocast():
    """Under autocast the chunk's matmuls run in bf16 as F.linear's would; the loss stays
    float32 (torch's own chunked op would round it to bf16), values and gradients match the
    unchunked path to bf16 rounding."""
    cfg = tiny(latent_bits=4, tie_embeddings=True)
    x, y = batch()
    res = {}
    for chunked in (False, True):
        torch.manual_seed(0)
        m = build_model(cfg).train()
        m.chunked_loss = chunked
        m.readout_chunk_bytes = 7 * V * 4
        with torch.autocast("cpu", dtype=torch.bfloat16):
            o = m(x, targets=y, generator=torch.Generator().manual_seed(2))
        o.loss.backward()
        res[chunked] = (o.ce.detach(), grads(m))
    assert res[True][0].dtype == torch.float32
    torch.testing.assert_close(res[True][0], res[False][0], rtol=1e-4, atol=1e-4)
    for n, g in res[False][1].items():
        torch.testing.assert_close(res[True][1][n], g, rtol=2e-2, atol=2e-3, msg=n)


def test_score_readout_takes_any_readout():
    """The module-level function on a plain linear map, with no position at all."""
    w = torch.randn(11, 4, dtype=torch.float64)
    h = torch.randn(2, 0, 4, dtype=torch.float64)
    s = score_readout(lambda a: a @ w.t(), h, torch.zeros(2, 0, dtype=torch.long), 11, 1)
    assert s.logprob.shape == (2, 0) and s.greedy.shape == (2, 0)


# ---------------------------------------------------------------- memory
def _tracked_peak(fn: Callable[[], None], model: torch.nn.Module, *inputs: torch.Tensor) -> int:
    """Peak bytes of fn() under torch's MemTracker (fake tensors: nothing is allocated)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    mt.track_external(model, *inputs)
    with mt:
        fn()
    return max(snap["Total"] for snap in mt.get_tracker_snapshot("peak").values())


def _phase_peaks(cfg: ModelConfig, rows: int, small: int | None, big: int) -> dict[str, int]:
    """MemTracker peaks (fake tensors) of: the trunk alone (readout=False), scores=True with a
    small (optional: many chunks are slow to track) and a big chunk, the unchunked validation
    forward (rows x T), and a training step at one row (forward + backward) unchunked and with
    chunked_loss (big chunk)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    z = "prior" if cfg.is_free else None
    with FakeTensorMode():
        m = build_model(cfg).eval()
        x = torch.randint(0, cfg.vocab_size, (rows, cfg.max_seq_len))

        def run(**kw) -> Callable[[], None]:
            def f() -> None:
                with torch.no_grad():
                    m(x, z=z, **kw)
            return f

        out = {"weights": sum(p.numel() * 4 for p in m.parameters()),
               "trunk": _tracked_peak(run(readout=False), m, x)}
        for name, cb in (("small", small), ("big", big)):
            if cb is None:
                continue
            m.readout_chunk_bytes = cb
            out[name] = _tracked_peak(run(targets=x, scores=True), m, x)
        out["full"] = _tracked_peak(run(targets=x), m, x)
        m.train()
        x1 = x[:1]
        for chunked in (False, True):
            m.chunked_loss = chunked

            def step() -> None:
                m(x1, targets=x1).loss.backward()
                m.zero_grad(set_to_none=True)

            out["train_chunked" if chunked else "train"] = _tracked_peak(step, m, x1)
    return out


def _check_peaks(p: dict[str, int], cfg: ModelConfig, rows: int, big: int, ratio: int) -> None:
    T, Vv, D = cfg.max_seq_len, cfg.vocab_size, cfg.dim
    hidden = rows * T * D * 4  # the readout's input, beside the chunks
    # a small chunk leaves the trunk's own peak; a big one sets it at about one chunk (float32:
    # the chunk's logits, turned into the log-sum-exp in place)
    if "small" in p:
        assert p["small"] <= p["trunk"] + 2 * hidden, p
    assert big <= p["big"] <= p["trunk"] + 1.5 * big + 2 * hidden, p
    logits32 = rows * T * Vv * 4  # what the unchunked forward holds, at the least
    assert p["full"] > logits32 > ratio * p["big"], p
    row = T * Vv * 4  # one row's float32 logits
    assert p["train"] > 2 * row, p
    # weights, their gradient, the trunk's saved activations and a few chunks
    assert p["train_chunked"] < 2 * p["weights"] + 64 * T * D * 4 + 3 * big, p


# the readout's memory is the same for both arms; the FT's (twice as slow to track) is slow-tier
@pytest.mark.parametrize("H", [0, pytest.param(4, marks=pytest.mark.slow)])
def test_memory_is_set_by_the_chunk_not_by_batch_seq_vocab(H):
    """At a small shape (vocabulary 4096, 512 tokens, 8 rows; MemTracker on fake tensors):
    scoring peaks at about one chunk beside the trunk, never near rows x T x V; a training step
    with chunked_loss holds no (T x V) logits. The paper's shape is the slow test below."""
    cfg = ModelConfig(vocab_size=4096, dim=16, n_layers=2, n_heads=2, n_kv_heads=1,
                      ffn_dim=32, max_seq_len=512, latent_bits=H, tie_embeddings=True)
    _check_peaks(_phase_peaks(cfg, 8, None, 4 << 20), cfg, 8, 4 << 20, ratio=5)


PAPER_V, PAPER_T, VAL_B = 1 << 17, 4096, 16


@pytest.mark.slow
@pytest.mark.parametrize("H", [0, 4])
def test_memory_at_the_paper_shape_is_set_by_the_chunk(H):
    """Validation at vocabulary 2^17, sequence 4096, 16 rows (the paper's), a tiny width,
    MemTracker on fake tensors: the unchunked forward holds 32 GiB of float32 logits; scores=True
    with the default 256 MiB chunk peaks near 0.3 GiB, with 32 MiB at the trunk's own peak."""
    cfg = ModelConfig(vocab_size=PAPER_V, dim=32, n_layers=2, n_heads=2, n_kv_heads=1,
                      ffn_dim=64, max_seq_len=PAPER_T, latent_bits=H, tie_embeddings=True)
    _check_peaks(_phase_peaks(cfg, VAL_B, 32 << 20, READOUT_CHUNK_BYTES), cfg, VAL_B,
                 READOUT_CHUNK_BYTES, ratio=50)


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_the_compiled_chunk_equals_the_eager_one(tmp_path, monkeypatch):
    """The fused cross-entropy CUDA runs take (`compiled=True`: each chunk's work after its
    matmul compiled by inductor), here on the CPU: float64 values and gradients against
    F.cross_entropy as the eager chunks' (a shorter last chunk, ignored targets, a gradient for
    one input only, none), and under bf16 autocast the eager chunks' values to rounding."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    h, w, t, ref = _float64_against_reference(compiled=True)
    # the same chunk (7 tokens, the last 1) throughout: each new length or dtype compiles again
    c = 7 * 30 * 8
    gw = torch.autograd.grad(linear_cross_entropy(h.detach(), w, t, c, compiled=True), w)[0]
    torch.testing.assert_close(gw, torch.autograd.grad(F.cross_entropy(F.linear(h.detach(), w),
                                                                       t), w)[0])
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, t, c, compiled=True),
                                   ref.detach())
    h32, w32 = (x.detach().float().requires_grad_() for x in (h, w))
    res = []
    for compiled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = linear_cross_entropy(h32, w32, t, 7 * 30 * 4, compiled=compiled)
        res.append((loss.detach(), *torch.autograd.grad(loss, (h32, w32))))
    assert res[1][0].dtype == torch.float32
    for a, b in zip(res[1], res[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compile_loss_is_a_cuda_knob_that_leaves_the_cpu_eager(monkeypatch):
    """`compile_loss` (set by parallel.compile_units) compiles the chunks on CUDA only: on the
    CPU the chunked loss takes the eager chunks, so CPU numbers do not move."""
    import model.readout as ro

    m = seeded(tiny(latent_bits=4))
    m.chunked_loss = True
    m.compile_loss = True
    monkeypatch.setattr(ro, "compiled_chunk_loss", lambda: pytest.fail("compiled on the CPU"))
    x, y = batch()
    m(x, targets=y, generator=torch.Generator().manual_seed(1)).loss.backward()
