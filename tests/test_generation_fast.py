"""`Transformer.generate` against a frozen copy of the decode loop it replaced (issue 27).

The decode loop reads RoPE rows and an additive key mask from tables built once per call, picks
greedy tokens with max().indices and runs under inference_mode. None of that may change a token,
a code or a stop: evaluation results (greedy and sampled, both arms, under the same generator)
must be what the previous loop gave, bit for bit. `_reference_generate` below is that loop as it
was (per-step RoPE gather, per-step bool mask, argmax), so a difference is the new code's.
"""

from __future__ import annotations

import pytest
import torch
from fake import tiny

from model import build_model
from model.transformer import Generation, _Ctx

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _causal_mask(s0: int, tq: int, device: torch.device) -> torch.Tensor:
    """(tq, s0+tq) bool: query i (absolute s0+i) sees keys 0..s0+i (the old loop's mask)."""
    k = torch.arange(s0 + tq, device=device)
    q = torch.arange(s0, s0 + tq, device=device)
    return k[None, :] <= q[:, None]


def _reference_sample(logits, temperature, top_p, generator):
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, si = probs.sort(dim=-1, descending=True)
        drop = (sp.cumsum(-1) - sp) >= top_p
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
    gdev = generator.device if generator is not None else probs.device
    return torch.multinomial(probs.to(gdev), 1, generator=generator).squeeze(-1).to(logits.device)


@torch.no_grad()
def _reference_generate(m, prompt, max_new_tokens, temperature=0.0, top_p=1.0, z="prior",
                        stop=None, generator=None, eos_id=None, stop_when=None) -> Generation:
    """The decode loop of model/transformer.py before issue 27, unchanged but for names."""
    rows = m._rows(prompt)
    B = len(rows)
    lens = torch.tensor([len(r) for r in rows])
    P = int(lens.max())
    total = P + max_new_tokens
    dev = m.device
    pad = (P - lens).to(dev)
    toks = torch.zeros(B, P, dtype=torch.long, device=dev)
    for b, r in enumerate(rows):
        toks[b, P - len(r):] = torch.tensor(r, dtype=torch.long)
    t_idx = torch.arange(total, device=dev)
    pos = (t_idx[None, :] - pad[:, None]).clamp(min=0)
    valid = t_idx[None, :] >= pad[:, None]
    padded = bool((pad > 0).any())
    z_prompt, z_new = m._gen_codes(z, B, P, max_new_tokens)

    def mask_for(s0, tq):
        if not padded:
            return None if s0 == 0 or tq == 1 else _causal_mask(s0, tq, dev)[None, None]
        q = t_idx[s0:s0 + tq, None]
        k = t_idx[None, :s0 + tq]
        mk = valid[:, None, :s0 + tq] & (k <= q)[None]
        return (mk | (k == q)[None])[:, None]

    cache = m.new_cache(B, total)
    enc_mask = None
    if padded:
        km = valid[:, None, :P]
        enc_mask = (km | torch.eye(P, dtype=torch.bool, device=dev)[None])[:, None]
    ctx = _Ctx(rope=m._rope(pos[:, :P], P), mask=mask_for(0, P), cache=cache,
               z="posterior" if z_prompt is None else z_prompt, enc_mask=enc_mask,
               generator=generator)
    logits = m._run(toks, ctx, P - 1)[:, -1]
    prompt_codes = ctx.codes
    new_codes = [[] for _ in range(B)]
    stops = [list(s) for s in (stop or []) if len(s) > 0]
    out = [[] for _ in range(B)]
    done = [False] * B
    stopped = [False] * B
    active = list(range(B))
    for i in range(max_new_tokens):
        nxt = _reference_sample(logits, temperature, top_p, generator)
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
            idx = torch.tensor(keep, device=dev)
            for c in cache:
                c.k, c.v = c.k.index_select(0, idx), c.v.index_select(0, idx)
            pos, valid, nxt = pos[idx], valid[idx], nxt[idx]
            if isinstance(z_new, torch.Tensor):
                z_new = z_new[idx.to(z_new.device)]
            active = [active[j] for j in keep]
        s0 = P + i
        zi = z_new[:, i:i + 1] if isinstance(z_new, torch.Tensor) else "prior"
        ctx = _Ctx(rope=m._rope(pos[:, s0:s0 + 1], 1), mask=mask_for(s0, 1), cache=cache,
                   z=zi, generator=generator)
        logits = m._run(nxt[:, None], ctx)[:, -1]
        if ctx.codes is not None:
            for b, c in zip(active, ctx.codes[:, 0].tolist(), strict=True):
                new_codes[b].append(c)
    code_rows = None
    if prompt_codes is not None:
        pc = prompt_codes.tolist()
        code_rows = [pc[b][P - len(r):] + new_codes[b][:len(out[b])] for b, r in enumerate(rows)]
    return Generation(tokens=out, codes=code_rows, stopped=stopped)


