"""Fused attention in every phase (issue 45): no mask tensor meets grouped-query attention on a
path CUDA runs, and the forms that replace it give today's numbers.

On CUDA a boolean mask with grouped heads rules out the flash kernel (no masks) and the
memory-efficient one (no grouped heads): only cuDNN's kernel (H100, recent torch) or the math
kernel with its float32 score tensor are left. On the CPU the same call takes a fused kernel, so
nothing here measures memory: the guard checks the form of every call the model makes, which
is what decides the CUDA kernel (model/layers.py, `Attention._sdpa`).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from fake import seeded, tiny
from torch.nn.attention.bias import CausalBias

from model import free_transformer as ftm
from model import layers

torch.set_num_threads(1)


@contextlib.contextmanager
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """Record the form of every call of F.scaled_dot_product_attention the model makes
    (model/layers.py's `F` is swapped for a view of torch.nn.functional whose SDPA is wrapped;
    torch's own calls, e.g. a CausalBias materialised on the CPU, are not the model's) and fail
    at once on a mask tensor with grouped heads. Yields [(kind, grouped)], kind in none,
    causal_bias, mask."""
    calls: list[tuple[str, bool]] = []

    def guard(q, k, v, attn_mask=None, **kw):
        grouped = kw.get("enable_gqa", False) or q.shape[-3] != k.shape[-3]
        kind = ("none" if attn_mask is None else
                "causal_bias" if isinstance(attn_mask, CausalBias) else "mask")
        assert not (kind == "mask" and grouped), (
            f"a mask tensor {tuple(attn_mask.shape)} with grouped-query attention "
            f"({q.shape[-3]} query / {k.shape[-3]} KV heads): CUDA's flash and "
            "memory-efficient kernels refuse it")
        calls.append((kind, grouped))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)

    view = types.SimpleNamespace(**{n: getattr(F, n) for n in dir(F) if not n.startswith("__")})
    view.scaled_dot_product_attention = guard
    monkeypatch.setattr(layers, "F", view)
    yield calls


def test_the_guard_catches_a_mask_with_grouped_heads(monkeypatch):
    """What the model called before issue 45 (a bool mask and enable_gqa) fails the guard."""
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8)
    m = torch.ones(3, 5, dtype=torch.bool).tril(2)
    with sdpa_calls(monkeypatch), pytest.raises(AssertionError, match="grouped-query"):
        layers.F.scaled_dot_product_attention(q, k, k, attn_mask=m, enable_gqa=True)


@pytest.mark.parametrize("H", [0, 4], ids=["baseline", "free"])
def test_no_mask_meets_grouped_heads_on_any_evaluation_path(monkeypatch, H):
    """Every path evaluation runs on a GPU: the KV-cache extend on a filled cache (the shared
    context's continuations, through fork_cache), the Free Transformer's prefix encoder (the
    scoring protocol, full forward and extend from an empty cache), batched generation with
    left padding (its prefill, encoder and decode steps), the split forward and scoring."""
    m = seeded(tiny(latent_bits=H))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 97, (3, 20), generator=g)
    codes = torch.randint(0, 16, (3, 20), generator=g) if H else None
    with sdpa_calls(monkeypatch) as calls, torch.no_grad():
        cache = m.new_cache(1, 20)
        kw = {"z": "prior", "prefix_len": torch.tensor([6]), "generator": g} if H else {}
        m.extend(x[:1, :8], cache, **kw)
        m.extend(x[:, 8:], m.fork_cache(cache, 3, 20), z=codes[:, 8:] if H else None)
        m(x, targets=x, scores=True, **({"z": "prior", "prefix_len": torch.tensor([0, 5, 20]),
                                          "generator": g} if H else {}))
        m.score_upper(m.forward_lower(x).hidden, x, codes)
        m.generate([[5, 6, 7, 8, 9], [3], [4, 4, 4]], 4, generator=g)
        m.train()(x, targets=x)  # training: is_causal, the encoder over every position
    kinds = {k for k, grouped in calls if grouped}
    assert kinds == {"none", "causal_bias"}, calls  # grouped heads only without a mask tensor
    # the masked calls ran, without grouped heads: the padded prefill, its decode steps and,
    # for the Free Transformer, the prefix encoder
    assert ("mask", False) in calls


@pytest.mark.parametrize("H", [0, 5], ids=["baseline", "free"])
def test_extend_on_a_filled_cache_equals_the_full_forward_in_float64(H):
    """A context extended in three pieces (the causal bias aligned to the lower right), and
    continuations extending forks of its cache, give the full forward's logits."""
    m = seeded(tiny(latent_bits=H), dtype=torch.float64)
    x = torch.randint(0, 97, (2, 24))
    codes = torch.randint(0, 32, (2, 24)) if H else None

    def z(a, b):
        return codes[:, a:b] if H else None

    full = m(x, z=codes).logits
    cache = m.new_cache(2, 24)
    parts = [m.extend(x[:, a:b], cache, z=z(a, b)).logits for a, b in ((0, 7), (7, 8), (8, 24))]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-12, atol=1e-12)
    head = m.new_cache(1, 10)
    m.extend(x[:1, :10], head, z=codes[:1, :10] if H else None)
    tail = m.extend(x[:1, 10:].expand(3, -1), m.fork_cache(head, 3, 24),
                    z=codes[:1, 10:].expand(3, -1) if H else None).logits
    torch.testing.assert_close(tail, full[:1, 10:].expand(3, -1, -1), rtol=1e-12, atol=1e-12)


