"""logging.export_dtype (issue 26): the weights-only exports (final.pt, eval_step_<N>.pt) that
evaluation and HF export read are bf16 when the run trains in bf16 (auto; the CUDA default),
fp32 otherwise, or as set; the dtype is in the file and in config.yaml; the key changes no
run-id; a bf16 export evaluates within bf16 rounding of the fp32 weights."""

from __future__ import annotations

import pytest
import torch
import yaml

import experiments.train.trainer as T
from experiments.train.config import compose, export_dtype
from experiments.train.plan import run_id
from model.checkpoint import load_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["data=synthetic", "model=1M", "model.dim=64", "model.ffn_dim=128", "model.n_layers=2",
        "train.batch_size=4", "data.val_tokens=260", "logging.progress=false",
        "logging.log_every=1", "optim.warmup_steps=1", "logging.val_every=0",
        "model.latent_bits=4", f"train.tokens={4 * 4 * 65}", "logging.keep_eval_checkpoints=2"]


@pytest.mark.parametrize("over,device,want", [
    ([], "cuda", "bf16"),                       # auto, CUDA: bf16 autocast -> bf16 export
    ([], "cpu", "fp32"),                        # auto, CPU: fp32 training -> fp32 export
    (["train.precision=bf16"], "cpu", "bf16"),  # the CPU's bf16 autocast
    (["train.precision=fp32"], "cuda", "fp32"),
    (["logging.export_dtype=fp32"], "cuda", "fp32"),
    (["logging.export_dtype=bf16"], "cpu", "bf16"),
])
def test_auto_follows_the_training_precision_and_a_setting_wins(over, device, want):
    assert export_dtype(compose(over), device) == want


def test_the_key_changes_no_run_id():
    base = run_id(compose(TINY))
    assert base == run_id(compose([*TINY, "logging.export_dtype=bf16"]))
    assert base == run_id(compose([*TINY, "logging.export_dtype=fp32"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run (same run-id) twice on this CPU, exporting fp32 (auto) and bf16."""
    out = {}
    for d in ("fp32", "bf16"):
        root = tmp_path_factory.mktemp(d)
        over = [] if d == "fp32" else ["logging.export_dtype=bf16"]
        out[d] = T.train(compose([*TINY, *over, f"paths.results={root}"]))
    assert out["fp32"].name == out["bf16"].name
    return out


def test_exports_are_in_the_dtype_and_say_so(runs):
    for d, want in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ck = runs[d] / "checkpoints"
        for name in ("final.pt", "eval_step_2.pt", "eval_step_4.pt"):
            raw = torch.load(ck / name, weights_only=True)
            floats = {v.dtype for v in raw["model"].values() if v.is_floating_point()}
            assert floats == {want}, (d, name)
            assert raw["extra"]["weights_dtype"] == d
        # the step checkpoints a resume reads stay fp32 whatever the export
        marker = torch.load(ck / "step_4.pt", weights_only=True)
        assert "model" not in marker and "weights_dtype" not in marker["extra"]
        doc = yaml.safe_load((runs[d] / "config.yaml").read_text())
        assert doc["export_dtype"] == d
        assert doc["logging"]["export_dtype"] == ("auto" if d == "fp32" else "bf16")
        assert f"exports (final.pt, eval_step_<N>.pt): {d} weights" in (
            runs[d] / "train.log").read_text()
    a = (runs["fp32"] / "checkpoints" / "final.pt").stat().st_size
    b = (runs["bf16"] / "checkpoints" / "final.pt").stat().st_size
    assert b < 0.6 * a  # half the weights' bytes, plus the same small metadata


def test_bf16_export_is_the_fp32_weights_rounded_and_evaluates_alike(runs):
    f32 = torch.load(runs["fp32"] / "checkpoints" / "final.pt", weights_only=True)["model"]
    b16 = torch.load(runs["bf16"] / "checkpoints" / "final.pt", weights_only=True)["model"]
    assert f32.keys() == b16.keys()
    for k, v in f32.items():  # the same training (bitwise), then one rounding
        assert torch.equal(b16[k], v.to(torch.bfloat16)) if v.is_floating_point() else \
            torch.equal(b16[k], v)
    # evaluation's loader casts the bf16 file back into its float32 model
    m32 = load_weights(runs["fp32"] / "checkpoints" / "final.pt").model.eval()
    m16 = load_weights(runs["bf16"] / "checkpoints" / "final.pt").model.eval()
    assert all(p.dtype == torch.float32 for p in m16.parameters())
    if m16.cfg.tie_embeddings:
        assert m16.output.weight is m16.tok_emb.weight
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, m32.cfg.vocab_size, (4, 64), generator=g)
    with torch.no_grad():
        ce32 = float(m32(x, targets=x, z="prior", generator=torch.Generator().manual_seed(1)).ce)
        ce16 = float(m16(x, targets=x, z="prior", generator=torch.Generator().manual_seed(1)).ce)
    assert ce16 != ce32  # really another set of weights
    # bf16 keeps 8 significant bits: a relative weight error of at most 2^-9 per parameter
    assert abs(ce16 - ce32) < 1e-2 * abs(ce32)
