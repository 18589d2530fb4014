"""Evaluation that keeps up at scale (issue 27): data-parallel scoring over gloo processes equals
one process, item for item; the spec records the window (the trained seq_len: test_eval_run.py);
the optimizer state is never loaded."""

from __future__ import annotations

import json
import os
import pickle
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from common.records import EvalRequest, EvalRuntime, EvalSpec
from experiments.eval.lm_adapter import DataParallel, FTBenchLM, share
from model.checkpoint import load_checkpoint, load_weights, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LONG = "def f(x):\n    return [i * x for i in range(10) if i % 2 == 0]\n" * 6
PAIRS = [("Question: What is 2 + 3?\nAnswer:", " 5"), ("Answer: ", "42"),
         ("    ret", "urn x"), ("x", LONG),  # a continuation longer than the window: pieces
         ("The following are multiple choice questions.\nA. red\nB. blue\nAnswer:", " B"),
         ("The following are multiple choice questions.\nA. red\nB. blue\nAnswer:", " A"),
         ("Q: name a colour.\nA:", " red"), ("Q: name a colour.\nA:", " blue")]
ROLLING = ["Hello world. " * 3, LONG, "import os\nprint(os.getcwd())\n", "x = 1\n" * 30]
GEN = [("Question: What is 2 + 3?\nAnswer:", {"until": ["\n\n"], "max_gen_toks": 8}),
       ("def add(a, b):\n", {"until": ["\ndef"], "max_gen_toks": 6}),
       (LONG, {"until": ["\n\n"], "max_gen_toks": 8}),  # the prompt alone fills the window
       ("x = ", {"until": ["."], "max_gen_toks": 5, "do_sample": True, "temperature": 1.0}),
       ("y = ", {"until": ["."], "max_gen_toks": 5, "do_sample": True, "temperature": 1.0}),
       ("Answer:", {"until": ["\n\n"], "max_gen_toks": 8})]
# (arm, z, k): both arms; for the Free Transformer one and several draws, and the diagnostic
CONFIGS = [("base", "prior", 1), ("free", "prior", 1), ("free", "prior-k", 2),
           ("free", "posterior", 1)]


class _Req:
    def __init__(self, *args: object) -> None:
        self.args = args
        self.task_name = "t"


def _score(lm: FTBenchLM) -> dict:
    return {"ll": lm.loglikelihood_pairs(PAIRS, disable_tqdm=True),
            "draws": {f"{a!r}|{b!r}": d for (a, b), d in lm.draw_logliks.items()},
            "rolling": lm.loglikelihood_rolling([_Req(s) for s in ROLLING], disable_tqdm=True),
            "gen": lm.generate_until([_Req(c, g) for c, g in GEN], disable_tqdm=True),
            "trunc": lm.truncation_record(GEN), "requests": lm.n_requests}


def _lm(ckpts: dict[str, str], arm: str, z: str, k: int, dp: DataParallel | None) -> FTBenchLM:
    return FTBenchLM(checkpoint=ckpts[arm], z=z, k=k, seed=3, batch_size=2, max_length=64,
                     progress=False, data_parallel=dp)


