"""An honest likelihood for the Free Transformer: importance-weighted lower bounds on log p(x).

The Free Transformer is a latent-variable model, p(x) = sum_z p(z) p(x | z), with one code of H
bits per position and the uniform prior p(z_t) = 2^-H. Its training loss (CE with Z from the
encoder) leaks: the encoder reads the tokens being scored. Its prior-Z CE is honest but loose
(Jensen: E_z log p(x|z) <= log E_z p(x|z)). This module gives the standard Monte Carlo lower
bounds on log p(x) (Burda et al. 2016, "Importance Weighted Autoencoders"):

- `method="prior"`: log (1/k) sum_j p(x | z_j), z_j ~ p(z). Unbiased for p(x), so a lower bound
  on log p(x) in expectation; k=1 is minus the prior-Z CE summed over the sequence.
- `method="iwae"`: log (1/k) sum_j p(x | z_j) p(z_j) / q(z_j | x), z_j ~ q(z | x), with the
  encoder as proposal. q is a product of independent Bernoullis per token and bit,
  log q(z) = sum_{t,h} log sigmoid(+-o_th). The encoder is non-causal (it sees all of x); that is
  allowed for a proposal, and the bound stays a bound. It tightens with k and reaches log p(x)
  as k -> infinity (Burda et al., Theorem 1). With a poor encoder it can be looser than the
  prior bound at the same k; a trained encoder approximates the posterior, which is when it wins.
- For the baseline both are the exact log-likelihood (there is no Z).

Scope of x: `tokens` (B, T) -> a bound on log p(tokens[:, 1:] | tokens[:, 0]). The model runs on
tokens[:, :-1] (as in training, where x = tokens[:-1] and y = tokens[1:]), so every code that
enters the model affects some scored token, and a validation row (x, y) of the training corpus is
`torch.cat([x, y[:, -1:]], 1)` without exceeding max_seq_len.

Cost: the blocks below the injection point (and the encoder) run once per row
(`FreeTransformer.forward_lower`); only the upper half (`forward_upper`) runs per draw, on chunks
of (draws x rows) bounded by `chunk_elems` logits.

`measure_run` (the CLI) writes one likelihood file per checkpoint (`validation_likelihood` on the
run's validation rows: `validation_rows`); comparing two such records is dict arithmetic on the
files: analysis/likelihood.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from common import arms
from common.errors import ArgParser, UsageError, cli, positive_int
from common.paths import RunDir
from common.records import RecordError, RunRecord
from experiments.corpus.config import GENERATED_SOURCES
from model.free_transformer import FreeTransformer, sample_codes, uniform_codes
from model.transformer import Transformer

LN2 = math.log(2.0)
METHODS = ("prior", "iwae")
DEFAULT_KS = (1, 8, 64)
POSTERIOR_LABEL = ("leaking: Z from the encoder, which reads the scored tokens; "
                   "not a likelihood, never compare it with the baseline's CE (its sum with "
                   "the KL, the ELBO, is an honest upper bound on the NLL)")
PRIOR_LABEL = ("the prior-Z CE (one uniform code per token): by Jensen an upper bound on the "
               "NLL, loose exactly when the decoder uses Z; a generation-mismatch diagnostic, "
               "not the likelihood endpoint (the ELBO and IWAE bounds are tighter)")


# ------------------------------------------------------------------------ model pieces
def _unwrap(model: torch.nn.Module) -> Transformer:
    m = getattr(model, "module", model)  # DDP
    if not isinstance(m, Transformer):
        raise TypeError(f"expected a model.Transformer, got {type(m).__name__}")
    return m


def _upper_logp(m: FreeTransformer, x_mid: torch.Tensor, codes: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    """x_mid (N, T, D) (forward_lower's hidden), pinned codes (N, T), targets (N, T) -> (N,)
    sum_t log p(target_t | codes), the readout over chunks of tokens (`score_upper`): no
    (N, T, V) logits."""
    return m.score_upper(x_mid, targets, codes).logprob.sum(-1)


def _code_log_q(bit_logits: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """bit logits (..., T, H), codes (..., T) -> (...) log q(codes) = sum_{t,h} log sigmoid(+-o)."""
    H = bit_logits.shape[-1]
    bits = (codes[..., None] >> torch.arange(H, device=codes.device)) & 1
    o = bit_logits.float()
    return torch.where(bits.bool(), F.logsigmoid(o), F.logsigmoid(-o)).sum((-1, -2))


# ------------------------------------------------------------------------ the bound
@torch.no_grad()
def log_likelihood_bound(model: torch.nn.Module, tokens: torch.Tensor, method: str, k: int,
                         generator: torch.Generator | None = None,
                         chunk_elems: int = 1 << 24) -> torch.Tensor:
    """(B, T) LongTensor -> (B,) float32 lower bound, in nats, on
    log p(tokens[:, 1:] | tokens[:, 0]).

    method "prior": log-mean-exp over k prior draws of Z of log p(x | z).
    method "iwae": log (1/k) sum_j p(x | z_j) p(z_j) / q(z_j | x), z_j from the encoder.
    For the baseline both are exact (k draws would all be equal; one pass is run).
    Draws come from `generator` (its device may differ from the model's). At most
    `chunk_elems` logits (draw-rows x positions x vocab) exist at once, and fewer: the readout
    runs over chunks of tokens (model/readout.py), so `chunk_elems` bounds the draw-rows of
    one upper-half pass. float32 (float64 for a float64 model).
    """
    if method not in METHODS:  # anything else would silently run the IWAE branch
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    m = _unwrap(model)
    inp, tgt = tokens[:, :-1].to(m.device), tokens[:, 1:].to(m.device)
    B, T = inp.shape
    if not isinstance(m, FreeTransformer):
        return m.score(inp, tgt).logprob.sum(-1)  # over chunks of tokens: no (B, T, V) logits
    H = m.cfg.latent_bits
    low = m.forward_lower(inp)  # the encoder sees every position, as in training
    x_mid, bit_logits = low.hidden, low.bit_logits
    if method == "prior":
        codes = uniform_codes((k, B, T), H, generator, m.device)
        log_ratio = torch.zeros(k, B, device=m.device)
    else:
        codes = sample_codes(bit_logits.expand(k, B, T, H), generator)
        log_ratio = -T * H * LN2 - _code_log_q(bit_logits, codes)  # log p(z) - log q(z|x)
    rows = max(1, chunk_elems // (T * m.cfg.vocab_size))  # draw-rows per upper-half pass
    flat_codes = codes.reshape(k * B, T)
    parts = []
    for s in range(0, k * B, rows):
        e = min(k * B, s + rows)
        idx = torch.arange(s, e, device=m.device) % B  # draw-row -> row of the batch
        parts.append(_upper_logp(m, x_mid[idx], flat_codes[s:e], tgt[idx]))
    logp = torch.cat(parts)
    log_w = logp.view(k, B) + log_ratio
    return torch.logsumexp(log_w, 0) - math.log(k)


# ------------------------------------------------------------------------ validation bpb
@torch.no_grad()
def validation_likelihood(model: torch.nn.Module, val_x: torch.Tensor, val_y: torch.Tensor,
                          token_bytes: torch.Tensor, ks: Sequence[int] = DEFAULT_KS,
                          batch_size: int = 8, seed: int = 12345,
                          chunk_elems: int = 1 << 24) -> dict[str, Any]:
    """Validation bits per byte from the bounds, on the corpus' fixed validation rows.

    val_x, val_y (N, T): inputs and next-token targets (experiments.train.data.Corpus); token_bytes
    (V,): UTF-8 bytes per token id. Every figure is an upper bound on the true NLL (a lower bound
    on the likelihood), over all N x T targets; bpb = total nats / (ln 2 x total bytes).

    Baseline: {"arm": "baseline", "nll_nats_per_token", "bpb"} (exact).
    Free Transformer: per k in ks, {"nll_nats_per_token", "bpb", "se_nats_per_token"} from IWAE
    (se: standard error over the N rows of the per-token NLL, the draws' and the rows' noise);
    "spread_bpb": bpb(min k) - bpb(max k), how far the bound moved (large = not converged, the
    true bpb may lie well below bpb(max k)); "prior_k1" (the prior-Z CE, the suite's val_ce);
    "posterior" (CE with encoder Z and its KL, labelled leaking, for `kl_spend_recovered`).
    """
    m = _unwrap(model)
    was = m.training
    m.eval()
    try:
        if val_x.shape != val_y.shape or val_x.dim() != 2:
            raise ValueError(f"val_x and val_y must both be (N, T), got {tuple(val_x.shape)} "
                             f"and {tuple(val_y.shape)}")
        if not bool((val_x[:, 1:] == val_y[:, :-1]).all()):
            raise ValueError("val_y must be val_x shifted by one token (next-token targets)")
        seqs = torch.cat([val_x, val_y[:, -1:]], 1)
        N, T = val_x.shape
        n_tok = N * T
        n_bytes = int(token_bytes[val_y].sum())
        free = isinstance(m, FreeTransformer)
        from scipy.stats import t as t_dist
        out: dict[str, Any] = {
            "arm": arms.of_model(free).name,
            "n_sequences": N, "n_tokens": n_tok, "n_bytes": n_bytes, "seed": seed,
            "provenance": "experiments/eval/likelihood.py validation_likelihood on the "
                          "corpus' fixed validation rows (val_x, val_y)"}

        def per_row(method: str, k: int, gseed: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(gseed)
            parts = [log_likelihood_bound(m, seqs[s:s + batch_size], method, k, g, chunk_elems)
                     for s in range(0, N, batch_size)]
            return -torch.cat(parts).double().cpu()  # (N,) NLL nats per row

        def summary(nll: torch.Tensor) -> dict[str, float | None]:
            per_tok = nll / T
            se = float(per_tok.std() / math.sqrt(N)) if N > 1 else None
            m = float(nll.sum()) / n_tok
            half = None if se is None else float(t_dist.ppf(0.975, N - 1)) * se  # rows: units
            return {"nll_nats_per_token": m,
                    "bpb": float(nll.sum()) / (LN2 * n_bytes) if n_bytes else None,
                    "se_nats_per_token": se, "lo": None if half is None else m - half,
                    "hi": None if half is None else m + half}

        if not free:
            out.update(summary(per_row("prior", 1, seed)))
            out["exact"] = True
            return out
        ks = sorted(set(int(k) for k in ks))  # integers >= 1: parse_ks checks the CLI's
        out["exact"] = False
        out["iwae"] = {str(k): summary(per_row("iwae", k, seed + k)) for k in ks}
        lo, hi = out["iwae"][str(ks[0])]["bpb"], out["iwae"][str(ks[-1])]["bpb"]
        out["spread_bpb"] = lo - hi if lo is not None and hi is not None else None
        out["spread_ks"] = [ks[0], ks[-1]]
        out["prior_k1"] = summary(per_row("prior", 1, seed))
        out["prior_k1"]["what"] = PRIOR_LABEL
        # posterior-Z CE and KL as training reports them: their sum is minus the ELBO (one
        # encoder draw), an upper bound on the NLL with its interval over rows
        g = torch.Generator().manual_seed(seed)
        ce_rows, kl_rows = [], []
        for s in range(0, N, batch_size):
            x, y = val_x[s:s + batch_size].to(m.device), val_y[s:s + batch_size].to(m.device)
            q = m(x, targets=y, z="posterior", generator=g, scores=True)  # chunked readout
            ce_rows.append(-q.scores.logprob.double().sum(-1).cpu())
            kl_rows.append(q.kl_tokens.double().sum(-1).cpu())
        ce_r, kl_r = torch.cat(ce_rows), torch.cat(kl_rows)
        elbo = summary(ce_r + kl_r)
        out["posterior"] = {"ce_nats_per_token": float(ce_r.sum()) / n_tok,
                            "kl_nats_per_token": float(kl_r.sum()) / n_tok,
                            "elbo_nats_per_token": elbo["nll_nats_per_token"],
                            "elbo_lo": elbo["lo"], "elbo_hi": elbo["hi"],
                            "elbo_se_nats_per_token": elbo["se_nats_per_token"],
                            "label": POSTERIOR_LABEL}
        return out
    finally:
        m.train(was)


# ------------------------------------------------------------------------ CLI
def parse_ks(text: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; UsageError naming the bad value."""
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--k: {text!r} is not a comma-separated list of integers") from None
    if not ks or ks[0] < 1:
        raise UsageError(f"--k: {text!r} must list integers >= 1, e.g. 1,8,64")
    return ks


def _corpus_info(rec: RunRecord) -> dict[str, Any]:
    """The run record's `corpus` block (what the trainer's corpus was), {} when absent."""
    info = rec.extra.get("corpus")
    return dict(info) if isinstance(info, dict) else {}


def run_corpus(run: RunDir, rec: RunRecord | None = None) -> Any:
    """The run's corpus rebuilt from its run record (same data section -> same val rows);
    `rec`: the record, when the caller read it already."""
    from common.paths import cache_dir
    from experiments.corpus.config import DataConfig, data_config
    from experiments.train.data import build_corpus

    rec = rec if rec is not None else run.record()
    dcfg = data_config({k: v for k, v in rec.data.items() if k in DataConfig.__dataclass_fields__},
                       str(run.record_path))
    return build_corpus(dcfg, vocab_size=int(rec.model["vocab_size"]),
                        seq_len=int(rec.train.get("seq_len", 256)),
                        seed=int(rec.train.get("seed", 0)), cache_dir=cache_dir(run.root))


def _corpus_mismatch(rec: RunRecord, man: dict[str, Any], d: Path,
                     n_val: int) -> str | None:
    """Why the corpus in `d` (manifest `man`, `n_val` validation rows) is not the one the run
    of `rec` trained on, else None: the same manifest file, or else the same tokenizer, source
    checksums and validation rows as the run recorded (a value the run did not record is not
    compared)."""
    from common.io import sha256_file
    from experiments.corpus.build import MANIFEST

    info = _corpus_info(rec)
    want = info.get("manifest_sha256")
    if want and (d / MANIFEST).is_file() and sha256_file(d / MANIFEST) == want:
        return None
    sums = rec.provenance.get("data_checksums")
    for what, ran, here in (
            ("tokenizer sha256", info.get("tokenizer_sha256"),
             (man.get("tokenizer") or {}).get("sha256")),
            ("source checksums", sums, (man.get("source") or {}).get("checksums")),
            ("validation rows", info.get("val_sequences"), n_val)):
        if ran is not None and ran != here:
            return f"its {what} differ from the run's"
    return None


def validation_rows(run: RunDir, max_rows: int | None = None, rec: RunRecord | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The run's fixed validation rows (the first `max_rows`, None: all) as the trainer
    validated on them, the UTF-8 bytes of each token id, and how they were read (the
    likelihood file's `rows_read`):

    - "shards": the run's corpus is a built one still on disk (data.corpus, or the cache
      directory the run record's `corpus.dir` names) and is the one it trained on
      (`_corpus_mismatch`): only the scored rows are read from the memory-mapped val shards
      (`experiments.train.data.open_val_rows`), nothing tokenized, memory independent of the
      corpus' size; bytes per token from its tokenizer file.
    - "rebuilt": otherwise (synthetic data; a cache since deleted): `run_corpus`, the run's
      data section built again as training builds it (a cached corpus is only opened), then
      checked the same way. UsageError when the corpus is not the run's. `rec`: the run
      record, when the caller read it already."""
    from tokenizers import Tokenizer

    from experiments.corpus.build import MANIFEST, TOKENIZER
    from experiments.corpus.config import DataConfig
    from experiments.corpus.tokenizer import BPETokenizer
    from experiments.train.data import open_val_rows

    rec = rec if rec is not None else run.record()
    data, info = rec.data, _corpus_info(rec)
    seq_len = int(rec.train.get("seq_len", 256))
    named = data.get("corpus")
    where = named or info.get("dir")
    d = Path(where).expanduser() if where else None
    if data.get("source") not in GENERATED_SOURCES and d is not None and (d / MANIFEST).is_file():
        vx, vy, man = open_val_rows(d, int(data.get("val_tokens", DataConfig.val_tokens)),
                                    seq_len, max_rows)
        why = _corpus_mismatch(rec, man, d, man["val_sequences"])
        if why is None:
            tok = BPETokenizer(Tokenizer.from_file(str(d / TOKENIZER)))
            tb = torch.tensor(tok.token_bytes(), dtype=torch.long)
            return vx, vy, tb, {"path": "shards", "corpus_dir": str(d),
                                "rows": int(vx.shape[0]),
                                "val_sequences": man["val_sequences"]}
        if named:  # a named corpus is only ever opened: rebuilding reads the same directory
            raise UsageError(f"{d}: not the corpus run {run.run_id} trained on ({why})")
    corpus = run_corpus(run, rec)
    vx, vy = corpus.val_x, corpus.val_y
    n_val = int(vx.shape[0])
    built = corpus.info.get("dir")
    if built:
        from experiments.train.data import read_manifest

        why = _corpus_mismatch(rec, read_manifest(built) or {}, Path(built), n_val)
    else:  # synthetic: generated from fixed seeds; its row count is what the run recorded
        want = info.get("val_sequences")
        why = None if want is None or want == n_val else "its validation rows differ"
    if why is not None:
        raise UsageError(f"the corpus rebuilt from {run.record_path} is not the one "
                              f"run {run.run_id} trained on ({why})")
    if max_rows is not None:
        vx, vy = vx[:max_rows], vy[:max_rows]
    return vx, vy, corpus.token_bytes, {"path": "rebuilt", "corpus_dir": built,
                                        "rows": int(vx.shape[0]), "val_sequences": n_val}


def open_run(given: RunDir | str | Path) -> tuple[RunDir, Path, RunRecord]:
    """The run a path names (`RunDir.at`), its checkpoint (final.pt, or the .pt it was given
    as) and its run record; UsageError naming what is missing (the path, a checkpoint not
    trained yet, a directory that is no run)."""
    path = (given.target or given.path) if isinstance(given, RunDir) else Path(given)
    if not path.exists():
        raise UsageError(f"{path}: no such run directory or checkpoint")
    run = given if isinstance(given, RunDir) else RunDir.at(given)
    ck = run.final_or_target()
    if not ck.is_file():
        raise UsageError(f"no checkpoint at {ck} (train the run first, or pass a .pt)")
    if not run.has_record:
        raise UsageError(f"no {run.record_path.name} in {run.path}: not a run directory")
    try:
        return run, ck, run.record()
    except RecordError as e:
        raise UsageError(str(e)) from None


def measure_run(run: RunDir | str | Path, ks: Sequence[int] = DEFAULT_KS,
                max_rows: int | None = None, seed: int = 12345, batch_size: int = 8,
                device: str | None = None, out_dir: Path | None = None,
                reuse: bool = False) -> Path:
    """Validation likelihood of a finished run's final checkpoint (or the .pt given) -> the
    file written, under `out_dir` (default: the run's eval directory); with `reuse`, a file of
    the same spec and step already there is returned without measuring.

    The model's weights only (never the optimizer state) load straight onto `device` (None:
    cuda when there is one, else cpu) and the bound runs there in fp32 (a bound's precision
    is not traded for speed); only the scored validation rows move to the device. The draws
    come from CPU generators, so the numbers do not depend on the device's RNG."""
    import json

    from common.io import atomic_write_text
    from common.records import LikelihoodFile, spec_id
    from experiments.eval.run import resolve_device
    from model.checkpoint import CheckpointError, load_weights

    run, ck, cfg = open_run(run)

    def load() -> Any:
        try:
            return load_weights(ck, resolve_device(device))
        except CheckpointError as e:
            raise UsageError(str(e)) from None

    loaded = None
    if ck.stem.startswith("eval_step_"):  # a kept checkpoint names its step: no load to reuse
        step: int | None = int(ck.stem.removeprefix("eval_step_"))
    else:
        loaded = load()
        step = loaded.extra.get("step")
        step = int(step) if isinstance(step, int) else None
    spec = LikelihoodFile.spec_of(list(ks), max_rows, seed)  # its hash names the file
    name = LikelihoodFile.file_name(spec, step)
    out = Path(out_dir) / name if out_dir is not None else run.eval_file(name)
    if reuse and out.is_file():
        return out
    loaded = loaded or load()
    vx, vy, token_bytes, rows_read = validation_rows(run, max_rows, cfg)
    rec = validation_likelihood(loaded.model, vx, vy, token_bytes, ks=ks,
                                batch_size=batch_size, seed=seed)
    doc = LikelihoodFile.from_json({
        **rec, "rows_read": rows_read,
        "suite": "likelihood", "spec": spec, "spec_id": spec_id(spec),
        "checkpoint_step": step, "run_id": run.run_id, "checkpoint": str(ck),
        "unit": "nats per token (nll), bits per byte (bpb); bounds: the NLL is an upper "
                "bound on the true NLL for the Free Transformer, exact for the baseline"})
    out.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(out, json.dumps(doc.to_json(), indent=1, sort_keys=True) + "\n")


def _main(argv: list[str] | None) -> int:
    ap = ArgParser(
        prog="python -m experiments.eval.likelihood",
        description="Validation bits per byte with honest bounds (FT: IWAE at each k; baseline: "
                    "exact) -> <run>/eval/likelihood.<spec_id>.step<N>.json")
    ap.add_argument("run", help="run dir (its final checkpoint) or a checkpoint .pt")
    ap.add_argument("--k", default=",".join(map(str, DEFAULT_KS)),
                    help="IWAE sample counts, e.g. 1,8,64")
    ap.add_argument("--max-rows", type=positive_int, default=None,
                    help="use only the first N validation rows (cheap; recorded in the spec)")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--batch-size", type=positive_int, default=8)
    ap.add_argument("--device", default=None,
                    help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    ap.add_argument("--out", default=None, help="directory for the file (default <run>/eval)")
    a = ap.parse_args(argv)
    path = measure_run(a.run, parse_ks(a.k), a.max_rows, a.seed, a.batch_size, a.device,
                       Path(a.out) if a.out else None)
    print(f"likelihood: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("likelihood", lambda: _main(argv))


if __name__ == "__main__":
    raise SystemExit(main())
