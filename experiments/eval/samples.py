"""Does generation with Z from the prior break? The sample test, judged from samples only, by
the rule docs/alive/kappa/PREREGISTERED.md fixed before its runs ("Does prior generation break?
Only from samples"): that document defines the generation (`generate`, SPEC), the scoring by the
same seed's baseline (`score`), the reference from another seed's baseline's kept checkpoints
(`reference`), the statistic D = S(FT) - S_ref with its cluster bootstrap over prompts
(`cluster_boot`) and Python's tokenize check (`tokenize_passes`). The per-kappa analysis over
seeds is dev/kappa.py's.

    python -m experiments.eval.samples <FT run> --scorer <baseline run> --ladder <baseline run>
        [--out DIR] [--device cpu|cuda]

writes `<out>/sampletest.<spec_id>.<FT run-id>.json` (default out: <FT run>/eval/samples), and
beside it every generation (`gen.<run-id>.step<N>.<spec_id>.pt`), score
(`score.<run-id>.step<N>.by.<scorer run-id>.<spec_id>.json`) and ladder likelihood file it
needs; each is reused when it exists (same spec, same checkpoint), so a re-run redoes nothing.
Bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import tokenize
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import arms
from common.errors import ArgParser, UsageError, cli
from common.paths import RunDir
from common.records import spec_id

SCHEMA = "ftbench-sampletest-v1"
SPEC: dict[str, Any] = {"suite": "samples", "prompt_len": 64, "per_prompt": 4,
                        "new_tokens": 192, "temperature": 1.0, "top_p": 1.0, "seed": 12345,
                        "batch_prompts": 32, "n_boot": 2000, "z": "prior", "generator": "cpu"}
"""The preregistered generation and bootstrap (docs/alive/kappa/PREREGISTERED.md); its hash names
every file, so a file of another spec is never reused."""
EOS = "<|endoftext|>"


# ------------------------------------------------------------------------ generation, scoring
@torch.no_grad()
def generate(model: torch.nn.Module, prompts: torch.Tensor, spec: dict[str, Any] = SPEC
             ) -> torch.Tensor:
    """(P, Lp) prompts -> (P x per_prompt, Lp + new_tokens) prompt + sample, a prompt's samples
    as consecutive rows. One CPU generator for the whole run, batches of `batch_prompts`
    prompts in row order: the same random stream for every generator of the same shape."""
    m = getattr(model, "module", model).eval()
    g = torch.Generator().manual_seed(int(spec["seed"]))
    n, bp = int(spec["per_prompt"]), int(spec["batch_prompts"])
    out = []
    for s in range(0, len(prompts), bp):
        rows = prompts[s:s + bp].repeat_interleave(n, 0).to(m.device)
        gen = m.generate(rows, int(spec["new_tokens"]), temperature=float(spec["temperature"]),
                         top_p=float(spec["top_p"]), z="prior", generator=g)
        new = torch.tensor(gen.tokens, dtype=torch.long)  # no stop, no eos: every row is full
        out.append(torch.cat([rows.cpu(), new], 1))
    return torch.cat(out)


@torch.no_grad()
def score(scorer: torch.nn.Module, seqs: torch.Tensor, prompt_len: int,
          batch_size: int = 64) -> np.ndarray:
    """(N, L) prompt + continuation -> (N,) the plain scorer's mean NLL over the continuation's
    tokens (targets prompt_len .. L-1), nats per token, one forward pass per batch."""
    m = getattr(scorer, "module", scorer).eval()
    if arms.of_model(int(getattr(m.cfg, "latent_bits", 0) or 0)).latent:
        raise UsageError("the scorer must be a plain decoder (a baseline): a latent scorer's "
                         "scores would depend on its own Z")
    out = []
    for s in range(0, len(seqs), batch_size):
        x = seqs[s:s + batch_size].to(m.device)
        lp = m.score(x[:, :-1], x[:, 1:]).logprob[:, prompt_len - 1:]
        out.append((-lp.double().mean(1)).cpu())
    return torch.cat(out).numpy()


def tokenize_passes(text: str) -> bool:
    """True when Python's tokenizer reads `text` with no ERRORTOKEN and nothing raised but an
    "EOF in multi-line" TokenError (what cutting sound code at a fixed length does)."""
    try:
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            if t.type == tokenize.ERRORTOKEN:
                return False
    except tokenize.TokenError as e:
        return str(e.args[0] if e.args else e).startswith("EOF in multi-line")
    except (SyntaxError, ValueError):  # IndentationError is a SyntaxError
        return False
    return True


def sample_texts(tok: Any, seqs: torch.Tensor, prompt_len: int) -> list[str]:
    """Per row: the text after the prompt's last EOS (if any) and before the sample's first."""
    eos = getattr(tok, "eos_id", None)
    out = []
    for row in seqs.tolist():
        p, s = row[:prompt_len], row[prompt_len:]
        start = max((i + 1 for i, t in enumerate(p) if t == eos), default=0)
        end = next((i for i, t in enumerate(s) if t == eos), len(s))
        out.append(tok.decode(p[start:] + s[:end]))
    return out


# ------------------------------------------------------------------------ the statistic
def reference(c: Sequence[float], s: Sequence[float], at: float) -> tuple[float, bool]:
    """numpy's interp of the ladder's points (c_j, S_j), sorted by c, at `at`; and whether it
    was clipped at an end (the ladder does not reach `at`)."""
    c, s = np.asarray(c, dtype=float), np.asarray(s, dtype=float)
    o = np.argsort(c)
    return float(np.interp(at, c[o], s[o])), bool(at < c.min() or at > c.max())


def cluster_boot(ft: np.ndarray, ladder: list[np.ndarray], c: Sequence[float], at: float,
                 per_prompt: int, n_boot: int, seed: int) -> dict[str, Any]:
    """D = mean(ft) - S_ref and its 95% percentile bootstrap over prompts: the same resampled
    prompts (each with its `per_prompt` samples) for the FT and every ladder point."""
    P = len(ft) // per_prompt
    f = ft.reshape(P, per_prompt).mean(1)
    lad = np.stack([x.reshape(P, per_prompt).mean(1) for x in ladder])  # (J, P)
    ref, clipped = reference(c, lad.mean(1), at)
    idx = np.random.default_rng(seed).integers(0, P, (n_boot, P))
    o = np.argsort(np.asarray(c, dtype=float))
    cs = np.asarray(c, dtype=float)[o]
    lb = lad[o][:, idx].mean(2)  # (J, n_boot)
    d = f[idx].mean(1) - np.array([np.interp(at, cs, lb[:, b]) for b in range(n_boot)])
    lo, hi = np.quantile(d, [0.025, 0.975])
    return {"D": float(f.mean() - ref), "lo": float(lo), "hi": float(hi), "S_ref": ref,
            "clipped": clipped, "n_prompts": P, "n_boot": n_boot}


def boot_diff(a: np.ndarray, b: np.ndarray, per_prompt: int, n_boot: int,
              seed: int) -> dict[str, float]:
    """mean(a) - mean(b) over samples of the same prompts, with the cluster bootstrap."""
    P = len(a) // per_prompt
    d = (a - b).reshape(P, per_prompt).mean(1)
    idx = np.random.default_rng(seed).integers(0, P, (n_boot, P))
    lo, hi = np.quantile(d[idx].mean(1), [0.025, 0.975])
    return {"mean": float(d.mean()), "lo": float(lo), "hi": float(hi)}


# ------------------------------------------------------------------------ files
def _write_json(path: Path, doc: dict[str, Any]) -> Path:
    from common.io import atomic_write_json

    return atomic_write_json(path, doc, sort_keys=True, allow_nan=False)  # missing is no NaN


def _provenance() -> dict[str, Any]:
    from common.provenance import git_state, versions

    commit, dirty = git_state()
    return {"git_commit": commit, "git_dirty": dirty, "host": socket.gethostname(),
            "argv": sys.argv, "python": sys.version.split()[0],
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": versions("torch"), "threads": torch.get_num_threads()}


class Workspace:
    """Where a sample test's files live (one flat directory), and the cached steps."""

    def __init__(self, out: Path, spec: dict[str, Any] = SPEC, device: str | None = None
                 ) -> None:
        from experiments.eval.run import resolve_device

        self.out, self.spec, self.sid = Path(out), spec, spec_id(spec)
        self.device = resolve_device(device)
        self._prompts: dict[str, torch.Tensor] = {}
        self._models: dict[str, Any] = {}  # the scorer, loaded once for all it scores

    def load(self, ck: Path) -> Any:
        """A checkpoint's weights on the workspace's device, loaded once."""
        from model.checkpoint import load_weights

        if str(ck) not in self._models:
            self._models[str(ck)] = load_weights(ck, self.device)
        return self._models[str(ck)]

    def rows(self, run: RunDir) -> torch.Tensor:
        """The run's validation rows as token sequences (N, T): prompt + real continuation."""
        from experiments.eval.likelihood import validation_rows

        key = str(run.path)
        if key not in self._prompts:
            vx, _, _, _ = validation_rows(run)
            self._prompts[key] = vx
        return self._prompts[key]

    def generation(self, ckpt: Path) -> Path:
        """The generation file of one checkpoint (made once)."""
        from common.io import atomic_write
        from experiments.eval.likelihood import open_run
        from experiments.eval.run import ckpt_identity
        from model.checkpoint import load_weights

        run, ck, _ = open_run(ckpt)
        ident = ckpt_identity(ck)
        step = _step(ck)
        path = self.out / f"gen.{run.run_id}.step{step}.{self.sid}.pt"
        if path.is_file() and torch.load(path, weights_only=True).get("identity") == ident:
            return path
        loaded = load_weights(ck, self.device)
        prompts = self.rows(run)[:, :int(self.spec["prompt_len"])]
        toks = generate(loaded.model, prompts, self.spec)
        doc = {"tokens": toks.to(torch.int32), "identity": ident, "run_id": run.run_id,
               "step": step, "checkpoint": str(ck), "spec": self.spec, "spec_id": self.sid,
               "arm": arms.of_model(loaded.config.latent_bits).name,
               "provenance": json.dumps({**_provenance(), "device": self.device})}
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: torch.save(doc, f))
        return path

    def scores(self, gen: Path | None, scorer_ckpt: Path, data_of: RunDir | None = None
               ) -> dict[str, Any]:
        """The score file of a generation (or, `gen` None, of `data_of`'s real continuations)
        under one scorer checkpoint (made once): per-sample NLL and tokenize verdicts."""
        from experiments.corpus.tokenizer import tokenizer_from_ref
        from experiments.eval.likelihood import open_run
        from experiments.eval.run import ckpt_identity

        srun, sck, _ = open_run(scorer_ckpt)
        if gen is not None:
            g = torch.load(gen, weights_only=True)
            seqs, what, source = g["tokens"].long(), f"{g['run_id']}.step{g['step']}", \
                g["identity"]
        else:
            assert data_of is not None
            seqs, what, source = self.rows(data_of), f"data.{data_of.run_id}", None
        inputs = {"source": source, "scorer": ckpt_identity(sck)}
        path = self.out / f"score.{what}.by.{srun.run_id}.step{_step(sck)}.{self.sid}.json"
        if path.is_file():  # reused only for the same generation under the same checkpoint
            old = json.loads(path.read_text(encoding="utf-8"))
            if old.get("inputs") == inputs:
                return old
        loaded = self.load(sck)
        lp = int(self.spec["prompt_len"])
        nll = score(loaded.model, seqs, lp)
        tok = tokenizer_from_ref(loaded.tokenizer)
        passes = [tokenize_passes(t) for t in sample_texts(tok, seqs, lp)]
        doc = {"schema": SCHEMA, "what": what, "inputs": inputs, "scorer": str(sck),
               "scorer_run_id": srun.run_id,
               "spec": self.spec, "spec_id": self.sid, "nll": nll.tolist(),
               "S": float(nll.mean()), "tokenize_pass": passes,
               "tokenize_pass_share": float(np.mean(passes)), "n": len(nll),
               "unit": "nats per generated token", "provenance": _provenance()}
        self.out.mkdir(parents=True, exist_ok=True)
        _write_json(path, doc)
        return doc


