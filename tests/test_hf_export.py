"""A baseline exports to HF LlamaForCausalLM: same logits (1e-4), and lm-eval's own `hf` backend
picks the same multiple-choice answers as our adapter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from experiments.eval.hf_export import export
from experiments.eval.lm_adapter import FTBenchLM
from experiments.eval.tasks import offline_task_manager
from model import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def exported(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("hf")
    # untied readout and a non-default RoPE base, so both paths of the mapping are exercised
    ck = toy_checkpoint(d / "run" / "checkpoints" / "final.pt", seed=3, tie_embeddings=False,
                        rope_theta=500000.0)
    old = os.umask(0o002)  # the files take the mode the umask allows
    try:
        return ck, export(ck, d / "hf")
    finally:
        os.umask(old)


def test_logits_match_transformers(exported: tuple[Path, Path]) -> None:
    from transformers import LlamaForCausalLM

    ck, out = exported
    ours = load_checkpoint(ck).model.eval()
    hf = LlamaForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, ours.cfg.vocab_size, (3, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(x).logits, hf(x).logits
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < 1e-4


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_hf_backend_same_choices(bench_dir, exported: tuple[Path, Path], tmp_path: Path) -> None:
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    ck, out = exported
    tm = offline_task_manager(bench_dir, tmp_path / "tasks")
    tasks = ["arc_easy", "commonsense_qa"]
    kw = dict(tasks=tasks, limit=12, task_manager=tm, log_samples=True, bootstrap_iters=0)
    ours = lm_eval.simple_evaluate(model=FTBenchLM(checkpoint=str(ck), progress=False), **kw)
    hf = lm_eval.simple_evaluate(model=HFLM(pretrained=str(out), batch_size=8, device="cpu"),
                                 **kw)
    n = 0
    for t in tasks:
        for a, b in zip(ours["samples"][t], hf["samples"][t], strict=True):
            assert a["doc_id"] == b["doc_id"]
            la = [r[0][0] for r in a["resps"]]
            lb = [r[0][0] for r in b["resps"]]
            assert la == pytest.approx(lb, abs=2e-3)
            assert max(range(len(la)), key=la.__getitem__) == \
                max(range(len(lb)), key=lb.__getitem__)
            n += 1
    assert n == 24


def test_config_top_level_keys_and_umask(exported: tuple[Path, Path]) -> None:
    import json

    out = exported[1]
    conf = json.loads((out / "config.json").read_text())
    # transformers < 5 reads only these top-level keys (else RoPE base 10000, a slow tokenizer)
    assert conf["rope_theta"] == 500000.0 and conf["tokenizer_class"] == "PreTrainedTokenizerFast"
    for f in out.iterdir():
        assert f.stat().st_mode & 0o777 == 0o664, f


# The oldest transformers pyproject admits, with the tokenizers/hub it was released with,
# installed beside (not into) the venv; CI reaches PyPI, so the test installs it once.
OLD_TF_PINS = ["transformers==4.46.3", "tokenizers==0.20.3", "huggingface_hub==0.26.5"]
OLD_TF = Path(os.environ.get("FTBENCH_OLD_TF", "/tmp/ftbench-tf446"))


def _old_transformers() -> Path:
    import subprocess
    import sys

    if not (OLD_TF / "transformers").is_dir():
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--target", str(OLD_TF), *OLD_TF_PINS],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode
            pytest.skip(f"could not install {' '.join(OLD_TF_PINS)} into {OLD_TF}: {why}")
    return OLD_TF


@pytest.mark.slow
def test_loads_on_old_transformers(exported: tuple[Path, Path], tmp_path: Path) -> None:
    import subprocess
    import sys

    ck, out = exported
    ours = load_checkpoint(ck).model.eval()
    x = torch.randint(0, ours.cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.save({"x": x, "logits": ours(x).logits}, tmp_path / "ref.pt")
    code = (
        "import sys, torch, transformers\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ref = torch.load(sys.argv[2])\n"
        "with torch.no_grad():\n"
        "    d = (m(ref['x']).logits - ref['logits']).abs().max().item()\n"
        "print(transformers.__version__, m.config.rope_theta, type(t).__name__, d)\n")
    env = os.environ | {"PYTHONPATH": str(_old_transformers())}
    r = subprocess.run([sys.executable, "-c", code, str(out), str(tmp_path / "ref.pt")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ver, theta, tok, diff = r.stdout.split()[-4:]
    assert ver == "4.46.3" and float(theta) == 500000.0 and tok == "PreTrainedTokenizerFast"
    assert float(diff) < 1e-4
