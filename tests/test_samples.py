"""The sample test (experiments/eval/samples.py) on tiny planted models.

- A Free Transformer whose post-sampler is zero is exactly its plain decoder (a baseline's
  weights copied in): its prior samples are the baseline's distribution, the test says D <= 0.
- The same Free Transformer with a large post-sampler: Z drawn from the prior drives block L/2,
  its samples are what the plain scorer finds unlikely, and the test calls it (D > 0, its
  interval above 0).
- The scorer's path against the full forward; common random numbers; the reference's
  interpolation and the cluster bootstrap by hand; Python's tokenize rule on edge cases.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from common.errors import UsageError
from experiments.eval import samples as S
from model import ModelConfig, build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CFG = ModelConfig(vocab_size=24, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=48,
                  max_seq_len=40, latent_bits=3, kappa_bits=0.5, init_std=0.2)
SPEC = {**S.SPEC, "prompt_len": 6, "per_prompt": 4, "new_tokens": 12, "batch_prompts": 5,
        "n_boot": 500}
P = 20


def _prompts() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (P, SPEC["prompt_len"]),
                         generator=torch.Generator().manual_seed(0))


def _baseline(seed: int = 0, noise: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    b = build_model(dataclasses.replace(CFG, latent_bits=0)).eval()
    with torch.no_grad():
        b.norm.weight.mul_(6)  # peaked predictions: samples a scorer can tell apart
        for w in b.parameters():
            w.add_(noise * torch.randn_like(w))
    return b


def _ft(base: torch.nn.Module, post_sampler_std: float) -> torch.nn.Module:
    torch.manual_seed(1)
    f = build_model(CFG).eval()
    missing = f.load_state_dict(base.state_dict(), strict=False)
    assert not missing.unexpected_keys  # every baseline weight has its place in the FT
    with torch.no_grad():
        f.post_sampler.weight.normal_(0, post_sampler_std) if post_sampler_std else \
            f.post_sampler.weight.zero_()
    return f


def test_generation_shape_and_common_random_numbers() -> None:
    b = _baseline()
    a1, a2 = S.generate(b, _prompts(), SPEC), S.generate(b, _prompts(), SPEC)
    assert a1.shape == (P * 4, 6 + 12) and torch.equal(a1, a2)
    assert torch.equal(a1[:, :6], _prompts().repeat_interleave(4, 0))  # a prompt's rows together
    # two Free Transformers that ignore Z and agree draw the same samples
    f1, f2 = _ft(b, 0.0), _ft(b, 0.0)
    assert torch.equal(S.generate(f1, _prompts(), SPEC), S.generate(f2, _prompts(), SPEC))


def test_score_is_the_mean_nll_of_the_continuation() -> None:
    b = _baseline()
    seqs = S.generate(b, _prompts(), SPEC)
    got = S.score(b, seqs, 6, batch_size=7)
    with torch.no_grad():
        lp = torch.log_softmax(b(seqs[:, :-1]).logits.double(), -1)
    want = -lp.gather(-1, seqs[:, 1:, None])[..., 0][:, 5:].mean(1)
    assert np.allclose(got, want.numpy(), atol=1e-5)
    with pytest.raises(UsageError, match="plain decoder"):
        S.score(_ft(b, 0.0), seqs, 6)


def test_planted_broken_prior_generation_is_called() -> None:
    """The decision statistic D = S(FT) - S_ref on planted generators: the ladder is two plain
    decoders (the scorer's family, one perturbed: a worse one), at likelihood coordinates 1 and
    2; the FT's bound sits between them (1.5)."""
    b = _baseline()
    good, worse = _baseline(0, 0.0), _baseline(0, 0.02)
    prompts = _prompts()
    lad = [S.score(b, S.generate(m, prompts, SPEC), 6) for m in (good, worse)]
    assert lad[1].mean() > lad[0].mean()  # the perturbed decoder's samples score worse
    healthy = S.score(b, S.generate(_ft(b, 0.0), prompts, SPEC), 6)
    broken = S.score(b, S.generate(_ft(b, 3.0), prompts, SPEC), 6)
    dh = S.cluster_boot(healthy, lad, [1.0, 2.0], 1.5, 4, 500, 12345)
    db = S.cluster_boot(broken, lad, [1.0, 2.0], 1.5, 4, 500, 12345)
    assert dh["D"] < 0 and not db["clipped"]
    assert db["D"] > 0 and db["lo"] > 0, db  # prior generation breaks: the interval says so


def test_reference_and_bootstrap_by_hand() -> None:
    ref, clipped = S.reference([2.0, 1.0, 3.0], [20.0, 10.0, 30.0], 1.5)
    assert ref == pytest.approx(15.0) and not clipped
    assert S.reference([1.0, 2.0], [10.0, 20.0], 0.5) == (10.0, True)  # clipped at the end
    ft = np.array([1.0, 1.0, 3.0, 3.0])  # 2 prompts x 2 samples
    lad = [np.zeros(4), np.full(4, 2.0)]
    d = S.cluster_boot(ft, lad, [0.0, 1.0], 0.25, 2, 200, 0)
    assert d["D"] == pytest.approx(2.0 - 0.5) and d["S_ref"] == pytest.approx(0.5)
    assert 1.5 - 1.0 - 1e-9 <= d["lo"] <= d["hi"] <= 1.5 + 1.0 + 1e-9  # prompt means 1 and 3
    bd = S.boot_diff(ft, np.ones(4), 2, 200, 0)
    assert bd["mean"] == pytest.approx(1.0)


@pytest.mark.parametrize(("text", "ok"), [
    ("def f(x):\n    return x\n", True),
    ("x = (1,\n     2", True),  # cut inside brackets: EOF in multi-line statement
    ('s = """abc\n', True),  # cut inside a triple-quoted string
    ("x = 'abc\n", False),  # an unterminated one-line string
    ("if x:\n        a\n    b\n", False),  # dedent to no outer level
    ("x = 1 $ 2\n", False),
])
def test_tokenize_rule(text: str, ok: bool) -> None:
    assert S.tokenize_passes(text) is ok


def test_sample_texts_cut_at_the_documents_eos() -> None:
    class Tok:
        eos_id = 0

        def decode(self, ids):
            return "".join(chr(96 + i) for i in ids)

    seqs = torch.tensor([[1, 0, 2, 3, 0, 4], [1, 2, 3, 4, 5, 6]])
    assert S.sample_texts(Tok(), seqs, 3) == ["bc", "abcdef"]


# ------------------------------------------------------------------------ files: reuse, pairing
def _train(root, *extra: str):
    from experiments.train import trainer as T
    from experiments.train.config import compose

    return T.train(compose([
        "data=synthetic", "model=1M", "model.dim=32", "model.ffn_dim=64", "model.n_layers=2",
        "model.n_heads=2", "model.n_kv_heads=1", "train.batch_size=4", "train.tokens=1560",
        "data.val_tokens=780", "logging.progress=false", "logging.val_every=1",
        "logging.keep_eval_checkpoints=3", "optim.warmup_steps=1", f"paths.results={root}",
        *extra]))


@pytest.mark.slow
def test_sample_test_files_are_reused_only_for_the_same_inputs(tmp_path) -> None:
    """A second call redoes nothing; a new scorer checkpoint makes new scores and a new result;
    a ladder whose validation rows are not the FT's is refused before anything is written."""
    from pathlib import Path

    spec = {**S.SPEC, "prompt_len": 4, "per_prompt": 2, "new_tokens": 6, "batch_prompts": 4,
            "n_boot": 100}
    ft = Path(_train(tmp_path / "r", "model.latent_bits=2", "train.seed=0"))
    b0 = Path(_train(tmp_path / "r", "train.seed=0"))
    b1 = Path(_train(tmp_path / "r", "train.seed=1"))
    out = tmp_path / "samples"
    path, reused = S.sample_test(ft, b0, b1, out, "cpu", spec)
    doc = json.loads(path.read_text())
    assert not reused and doc["D"]["n_prompts"] == len(S.Workspace(out).rows(
        S.RunDir(ft))) and len(doc["ladder"]) == 3  # every kept checkpoint of the ladder
    files = {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert S.sample_test(ft, b0, b1, out, "cpu", spec) == (path, True)
    assert files == {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    final = b0 / "checkpoints" / "final.pt"  # the scorer's checkpoint changes (rewritten)
    final.write_bytes(final.read_bytes())
    path2, reused = S.sample_test(ft, b0, b1, out, "cpu", spec)
    assert path2 == path and not reused
    assert json.loads(path.read_text())["D"] == doc["D"]  # same weights, same numbers
    other = Path(_train(tmp_path / "o", "train.seed=1", "data.val_tokens=1040"))
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(UsageError, match="validation rows differ"):
        S.sample_test(ft, b0, other, out, "cpu", spec)
    assert sorted(p.name for p in out.rglob("*")) == before