def _step(ck: Path) -> int | None:
    """A checkpoint's step: from eval_step_<N>.pt's name, else from its contents."""
    if ck.stem.startswith("eval_step_"):
        return int(ck.stem.removeprefix("eval_step_"))
    from model.checkpoint import load_weights

    s = load_weights(ck).extra.get("step")
    return int(s) if isinstance(s, int) else None


def kept(run: RunDir) -> list[Path]:
    """A run's kept checkpoints (eval_step_<N>.pt), by step."""
    return [p for _, p in run.eval_checkpoints()]


def ladder_nll(ws: Workspace, ck: Path) -> float:
    """The exact validation NLL (all rows) of a ladder checkpoint, from its likelihood file
    (made once, under the workspace)."""
    from experiments.eval.likelihood import measure_run

    run = RunDir.at(ck)
    path = measure_run(ck, ks=[1], out_dir=ws.out / f"lik.{run.run_id}", reuse=True,
                       device=ws.device)
    return float(json.loads(path.read_text(encoding="utf-8"))["nll_nats_per_token"])


def sample_test(ft: Path, scorer: Path, ladder: Path, out: Path | None = None,
                device: str | None = None, spec: dict[str, Any] = SPEC) -> tuple[Path, bool]:
    """The sample test of one FT run -> (its result file, reused)."""
    from experiments.eval.likelihood import open_run

    frun, fck, frec = open_run(ft)
    if not arms.of_model(frec.latent_bits).latent:
        raise UsageError(f"{frun.run_id} is a baseline: the sample test judges a Free "
                         "Transformer's prior generation")
    srun, sck, srec = open_run(scorer)
    lrun, _, lrec = open_run(ladder)
    for r, rec, what in ((srun, srec, "--scorer"), (lrun, lrec, "--ladder")):
        if arms.of_model(rec.latent_bits).latent:
            raise UsageError(f"{what} {r.run_id}: a baseline run is needed (a plain decoder)")
    if not kept(lrun):
        raise UsageError(f"--ladder {lrun.run_id}: no kept checkpoints (eval_step_<N>.pt)")
    from experiments.eval.run import ckpt_identity

    ws = Workspace(Path(out) if out else frun.eval_dir / "samples", spec, device)
    inputs = {"ft": ckpt_identity(fck), "scorer": ckpt_identity(sck),
              "ladder": [ckpt_identity(ck) for ck in kept(lrun)]}
    path = ws.out / f"sampletest.{ws.sid}.{frun.run_id}.json"
    if path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("inputs") == inputs:
        return path, True
    for r, what in ((srun, "--scorer"), (lrun, "--ladder")):  # the bootstrap pairs by prompt
        if not torch.equal(ws.rows(r), ws.rows(frun)):
            raise UsageError(f"{what} {r.run_id}: its validation rows differ from "
                             f"{frun.run_id}'s, so its samples would not share the FT's prompts")
    vals = [r for r in frun.metrics_json() if r.get("kind") == "val" and "val_elbo" in r]
    if not vals or not isinstance(vals[-1]["val_elbo"], (int, float)):
        raise UsageError(f"{frun.path}: no validation record with val_elbo (not finished?)")
    elbo = float(vals[-1]["val_elbo"])
    own = ws.scores(ws.generation(kept(srun)[-1] if kept(srun) else sck), sck)
    ftg = ws.scores(ws.generation(fck), sck)
    data = ws.scores(None, sck, data_of=frun)
    lad = [(ck, ladder_nll(ws, ck), ws.scores(ws.generation(ck), sck)) for ck in kept(lrun)]
    c = [x[1] for x in lad]
    n, nb, seed = int(spec["per_prompt"]), int(spec["n_boot"]), int(spec["seed"])
    nll = lambda d: np.asarray(d["nll"], dtype=float)  # noqa: E731
    passed = lambda d: np.asarray(d["tokenize_pass"], dtype=float)  # noqa: E731
    D = cluster_boot(nll(ftg), [nll(x[2]) for x in lad], c, elbo, n, nb, seed)
    tk = cluster_boot(passed(ftg), [passed(x[2]) for x in lad], c, elbo, n, nb, seed)
    doc = {
        "schema": SCHEMA, "suite": "samples", "spec": spec, "spec_id": ws.sid, "inputs": inputs,
        "run_id": frun.run_id, "checkpoint": str(fck), "kappa_bits": frec.model.get("kappa_bits"),
        "seed": frec.train.get("seed"), "scorer": str(sck), "scorer_run_id": srun.run_id,
        "ladder_run_id": lrun.run_id, "ft_val_elbo": elbo,
        "S": {"ft": ftg["S"], "scorer_own": own["S"], "data": data["S"], "ref": D["S_ref"]},
        "D": D, "ladder": [{"checkpoint": str(ck), "nll_nats_per_token": cj, "S": d["S"],
                            "tokenize_pass_share": d["tokenize_pass_share"]}
                           for ck, cj, d in lad],
        "self_scored_gap": boot_diff(nll(ftg), nll(own), n, nb, seed),
        "seed_to_seed_gap": boot_diff(nll(lad[-1][2]), nll(own), n, nb, seed),
        "tokenize": {"ft": ftg["tokenize_pass_share"], "scorer_own": own["tokenize_pass_share"],
                     "data": data["tokenize_pass_share"], "ref": tk["S_ref"],
                     "ft_minus_ref": {k: tk[k] for k in ("D", "lo", "hi", "clipped")}},
        "reading": "D = S(FT) - S_ref, nats per generated token under the scorer: above 0, the "
                   "FT's prior samples score worse than those of a plain decoder as bad in "
                   "likelihood as the FT's bound (the per-kappa verdict: paired t over seeds, "
                   "one-sided, Holm over the kappas: dev/kappa.py)",
        "provenance": {**_provenance(), "device": ws.device}}
    return _write_json(path, doc), False


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m experiments.eval.samples",
                   description="the sample test: does generation with Z from the prior break? "
                               "(docs/alive/kappa/PREREGISTERED.md)")
    ap.add_argument("ft", help="the Free Transformer's run dir (its final checkpoint) or .pt")
    ap.add_argument("--scorer", required=True, help="the same seed's baseline run (scores)")
    ap.add_argument("--ladder", required=True,
                    help="another seed's baseline run: its kept checkpoints are the reference")
    ap.add_argument("--out", default=None, help="directory (default <FT run>/eval/samples)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    a = ap.parse_args(argv)  # each path is checked by open_run before anything is written
    path, reused = sample_test(Path(a.ft), Path(a.scorer), Path(a.ladder),
                               Path(a.out) if a.out else None, a.device)
    d = json.loads(path.read_text(encoding="utf-8"))["D"]
    print(f"samples: {'reused ' if reused else ''}{path}: D = {d['D']:+.4f} "
          f"[{d['lo']:+.4f}, {d['hi']:+.4f}] nats/token{' (clipped)' if d['clipped'] else ''}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli("samples", lambda: _main(argv))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