def test_extend_under_bf16_autocast_with_a_float32_cache():
    """Evaluation's case: float32 weights (so a float32 KV cache) under bf16 autocast. The
    lower-right causal bias takes the attention call before autocast would cast q, k, v; the
    extend still runs, and equals the full forward to bf16 rounding."""
    m = seeded(tiny())
    x = torch.randint(0, 97, (2, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        full = m(x).logits.float()
        cache = m.new_cache(2, 24)
        parts = [m.extend(x[:, a:b], cache).logits.float() for a, b in ((0, 9), (9, 24))]
    assert cache[0].k.dtype == torch.float32
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=2e-2, atol=2e-2)


def _old_prefix_mask(prefix_len: torch.Tensor, T: int) -> torch.Tensor:
    """The encoder's mask before issue 45: keys < prefix_len and the diagonal, (B, 1, T, T)."""
    k = torch.arange(T)
    m = k[None, None, :] < prefix_len[:, None, None]
    return (m | torch.eye(T, dtype=torch.bool)[None])[:, None]


def test_the_prefix_encoder_scores_as_before_in_float64(monkeypatch):
    """The scoring protocol (z='prior', prefix_len per row, a row without context included):
    the same codes and the same logits as with the old (B, 1, T, T) mask, full forward and
    extend from an empty cache; the encoder's outputs that are kept (before prefix_len) agree."""
    m = seeded(tiny(latent_bits=6), dtype=torch.float64)
    x = torch.randint(0, 97, (4, 16))
    pl = torch.tensor([0, 1, 9, 16])

    def run():
        out = m(x, z="prior", prefix_len=pl, generator=torch.Generator().manual_seed(3))
        ext = m.extend(x, m.new_cache(4, 16), z="prior", prefix_len=pl,
                       generator=torch.Generator().manual_seed(3))
        from model.transformer import _Ctx

        ctx = _Ctx(rope=m._rope(None, 16), enc_mask=ftm._prefix_mask(pl, 16))
        h = m.forward_lower(x).hidden
        return out, ext, m.encode(h, ctx)

    new, new_ext, new_bits = run()
    monkeypatch.setattr(ftm, "_prefix_mask", _old_prefix_mask)
    old, old_ext, old_bits = run()
    assert torch.equal(new.codes, old.codes) and torch.equal(new_ext.codes, old.codes)
    torch.testing.assert_close(new.logits, old.logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new_ext.logits, old.logits, rtol=1e-12, atol=1e-12)
    for b, p in enumerate(pl.tolist()):
        torch.testing.assert_close(new_bits[b, :p], old_bits[b, :p], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["key_padding", "decode", "per_query", "causal_bias"])
def test_each_attention_form_equals_grouped_attention_with_the_mask(kind):
    """`Attention._sdpa` against SDPA with the mask and enable_gqa (the math the old calls did),
    float64: a key-padding mask expanded over the queries (folded heads), a one-query decode step
    with an additive mask (folded), a mask that differs per query (expanded KV heads), and the
    lower-right causal bias (grouped heads, no mask tensor)."""
    from model.layers import Attention

    att = Attention(tiny(n_heads=6, n_kv_heads=2, dim=48))
    g = torch.Generator().manual_seed(1)
    B, Tq, S = 3, 1 if kind == "decode" else 7, 11
    q = torch.randn(B, 6, Tq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 2, S, 8, generator=g, dtype=torch.float64) for _ in range(2))
    if kind == "key_padding":
        mask = (torch.rand(B, S, generator=g) < 0.6)
        mask[:, 0] = True
        mask = mask[:, None, None, :].expand(B, 1, Tq, S)
    elif kind == "decode":
        mask = torch.zeros(B, 1, 1, S, dtype=torch.float64)
        mask[0, ..., :3] = float("-inf")
    elif kind == "per_query":
        mask = torch.rand(B, 1, Tq, S, generator=g) < 0.6
        mask[..., 0] = True
    else:
        mask = torch.nn.attention.bias.causal_lower_right(Tq, S)
    dense = mask._materialize() if kind == "causal_bias" else mask
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)
    torch.testing.assert_close(att._sdpa(q, k, v, mask, False), want, rtol=1e-12, atol=1e-12)
