"""Model core invariants (issue 2), each checked against an independent computation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from fake import seeded, tiny

from model import (
    PRESETS,
    CheckpointError,
    ModelConfig,
    build_model,
    count_parameters,
    get_preset,
    load_checkpoint,
    param_count,
    save_checkpoint,
    train_flops_per_token,
)
from model.free_transformer import (
    FreeTransformer,
    free_bits_penalty,
    kl_to_uniform,
    latent_embedding,
    mapper_chunk_tokens,
    sample_codes,
)
from model.layers import Block

torch.set_num_threads(1)


# ---------------------------------------------------------------- binary mapper and KL


def dense_latent(bit_logits: torch.Tensor, weight: torch.Tensor, codes: torch.Tensor):
    """The paper's formula, materialised: (Y + G - G.detach()) @ W^T with G over all codes."""
    H = bit_logits.shape[-1]
    d = torch.arange(1 << H)
    bits = ((d[:, None] >> torch.arange(H)) & 1).to(bit_logits.dtype)  # (C, H)
    # log G(code) = sum_h log p(bit_h): two matmuls, never an (N, C, H) tensor
    G = (F.logsigmoid(bit_logits) @ bits.t() + F.logsigmoid(-bit_logits) @ (1 - bits).t()).exp()
    Y = F.one_hot(codes, 1 << H).to(G.dtype)
    return (Y + G - G.detach()) @ weight.t()


# chunk = tokens per chunk of the float64 backward (its budget is tokens x 2^H x 8 bytes); odd H
# splits the bits into unequal halves; a budget below one token still makes one-token chunks.
@pytest.mark.parametrize("H,N,chunk", [(1, 7, 1 << 10), (4, 33, 1), (5, 41, 6), (8, 300, 3),
                                       (12, 512, 512), (16, 6, 4)])