def _worker(rank: int, world: int, store: str, ckpts: dict[str, str], out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dp = DataParallel(rank, world)
    got = {}
    for arm, z, k in CONFIGS:
        lm = _lm(ckpts, arm, z, k, dp)
        if rank > 0:
            lm.serve()
            continue
        try:
            got[(arm, z, k)] = _score(lm)
        finally:
            lm.stop_workers()
    if rank == 0:
        Path(out).write_bytes(pickle.dumps(got))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ckpts(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("dp")
    return {"base": str(toy_checkpoint(d / "b" / "checkpoints" / "final.pt")),
            "free": str(toy_checkpoint(d / "f" / "checkpoints" / "final.pt", free=True))}


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_two_gloo_processes_equal_one(ckpts: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "dp.pkl"
    mp.start_processes(_worker, args=(2, str(tmp_path / "store"), ckpts, str(out)), nprocs=2,
                       join=True, start_method="spawn")
    par = pickle.loads(out.read_bytes())
    for cfg in CONFIGS:
        one = _score(_lm(ckpts, *cfg, None))
        two = par[cfg]
        assert two == one, cfg  # exact: the same units run the same ops with the same draws
        # the batch really was split: some draws differ between requests, scores are real
        assert all(ll < 0 for ll, _ in two["ll"]) and all(r < 0 for r in two["rolling"])
    # the sampled generations depend on the seed's draws, and the draws are the request's
    assert par[("free", "prior-k", 2)]["draws"] and len(
        next(iter(par[("free", "prior-k", 2)]["draws"].values()))) == 2
    assert par[("base", "prior", 1)]["trunc"]["n_truncated"] == 1


def test_shares_are_whole_balanced_and_the_same_on_every_rank() -> None:
    costs = [5.0, 1.0, 1.0, 3.0, 2.0, 2.0]
    owner = share(costs, 2)
    assert owner == share(costs, 2)  # deterministic
    load = [sum(c for c, o in zip(costs, owner, strict=True) if o == r) for r in range(2)]
    assert sorted(load) == [7.0, 7.0]
    assert share(costs, 1) == [0] * 6 and share([], 3) == []


def test_spec_context_keeps_old_ids() -> None:
    old = EvalSpec.from_args("lm-eval", ["arc_easy"], 20, "prior", 1, None, None, {})
    d = old.to_json()
    assert "context" not in d and EvalSpec.from_json(d).id == old.id  # legacy: unchanged
    new = EvalSpec.from_args("lm-eval", ["arc_easy"], 20, "prior", 1, None, None, {}, 256)
    assert new.to_json()["context"] == 256 and new.id != old.id
    assert EvalSpec.from_json(new.to_json()) == new and EvalSpec.from_json(
        new.to_json()).id == new.id
    assert "context" not in EvalSpec.from_json(new.to_json()).extra


# ----------------------------------------------------------------------------- weights only
def _poisoned(src: Path, dst: Path) -> None:
    """A copy of a checkpoint whose optimizer entry is poisoned: NaN moments of the wrong shape,
    a nonsense param_groups, and a tensor whose bytes are overwritten in the file."""
    ck = load_checkpoint(src)
    pat = torch.full((1 << 16,), 0x5A, dtype=torch.uint8)
    opt = {"state": {0: {"exp_avg": torch.full((3,), float("nan")), "blob": pat}},
           "param_groups": "poison"}
    save_checkpoint(dst, ck.model, tokenizer=ck.tokenizer,
                    extra={"step": 7, "optimizer": opt, "optimizer_format": "ids"})
    raw = dst.read_bytes()
    n = 1 << 16
    i = raw.find(b"\x5a" * n)
    assert i > 0 and raw.find(b"\x5a" * n, i + n) < 0
    dst.write_bytes(raw[:i] + b"\xa5" * n + raw[i + n:])


def test_evaluation_loads_no_optimizer_state(ckpts: dict[str, str], tmp_path: Path) -> None:
    for arm in ("base", "free"):
        src = Path(ckpts[arm])
        bad = tmp_path / arm / "checkpoints" / "step_7.pt"
        bad.parent.mkdir(parents=True)
        _poisoned(src, bad)
        w = load_weights(bad)
        assert w.extra == {"step": 7, "optimizer_format": "ids"}  # plain values only
        ref = load_checkpoint(src).model.state_dict()
        got = w.model.state_dict()
        assert set(got) == set(ref) and all(torch.equal(got[n], ref[n]) for n in ref)
        assert not any(t.is_meta for t in [*w.model.parameters(), *w.model.buffers()])
        if w.config.tie_embeddings:
            assert w.model.output.weight is w.model.tok_emb.weight
        z = "prior-k" if arm == "free" else "prior"
        a = FTBenchLM(checkpoint=str(src), z=z, k=2, max_length=64, progress=False)
        b = FTBenchLM(checkpoint=str(bad), z=z, k=2, max_length=64, progress=False)
        assert b.checkpoint_step == 7
        assert a.loglikelihood_pairs(PAIRS[:4], disable_tqdm=True) == \
            b.loglikelihood_pairs(PAIRS[:4], disable_tqdm=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_eval_rank(rank: int, world: int, port: int, ck: str, data: str, out: str) -> None:
    from experiments.eval.run import run_eval

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    got = run_eval(ck, EvalRequest(tasks=("arc_easy", "gsm8k"), limit=3, data=data,
                                   z_mode="prior-k", k=2, max_gen_toks=8),
                   EvalRuntime(progress=False, out_dir=out, batch_size=2))
    Path(out, f"returned.{rank}").write_text(json.dumps({k: str(v) for k, v in got.items()}))


@pytest.mark.slow
def test_run_eval_under_two_processes_writes_what_one_writes(
        toy_checkpoint, bench_dir: Path, tmp_path: Path) -> None:
    """End to end through lm-eval (loglikelihood and generation tasks, gold bpb): the file
    rank 0 writes holds the items one process writes; the other rank writes nothing."""
    from experiments.eval.run import run_eval

    ck = toy_checkpoint(tmp_path / "runs" / "ft" / "checkpoints" / "final.pt", free=True)
    one = run_eval(ck, EvalRequest(tasks=("arc_easy", "gsm8k"), limit=3, data=str(bench_dir),
                                   z_mode="prior-k", k=2, max_gen_toks=8),
                   EvalRuntime(progress=False, out_dir=str(tmp_path / "one"), batch_size=2))
    two_dir = tmp_path / "two"
    mp.start_processes(_run_eval_rank, args=(2, _free_port(), str(ck), str(bench_dir),
                                             str(two_dir)), nprocs=2, join=True,
                       start_method="spawn")
    assert json.loads((two_dir / "returned.1").read_text()) == {}
    a = json.loads(one["lm-eval"].read_text())
    b = json.loads((two_dir / one["lm-eval"].name).read_text())
    assert b["world_size"] == 2 and a["spec_id"] == b["spec_id"]
    assert a["requests"] == b["requests"]
    for t in a["tasks"]:  # every task scored (prior-k generation once died in its spread)
        assert not a["tasks"][t].get("error"), (t, a["tasks"][t]["error"])
        assert a["tasks"][t]["items"] == b["tasks"][t]["items"], t
        assert a["tasks"][t]["metrics"] == b["tasks"][t]["metrics"], t