def _rows(seed: int, n: int, lo: int, hi: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(1, 97, (k,), generator=g).tolist() for k in lens]


def _model(H: int, seed: int = 0, sharp: bool = False):
    torch.manual_seed(seed)
    m = build_model(tiny(latent_bits=H, max_seq_len=96)).eval()
    if sharp:  # larger logits: greedy rows repeat themselves, so stop sequences fire early
        with torch.no_grad():
            m.output.weight.mul_(30.0)
    return m


def _same(a: Generation, b: Generation) -> None:
    assert a.tokens == b.tokens
    assert a.stopped == b.stopped
    assert a.codes == b.codes


@pytest.mark.parametrize("H", [0, 5])
# left-padded rows under every sampler; no padding at all (the mask-free path) greedy only
@pytest.mark.parametrize("lens,temperature,top_p", [((1, 12), 0.0, 1.0), ((1, 12), 1.0, 1.0),
                                                    ((1, 12), 0.8, 0.9), ((7, 7), 0.0, 1.0)])
def test_generate_equals_the_previous_loop(H, lens, temperature, top_p):
    m = _model(H)
    rows = _rows(1, 9, *lens)
    new = 30
    free = _reference_generate(m, rows, new).tokens
    # stops taken from the free greedy rows so some rows end early, at different steps
    stops = [free[0][4:6], free[3][11:13], [free[5][20]]]
    eos = free[7][17]

    def when(toks: list[int]) -> bool:  # a text-style test on the new tokens
        return len(toks) >= 3 and toks[-1] == toks[-3]

    stopped = []
    for kw in ({}, {"stop": stops, "eos_id": eos}, {"stop": stops, "stop_when": when}):
        ref = _reference_generate(m, rows, new, temperature, top_p,
                                  generator=torch.Generator().manual_seed(11), **kw)
        got = m.generate(rows, new, temperature, top_p,
                         generator=torch.Generator().manual_seed(11), **kw)
        _same(got, ref)
        stopped.append(sum(ref.stopped))
    if temperature == 0.0:  # the stop sequences end some rows early, not all
        assert 0 < stopped[1] < len(rows)


@pytest.mark.parametrize("H", [0, 6])
def test_generate_equals_the_previous_loop_sharp_logits_and_pinned_codes(H):
    # peaked logits make greedy rows loop, so stop sequences end most rows early and the batch
    # shrinks many times; pinned new-token codes must follow their rows through that
    m = _model(H, seed=3, sharp=True)
    rows = _rows(2, 12, 1, 20)
    new = 40
    free = _reference_generate(m, rows, new).tokens
    stops = [free[b][6 + b:8 + b] for b in range(0, 12, 3)]
    z = torch.randint(0, 1 << H, (12, new)) if H else "prior"
    for temperature in (0.0, 1.5):
        ref = _reference_generate(m, rows, new, temperature, z=z, stop=stops,
                                  generator=torch.Generator().manual_seed(5))
        got = m.generate(rows, new, temperature, z=z, stop=stops,
                         generator=torch.Generator().manual_seed(5))
        _same(got, ref)
    assert 0 < sum(ref.stopped) < 12


def test_greedy_ties_take_the_first_maximal_token():
    m = _model(0)
    logits = torch.zeros(3, 97)
    logits[0, [5, 9]] = 2.0
    logits[1, [0, 96]] = 1.0
    logits[2, 40] = float("nan")  # argmax counts NaN as the maximum; so must the sampler
    assert m._sample(logits, 0.0, 1.0, None).tolist() == logits.argmax(-1).tolist() == [5, 0, 40]


def test_generate_leaves_no_inference_tensors_in_the_outputs():
    # the result is plain lists, and a training step still runs after generation
    m = _model(5)
    g = m.generate(_rows(4, 3, 2, 6), 5)
    assert isinstance(g.tokens[0], list) and isinstance(g.codes[0][0], int)
    m.train()
    x = torch.randint(0, 97, (2, 8))
    m(x[:, :-1], targets=x[:, 1:]).loss.backward()


@pytest.mark.parametrize("H", [0, 5])
def test_generate_equals_the_previous_loop_under_bf16_autocast(H):
    # the additive key mask takes the queries' dtype (autocast's), as SDPA's own bool-mask
    # conversion does; padded rows, so the mask is used at every step
    m = _model(H)
    rows = _rows(6, 5, 1, 9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _reference_generate(m, rows, 12, generator=torch.Generator().manual_seed(2))
        got = m.generate(rows, 12, generator=torch.Generator().manual_seed(2))
    _same(got, ref)