def test_latent_embedding_matches_dense_value_and_grad(H, N, chunk):
    torch.manual_seed(H)
    D = 24
    o1 = (torch.randn(N, H, dtype=torch.float64) * 2).requires_grad_()
    w1 = torch.randn(D, 1 << H, dtype=torch.float64, requires_grad=True)
    codes = sample_codes(o1)
    o2 = o1.detach().clone().requires_grad_()
    w2 = w1.detach().clone().requires_grad_()
    budget = 1 if chunk == 1 else chunk * (1 << H) * 8
    ours = latent_embedding(o1, w1, codes, chunk_bytes=budget)
    ref = dense_latent(o2, w2, codes)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)
    g = torch.randn(N, D, dtype=torch.float64)
    (ours * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(o1.grad, o2.grad, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-9, atol=1e-9)
    assert o1.grad.abs().sum() > 0  # the gradient really flows through G


def test_latent_embedding_float32_at_t512():
    torch.manual_seed(1)
    H, N, D = 12, 512, 16
    o = torch.randn(N, H, requires_grad=True)
    w = torch.randn(D, 1 << H, requires_grad=True)
    codes = sample_codes(o)
    out = latent_embedding(o, w, codes, chunk_bytes=1 << 18)  # 16 float32 tokens per chunk
    g = torch.randn(N, D)
    (out * g).sum().backward()
    o64 = o.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    (dense_latent(o64, w64, codes) * g.double()).sum().backward()
    torch.testing.assert_close(o.grad.double(), o64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("H,N", [(8, 300), (13, 200)])
def test_under_bf16_autocast_mapper_bf16_adds_little_to_the_gradient_error(H, N):
    """mapper_bf16 rounds dL/dG's inputs to bfloat16: the value and W's gradient stay exact, the
    bit-logit gradient is within bf16 rounding of the float64 dense formula (measured ~3e-3).
    The trainer calls backward inside bf16 autocast (train.precision=bf16), where autocast
    also runs the mapper backward's batched mat-vecs and bit sums in bf16; only the dense
    dL/dG = grad_r @ W, written with out=, stays float32 unless mapper_bf16. So under autocast
    mapper_bf16 changes the bit-logit gradient's error against float64 little (measured here:
    6.7e-3 -> 7.3e-3 at H=8, 6.3e-3 -> 7.0e-3 at H=13; 4.9e-3 -> 5.6e-3 at H=16, N=64): it may
    add at most half of autocast's own error, and the direction stays (min cosine > 0.998)."""
    torch.manual_seed(H)
    o = torch.randn(N, H) * 2
    w = torch.randn(64, 1 << H) * 0.02
    g = torch.randn(N, 64) * 1e-3
    codes = sample_codes(o)
    o64, w64 = o.double().requires_grad_(), w.double().requires_grad_()
    ref = dense_latent(o64, w64, codes)
    (ref * g.double()).sum().backward()
    o1, w1 = o.clone().requires_grad_(), w.clone().requires_grad_()
    out = latent_embedding(o1, w1, codes, chunk_bytes=64 * (1 << H) * 4, bf16=True)
    (out * g).sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=1e-7)
    torch.testing.assert_close(w1.grad.double(), w64.grad, rtol=1e-6, atol=1e-9)
    err = (o1.grad.double() - o64.grad).norm() / o64.grad.norm()
    assert 1e-5 < err < 1e-2, err  # approximate (bf16 really ran), but close
    assert F.cosine_similarity(o1.grad.double(), o64.grad, dim=1).min() > 0.999
    err, cos = {}, {}
    for bf16 in (False, True):
        o1, w1 = o.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = latent_embedding(o1, w1, codes, chunk_bytes=64 * (1 << H) * 4, bf16=bf16)
            (out.float() * g).sum().backward()
        err[bf16] = float((o1.grad.double() - o64.grad).norm() / o64.grad.norm())
        cos[bf16] = float(F.cosine_similarity(o1.grad.double(), o64.grad, dim=1).min())
    assert 1e-3 < err[False] < 2e-2, err  # autocast's bf16 really ran in the backward
    assert err[True] < 1.5 * err[False], err
    assert min(cos.values()) > 0.998, cos


@pytest.mark.parametrize("chunked", [False, True], ids=["logits", "chunked-loss"])
def test_under_bf16_autocast_the_mapper_is_the_only_float32_matmul_of_a_step(chunked):
    """A Free Transformer training step as the trainer runs it under train.precision=bf16
    (forward and backward inside autocast): every matmul (blocks, attention, encoder bit
    logits, readout or chunked cross-entropy, their gradients) runs in bf16 except the
    mapper's dense dL/dG, and mapper_bf16 takes that one too. So TF32 would speed up nothing
    in such a step: the recipes do not set it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from model.free_transformer import SequenceKeys

    class Float32Matmuls(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, tuple]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            if (name in ("mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "linear")
                    or "scaled_dot_product" in name) and any(
                    t.dtype == torch.float32 for t in ts[:2]):
                self.seen.append((name, tuple(tuple(t.shape) for t in ts[:2])))
            return func(*args, **(kwargs or {}))

    x = torch.randint(0, 97, (2, 32))
    y = torch.randint(0, 97, (2, 32))
    seen = {}
    for bf16 in (False, True):
        torch.manual_seed(0)
        m = build_model(tiny(latent_bits=8, mapper_bf16=bf16)).train()
        m.chunked_loss = chunked
        log = Float32Matmuls()
        with torch.autocast("cpu", dtype=torch.bfloat16), log:
            out = m(x, targets=y, generator=SequenceKeys.for_batch(0, 0, 0, 2, x.device))
            out.loss.backward()
        seen[bf16] = log.seen
    # off: dL/dG = grad_r (tokens, D) @ W (D, 2^H), in float32; on: nothing in float32
    assert seen[False] == [("mm", ((2 * 32, 32), (32, 1 << 8)))]
    assert seen[True] == []


@pytest.mark.parametrize("flag", ["mapper_bf16", "z_cut"])
def test_a_model_flag_is_in_the_run_id_only_when_on(flag):
    from experiments.train.config import compose
    from experiments.train.plan import run_id, semantic

    base = compose(["model=1M", "model.latent_bits=4"])
    on = compose(["model=1M", "model.latent_bits=4", f"model.{flag}=true"])
    assert flag not in semantic(base)["model"]  # old run-ids stay valid
    assert semantic(on)["model"][flag] is True
    assert run_id(on) != run_id(base)
    if flag == "mapper_bf16":  # a baseline has no mapper: the same model, so the same run
        b0 = compose(["model=1M", "model.latent_bits=0"])
        b1 = compose(["model=1M", "model.latent_bits=0", "model.mapper_bf16=true"])
        assert run_id(b0) == run_id(b1)
        with pytest.raises(ValueError, match="mapper_bf16"):
            tiny(latent_bits=4, mapper_bf16=1)
    else:
        with pytest.raises(ValueError, match="z_cut"):
            tiny(z_cut=True)  # a baseline has no Z
        assert not tiny(latent_bits=4, z_cut=True).replace(latent_bits=0).z_cut


def test_mapper_chunk_is_a_memory_budget_not_the_model():
    # the same budget means the same memory whatever H and dtype: tokens = bytes // (2^H x size)
    assert mapper_chunk_tokens(128 << 20, 16, 4) == 512
    assert mapper_chunk_tokens(128 << 20, 16, 2) == 1024
    assert mapper_chunk_tokens(128 << 20, 20, 4) == 32
    assert mapper_chunk_tokens(1, 20, 8) == 1  # never zero tokens
    assert ModelConfig().mapper_chunk_bytes == 128 << 20
    cfg = tiny(latent_bits=3)
    assert cfg.replace(mapper_chunk_bytes=1 << 20) == cfg  # a memory knob, not the model
    with pytest.raises(ValueError, match="ModelConfig.mapper_chunk_bytes="):
        tiny(mapper_chunk_bytes=0)


def test_sample_codes_bit_order_and_rates():
    # code = sum_h 2^h bit_h: saturated logits give a known code
    o = torch.tensor([[30.0, -30.0, 30.0, 30.0]])  # bits 1,0,1,1 -> 1 + 4 + 8
    assert sample_codes(o).item() == 13
    torch.manual_seed(0)
    o = torch.tensor([1.0, -2.0, 0.0]).expand(40000, 3)
    c = sample_codes(o)
    rates = torch.stack([(c >> h) & 1 for h in range(3)], -1).float().mean(0)
    torch.testing.assert_close(rates, torch.sigmoid(torch.tensor([1.0, -2.0, 0.0])),
                               atol=0.01, rtol=0)


@pytest.mark.parametrize("H", [1, 3, 6])
def test_kl_to_uniform_equals_enumeration(H):
    torch.manual_seed(H)
    o = torch.randn(5, H, dtype=torch.float64) * 3
    p = torch.sigmoid(o)
    brute = torch.zeros(5, dtype=torch.float64)
    for bits in itertools.product([0, 1], repeat=H):
        b = torch.tensor(bits, dtype=torch.float64)
        q = torch.where(b.bool(), p, 1 - p).prod(-1)  # q(code)
        brute += q * (torch.log(q) - math.log(2.0 ** -H))
    torch.testing.assert_close(kl_to_uniform(o).double(), brute, rtol=1e-5, atol=1e-6)


def test_kl_limits_and_free_bits():
    assert kl_to_uniform(torch.zeros(3, 16)).abs().max() < 1e-6
    sat = kl_to_uniform(torch.full((2, 16), 60.0))
    torch.testing.assert_close(sat, torch.full((2,), 16 * math.log(2.0)), rtol=1e-5, atol=1e-5)
    kl = torch.tensor([[0.1, 1.0], [2.0, 0.0]])
    kappa_bits = 1.0  # ln 2 nats
    expect = (0 + (1.0 - math.log(2)) + (2.0 - math.log(2)) + 0) / 4
    assert free_bits_penalty(kl, kappa_bits).item() == pytest.approx(expect)


# ---------------------------------------------------------------- architecture


@pytest.mark.parametrize("H", [0, 4])
def test_causality(H):
    m = seeded(tiny(latent_bits=H))
    x = torch.randint(0, 97, (2, 20))
    codes = torch.randint(0, 1 << max(H, 1), (2, 20))
    j = 11
    x2 = x.clone()
    x2[:, j] = (x2[:, j] + 5) % 97
    z = codes if H else None
    a = m(x, z=z).logits
    b = m(x2, z=z).logits
    torch.testing.assert_close(a[:, :j], b[:, :j], rtol=0, atol=0)
    assert (a[:, j:] - b[:, j:]).abs().max() > 1e-4
    if H:  # with the prior: same seed -> same codes, still causal
        a = m(x, z="prior", generator=torch.Generator().manual_seed(3)).logits
        b = m(x2, z="prior", generator=torch.Generator().manual_seed(3)).logits
        torch.testing.assert_close(a[:, :j], b[:, :j], rtol=0, atol=0)


@pytest.mark.parametrize("H", [0, 5])
def test_generate_greedy_matches_argmax_of_full_forward(H):
    m = seeded(tiny(latent_bits=H))
    prompt = torch.randint(0, 97, (2, 6))
    new = 10
    z = torch.randint(0, 1 << max(H, 1), (2, 6 + new)) if H else "prior"
    g = m.generate(prompt, new, z=z)
    seq = torch.cat([prompt, torch.tensor(g.tokens)], 1)
    logits = m(seq[:, :-1], z=z[:, :-1] if H else None).logits
    torch.testing.assert_close(logits[:, 5:].argmax(-1), seq[:, 6:])


@pytest.mark.parametrize("H", [0, 5])
def test_batched_generation_with_padding_equals_single_rows(H):
    m = seeded(tiny(latent_bits=H))
    if H:  # saturate the encoder's bits so its sampled prompt codes are deterministic
        with torch.no_grad():
            m.enc_readout.weight.mul_(1e5)
    rows = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    new = 8
    zs = torch.randint(0, 1 << max(H, 1), (3, new))

    def z_for(i):
        return zs[i:i + 1] if H else "prior"

    single = [m.generate([r], new, z=z_for(i)).tokens[0] for i, r in enumerate(rows)]
    batched = m.generate(rows, new, z=zs if H else "prior").tokens
    assert batched == single
    if H:  # the encoder saw each row's own prompt only, whatever the padding
        one = [m.generate([r], new, z=z_for(i)).codes[0] for i, r in enumerate(rows)]
        assert m.generate(rows, new, z=zs).codes == one


def test_prior_codes_are_per_token_and_uniform():
    m = seeded(tiny(latent_bits=3))
    x = torch.randint(0, 97, (64, 32))
    out = m(x, z="prior", generator=torch.Generator().manual_seed(0))
    c = out.codes
    assert c.shape == (64, 32)
    # not one Z shared by every position: most rows hold several distinct codes
    assert (torch.tensor([len(set(r)) for r in c.tolist()]) > 1).all()
    counts = torch.bincount(c.flatten(), minlength=8).float() / c.numel()
    assert (counts - 1 / 8).abs().max() < 0.02


def test_zero_post_sampler_equals_baseline():
    cfg = tiny()
    base = seeded(cfg, seed=1)
    ft = FreeTransformer(cfg.replace(latent_bits=6)).eval()
    missing = ft.load_state_dict(base.state_dict(), strict=False)
    assert not missing.unexpected_keys
    assert {k.split(".")[0] for k in missing.missing_keys} == {
        "zeta", "encoder", "enc_norm", "enc_readout", "post_sampler"}
    with torch.no_grad():
        ft.post_sampler.weight.zero_()
    x = torch.randint(0, 97, (2, 16))
    for z in ("prior", "posterior"):
        torch.testing.assert_close(ft(x, z=z).logits, base(x).logits, rtol=0, atol=0)


def test_parameter_overhead_is_one_block_plus_latent_parts():
    for cfg in (tiny(latent_bits=7), get_preset("1M", latent_bits=16)):
        base = build_model(cfg.replace(latent_bits=0))
        ft = build_model(cfg)
        D, H, F_ = cfg.dim, cfg.latent_bits, cfg.ffn_dim
        hd = cfg.head_dim
        one_block = (D * cfg.n_heads * hd * 2 + D * cfg.n_kv_heads * hd * 2 + 3 * D * F_ + 2 * D)
        assert one_block == sum(p.numel() for p in Block(cfg).parameters())
        expect = one_block + D + D + D * H + D * (1 << H)  # + zeta, norm, readout, post-sampler
        assert count_parameters(ft) - count_parameters(base) == expect
        assert param_count(cfg)["total"] == count_parameters(ft)
        assert param_count(cfg)["baseline"] == count_parameters(base)


def test_encoder_is_noncausal_but_prefill_sees_only_prompt():
    m = seeded(tiny(latent_bits=6))
    x = torch.randint(0, 97, (1, 12))
    x2 = x.clone()
    x2[0, -1] = (x2[0, -1] + 1) % 97
    from model.transformer import _Ctx

    def bits(tokens, prefix=None):
        ctx = _Ctx(rope=m._rope(None, tokens.shape[1]))
        h = m.tok_emb(tokens)
        for blk in m.blocks[:m.inject_at]:
            h = blk(h, ctx.rope)
        if prefix is not None:
            from model.free_transformer import _prefix_mask

            ctx.enc_mask = _prefix_mask(torch.tensor([prefix]), tokens.shape[1])
        return m.encode(h, ctx)

    # non-causal: the bit logits at position 0 depend on the last token
    assert (bits(x)[0, 0] - bits(x2)[0, 0]).abs().max() > 1e-6
    # with a prefix of 8, nothing at or after position 8 reaches the encoder's output before 8
    torch.testing.assert_close(bits(x, 8)[0, :8], bits(x2, 8)[0, :8], rtol=0, atol=0)
    # and the scored protocol: logits before the changed token agree, codes after it are prior
    pl = torch.tensor([8])
    a = m(x, z="prior", prefix_len=pl, generator=torch.Generator().manual_seed(0))
    b = m(x2, z="prior", prefix_len=pl, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a.logits[:, :11], b.logits[:, :11], rtol=0, atol=0)
    torch.testing.assert_close(a.codes, b.codes)
    # generate: the prompt's codes do not depend on anything but the prompt
    g1 = m.generate(x[:, :8], 4, generator=torch.Generator().manual_seed(1))
    g2 = m.generate(x[:, :8], 4, generator=torch.Generator().manual_seed(1))
    assert g1.codes == g2.codes and len(g1.codes[0]) == 8 + 3


def test_training_mode_uses_encoder_and_loss_adds_free_bits():
    cfg = tiny(latent_bits=4, kappa_bits=0.0)
    m = build_model(cfg).train()
    x = torch.randint(0, 97, (2, 16))
    out = m(x, targets=x, generator=torch.Generator().manual_seed(0))
    assert out.kl_tokens is not None and out.kl_tokens.shape == (2, 16)
    torch.testing.assert_close(out.loss, out.ce + out.kl_tokens.mean())
    out.loss.backward()
    assert m.enc_readout.weight.grad.abs().sum() > 0  # the encoder trains through G
    assert m.zeta.grad.abs().sum() > 0


# ---------------------------------------------------------------- accounting


# both arms, the chunked training loss (its gradients made in the forward from each chunk's
# logits, never recomputed) and the Z-cut control (its product with 0 adds B*T*D
# multiplications to the forward and as many to the backward; no FLOP less than the FT)
@pytest.mark.parametrize("over,chunked", [({}, False), ({"latent_bits": 6}, False),
                                          ({"latent_bits": 4}, True),
                                          ({"latent_bits": 5, "z_cut": True}, False)],
                         ids=["baseline", "free", "free-chunked-loss", "z-cut"])
def test_train_flops_match_flop_counter(over, chunked):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = tiny(**over)
    m = build_model(cfg).train()
    m.chunked_loss = chunked
    m.readout_chunk_bytes = 7 * 97 * 4  # 7 float32 tokens a chunk
    B, T = 2, 24
    x = torch.randint(0, 97, (B, T))
    counter = FlopCounterMode(display=False)
    # the math backend runs attention as bmm's the counter sees (the fused CPU kernel is not
    # registered with FlopCounterMode)
    with sdpa_kernel(SDPBackend.MATH), counter:
        m(x, targets=x).loss.backward()
    analytic = train_flops_per_token(cfg, T).total * B * T
    if cfg.z_cut:
        assert 0 <= counter.get_total_flops() - analytic <= 4 * B * T * cfg.dim
    else:
        assert counter.get_total_flops() == pytest.approx(analytic, rel=1e-9)


def test_flops_overhead_near_one_over_L_for_paper_presets():
    for name, L in (("1.5B", 28), ("8B", 32)):
        cfg = PRESETS[name]
        f = train_flops_per_token(cfg.replace(latent_bits=16), 4096)
        block_share = f.encoder_block / f.blocks
        assert block_share == pytest.approx(1 / L)
        assert 1 / L < f.overhead < 1 / L + 0.03  # readout and mapper add a little


def test_preset_names_match_parameter_counts():
    def label(n: int) -> str:
        return f"{n / 1e9:.1f}B".replace(".0B", "B") if n >= 1e9 else f"{round(n / 1e6)}M"

    for name, cfg in PRESETS.items():
        n = param_count(cfg)["total"]
        assert label(n) == name, (name, n)
    assert param_count(PRESETS["1M"])["total"] < 2e6


# ---------------------------------------------------------------- config and checkpoints


@pytest.mark.parametrize("kw,field", [
    (dict(latent_bits=3, n_layers=3), "n_layers"),
    (dict(latent_bits=21), "latent_bits"),
    (dict(latent_bits=-1), "latent_bits"),
    (dict(kappa_bits=-0.5), "kappa_bits"),
    (dict(kappa_bits=float("nan")), "kappa_bits"),
    (dict(dim=30, n_heads=4), "n_heads"),
    (dict(n_kv_heads=3), "n_kv_heads"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_bad_config_raises_naming_field(kw, field):
    with pytest.raises(ValueError, match=f"ModelConfig.{field}="):
        tiny(**kw)


def test_checkpoint_roundtrip_atomic_and_errors(tmp_path):
    cfg = tiny(latent_bits=3)
    m = seeded(cfg)
    tok = {"type": "chars", "alphabet": "abc"}
    p = save_checkpoint(tmp_path / "c.pt", m, tokenizer=tok, extra={"step": 5})
    assert [f.name for f in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left
    ld = load_checkpoint(p)
    assert ld.config == cfg and ld.tokenizer == tok and ld.extra["step"] == 5
    x = torch.randint(0, 97, (1, 8))
    c = torch.randint(0, 8, (1, 8))
    torch.testing.assert_close(ld.model.eval()(x, z=c).logits, m(x, z=c).logits)
    # truncated file
    data = p.read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or unreadable"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "none.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")  # a readable file, not ours
    with pytest.raises(CheckpointError, match="is not a"):
        load_checkpoint(tmp_path / "other.pt")
    (tmp_path / "other.pt").unlink()
    # a failed write leaves the old file intact and no temporary behind
    class Boom:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        save_checkpoint(p, m, extra={"x": Boom()})
    assert load_checkpoint(p).extra["step"] == 5
    assert sorted(f.name for f in tmp_path.iterdir()) == ["bad.pt", "c.pt"]


def test_atomic_write_honours_the_umask(tmp_path):
    """Files are written with the mode open() would give them (mkstemp alone makes 0600, which
    a group sharing a cluster's results cannot read)."""
    import os

    from common.io import atomic_write_text

    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "a.json", "{}")
        assert p.stat().st_mode & 0o777 == 0o644
        ck = save_checkpoint(tmp_path / "c.pt", seeded(tiny()))
        assert ck.stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        assert atomic_write_text(tmp_path / "b.json", "{}").stat().st_mode & 0o777 == 0o600
        os.umask(0o002)
        assert atomic_write_text(tmp_path / "g.json", "{}").stat().st_mode & 0o777 == 0o664
        # an existing file keeps its mode on overwrite, as open(path, "w") would
        os.chmod(p, 0o640)
        assert atomic_write_text(p, "[]").stat().st_mode & 0o777 == 0o640
        assert p.read_text() == "[]"
    finally:
        os.umask(old)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["a.json", "b.json", "c.pt", "g.json"]


@pytest.mark.parametrize("H", [0, 4])
def test_logits_from_equals_the_slice_of_full_logits(H):
    m = seeded(tiny(latent_bits=H))
    x = torch.randint(0, 97, (2, 16))
    z = torch.randint(0, 1 << max(H, 1), (2, 16)) if H else None
    full = m(x, targets=x, z=z)
    part = m(x, targets=x, z=z, logits_from=10)
    torch.testing.assert_close(part.logits, full.logits[:, 10:])
    ref = F.cross_entropy(full.logits[:, 10:].flatten(0, 1), x[:, 10:].flatten())
    torch.testing.assert_close(part.ce, ref)
    with pytest.raises(ValueError, match="logits_from=16"):
        m(x, logits_from=16)


# ---------------------------------------------------------------- the split forward
@pytest.mark.parametrize("H", [0, 3])
def test_split_forward_equals_forward_in_float64(H):
    """forward_upper(forward_lower(x)) is forward(x) with the same codes, to the last bit in
    float64; the FT's lower half gives the bit logits the posterior path samples from."""
    m = seeded(tiny(latent_bits=H)).double()
    x = torch.randint(0, 97, (3, 20))
    low = m.forward_lower(x)
    assert low.hidden.dtype == torch.float64 and low.hidden.shape == (3, 20, 32)
    assert m.split_at == 2
    if not H:
        assert low.bit_logits is None
        torch.testing.assert_close(m.forward_upper(low.hidden), m(x).logits, rtol=0, atol=0)
        torch.testing.assert_close(m.forward_upper(low.hidden, logits_from=7),
                                   m(x, logits_from=7).logits, rtol=0, atol=0)
        with pytest.raises(ValueError, match="codes=None"):
            m.forward_upper(low.hidden, torch.zeros(3, 20, dtype=torch.long))
        return
    assert m.inject_at == m.split_at and low.bit_logits.shape == (3, 20, H)
    codes = torch.randint(0, 1 << H, (3, 20))
    ref = m(x, z=codes).logits
    torch.testing.assert_close(m.forward_upper(low.hidden, codes), ref, rtol=0, atol=0)
    torch.testing.assert_close(m.forward_upper(low.hidden, codes, logits_from=7),
                               m(x, z=codes, logits_from=7).logits, rtol=0, atol=0)
    # the adversary: the codes and the hidden state both reach the logits
    other = (codes + 1) % (1 << H)
    assert (m.forward_upper(low.hidden, other) - ref).abs().max() > 1e-3
    assert (m.forward_upper(low.hidden * 0.5, codes) - ref).abs().max() > 1e-3
    # the posterior path: the same bit logits, hence the same KL and, with one seed, codes
    post = m(x, z="posterior", generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(kl_to_uniform(low.bit_logits), post.kl_tokens, rtol=0, atol=0)
    drawn = sample_codes(low.bit_logits, torch.Generator().manual_seed(4))
    assert torch.equal(drawn, post.codes)
    torch.testing.assert_close(m.forward_upper(low.hidden, drawn), post.logits, rtol=0, atol=0)
    # a prior draw returned by forward, pinned, gives that forward's logits
    pri = m(x, z="prior", generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(m.forward_upper(low.hidden, pri.codes), pri.logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="pinned codes"):
        m.forward_upper(low.hidden)
    with pytest.raises(ValueError, match="pinned codes must have shape"):
        m.forward_upper(low.hidden, codes[:, :5])


# ---------------------------------------------------------------- the Z-cut control


def test_z_cut_decoder_sees_no_z_but_keeps_the_encoder_kl_and_flops():
    """model.z_cut: the logits do not depend on the codes, the encoder still trains on its KL
    penalty alone, the post-sampler gets a zero gradient (its FLOPs: test_train_flops_*)."""
    cfg = tiny(latent_bits=5, kappa_bits=0.0)
    cut = seeded(cfg.replace(z_cut=True), seed=3)
    ft = seeded(cfg, seed=3)  # same weights: z_cut adds no parameter
    assert count_parameters(cut) == count_parameters(ft)
    x = torch.randint(0, 97, (2, 16))
    a = torch.randint(0, 32, (2, 16))
    b = (a + 7) % 32
    torch.testing.assert_close(cut(x, z=a).logits, cut(x, z=b).logits, rtol=0, atol=0)
    assert not torch.equal(ft(x, z=a).logits, ft(x, z=b).logits)  # the FT does read Z
    # with Z cut, the decoder equals the FT whose post-sampler is zero
    zero = seeded(cfg, seed=3)
    with torch.no_grad():
        zero.post_sampler.weight.zero_()
    torch.testing.assert_close(cut(x, z=a).logits, zero(x, z=a).logits, rtol=0, atol=0)

    cut.train()
    out = cut(x, targets=x)
    assert float(out.kl.detach()) > 0
    out.loss.backward()
    assert float(cut.post_sampler.weight.grad.abs().max()) == 0.0
    # the encoder's gradient is the KL penalty's alone: the CE part through Z is exactly 0
    g_total = cut.enc_readout.weight.grad.clone()
    cut.zero_grad()
    out = cut(x, targets=x)
    (out.loss - out.ce).backward()
    torch.testing.assert_close(cut.enc_readout.weight.grad, g_total, rtol=1e-6, atol=1e-9)
    assert float(g_total.abs().max()) > 0
