"""Second contact with one H100 (issue 45, r2-gpu's changes), run by dev/gpu/second_contact.sh:
what only a GPU confirms, each section bounded and written to <out>/second_contact.json as it
finishes (a cut run keeps what it did). Never imported by the packages.

    python dev/gpu/second_contact.py OUT [--cpu]     # --cpu: the CPU paths of the same code

1. plan: gpu-check's plan of paper-1.5B on one H100 from an empty cache (pipelines.gpu_check
   plan_step): the shipped plan (measured/memory/plans/, keyed by shape, not torch) must be hit
   in seconds on a torch that did not make it (skipped where none is shipped).
2. sync: the real trainer (16M widths at the 2^17 vocabulary, so the chunked loss runs; the Free
   Transformer, pinned batches) for 8 steps logging at 4 and 8, under
   torch.cuda.set_sync_debug_mode("warn"): every synchronizing CUDA call with the step it
   belongs to; the steps that neither log nor validate must have none. (CPU: host reads of
   tensors, as tests/test_train_loop.py counts them.)
3. staging: a step checkpoint's staging at 1.5B (fp32 weights + AdamW, 19.9 GB): DCP's default
   stager (a fresh pageable copy, what every save did) vs experiments.train.checkpointer.stager
   (pinned, cached): the first save (allocates and pins) and a later one. (CPU: 1 GB.)
4. ce: the chunked cross-entropy at 8192 x 1536 x 2^17, eager vs compiled chunks
   (dev/gpu/issue45_kernels.py's cross_entropy): time, peak and kernel count. (CPU: small.)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
T0 = time.time()


def section(out: Path, doc: dict[str, Any], name: str, fn: Any) -> None:
    t = time.time()
    try:
        doc[name] = fn()
    except Exception as e:  # noqa: BLE001 - a failed section is recorded, the next one runs
        doc[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
    doc[name + "_s"] = round(time.time() - t, 1)
    print(f"[{time.time() - T0:5.0f} s] {name}: {json.dumps(doc[name], default=str)[:600]}",
          flush=True)
    (out / "second_contact.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


def plan_lookup(tmp: Path) -> dict[str, Any]:
    from experiments import memory as MEM
    from experiments.train.config import compose
    from pipelines.gpu_check import plan_step, recipe_args
    from sweeps.recipe import load

    args, _ = recipe_args(load("paper-1.5B"), "H100-80GB", 1, 20, 85.5, disk_free=None)
    cfg = compose([*args, f"paths.cache={tmp / 'fresh-cache'}"])
    key = MEM.measure_key(cfg, 1, "none", "cuda", 16, 3, exact=False)
    if not (MEM.SHIPPED / f"{key}.json").is_file():  # measuring here would take the whole run
        return {"skipped": f"no shipped plan {key}.json (python -m pipelines.gpu_check "
                           "--recipe paper-1.5B --ship-plan makes it)"}
    t = time.time()
    recs, src = plan_step(cfg, 1)
    return {"source": src, "seconds": round(time.time() - t, 2),
            "peaks_gb": {r.phase: round(r.peak_bytes / 1e9, 1) for r in recs}}


def syncs(tmp: Path, cuda: bool) -> dict[str, Any]:
    """Synchronizing calls (CUDA: sync debug warnings; CPU: host reads) per step of a real run."""
    from experiments.train import trainer as TR
    from experiments.train.config import compose

    now = {"step": 0}
    seen: list[tuple[int, str]] = []

    def where() -> str:
        fr = [f for f in traceback.extract_stack()
              if f.filename.startswith(str(ROOT)) and "/dev/" not in f.filename
              and "/.venv/" not in f.filename]
        return f"{Path(fr[-1].filename).name}:{fr[-1].name}:{fr[-1].lineno}" if fr else "?"

    real = TR.Trainer.train_step

    def step(self: Any, fwd: Any, s: int) -> Any:
        now["step"] = s + 1
        return real(self, fwd, s)

    TR.Trainer.train_step = step  # type: ignore[method-assign]
    vocab = 131072 if cuda else 8192  # 2^17: the chunked loss runs (the CPU: too slow)
    cfg = compose(["model=16M", f"model.vocab_size={vocab}", "model.latent_bits=16",
                   "data=random", "train.seq_len=512", "train.batch_size=4",
                   "train.micro_batch_size=2", f"train.tokens={8 * 4 * 512}",
                   "logging.log_every=4", "logging.val_every=0", "logging.ckpt_every=100",
                   "data.val_tokens=2048", "logging.progress=false",
                   f"train.device={'cuda' if cuda else 'cpu'}", f"paths.results={tmp / 'sync'}"])
    if cuda:
        old = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = lambda *a, **k: seen.append((now["step"], where()))
        torch.cuda.set_sync_debug_mode("warn")
        try:
            TR.train(cfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = old
    else:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Reads(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore
                if func is torch.ops.aten._local_scalar_dense.default:
                    seen.append((now["step"], where()))
                return func(*args, **(kwargs or {}))

        with Reads():
            TR.train(cfg)
    TR.Trainer.train_step = real  # type: ignore[method-assign]
    quiet = [s for s in range(1, 9) if s not in (4, 8)]
    by: dict[str, list[str]] = {}
    for s, w in seen:
        by.setdefault(str(s), []).append(w)
    bad = {s: sorted(set(w)) for s, w in by.items() if int(s) in quiet
           and any("_mix_int" not in x for x in w)}
    return {"quiet_steps": quiet, "syncs_on_quiet_steps": bad,
            "counts_by_step": {s: len(w) for s, w in by.items()},
            "where_logging": sorted({w for s, w in seen if s in (4, 8)})[:20],
            "ok": not bad}


def staging(cuda: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from experiments.train.checkpointer import stager

    n = 1_659_096_576 if cuda else 80_000_000  # paper-1.5B's FT (H=16) parameters
    dev = "cuda" if cuda else "cpu"
    per = 64 * 1024 * 1024  # parameters per tensor (256 MB in fp32)
    sd = {"model": {}, "optim": {}}
    for i in range(-(-n // per)):
        k = min(per, n - i * per)
        sd["model"][f"w{i}"] = torch.empty(k, device=dev)
        sd["optim"][f"w{i}"] = {"exp_avg": torch.empty(k, device=dev),
                                "exp_avg_sq": torch.empty(k, device=dev)}
    nbytes = 12 * n

    def timed(fn: Any) -> float:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def default() -> None:
        st = DefaultStager(StagingOptions(False, False, False, False))
        st.stage(sd)
        st.close()

    cached = stager(cuda)
    out = {"bytes": nbytes, "dcp_default_s": timed(default),
           "cached_first_s": timed(lambda: cached.stage(sd)),
           "cached_later_s": timed(lambda: cached.stage(sd))}
    cached.close()
    out.update({k.replace("_s", "_gbps"): nbytes / 1e9 / v for k, v in list(out.items())
                if k.endswith("_s")})
    return out


def ce(cuda: bool) -> dict[str, Any]:
    import contextlib
    import io

    sys.path.insert(0, str(ROOT / "dev" / "gpu"))
    from issue45_kernels import cross_entropy

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        if cuda:
            cross_entropy(True, 8192, 1536, 1 << 17, [512])
        else:
            cross_entropy(False, 1024, 128, 8192, [256])
    return {"lines": buf.getvalue().strip().splitlines()}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    cuda = "--cpu" not in argv and torch.cuda.is_available()
    doc: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "device": torch.cuda.get_device_name() if cuda else "cpu"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        section(out, doc, "plan", lambda: plan_lookup(tmp))
        section(out, doc, "sync", lambda: syncs(tmp, cuda))
        section(out, doc, "staging", lambda: staging(cuda))
        section(out, doc, "ce", lambda: ce(cuda))
    doc["wall_s"] = round(time.time() - T0, 1)
    (out / "second_contact.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"done in {doc['wall_s']} s -> {out / 'second_contact.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
