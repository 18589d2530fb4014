"""`make synthetic`: the paper's synthetic experiment (§4.1, Figure 4), measured.

Trains a baseline and Free Transformers at several free-bits thresholds kappa (default 1/64,
1/8, 1 and 8 bits) on the synthetic task (`experiments/train/synthetic_data.py`) with the LM
runs' training loop (`experiments.train`, `data=synthetic`), then for every trained model (and
every checkpoint it kept along training) scores held-out sequences teacher-forced (CE with Z
from the prior, CE with Z from the encoder, which leaks, and KL per token) and generates, per
random prompt "<letter>>", one group where every row draws its own uniform Z and groups whose
rows share one pinned uniform code sequence (prompt included), so that within a shared group
rows differ only by the token sampling. It writes `<results>/synthetic/<name>/samples.jsonl`
(docs/RESULTS.md); `analysis/synthetic.py` turns it into tables and figures (docs/SYNTHETIC.md).
The settings (`--setting cpu|gpu|smoke`) are `PRESETS`; extra hydra overrides go last, e.g.
`python -m experiments.synthetic optim.lr=1e-3`. Bad input is one line and exit 2, found
before any training and before any file is written (`check`).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from common import arms
from common.errors import ArgParser, UsageError, cli, positive_int
from common.gpus import no_silent_cpu
from common.io import atomic_write_text, unwritable
from common.kappa import kappa_label
from common.kappa import parse_kappas as parse_kappa_list
from common.paths import RunDir, results_root, runs_dir
from common.provenance import loadavg
from experiments.eval.probe import code_marginal_kl
from experiments.train.synthetic_data import (
    BODY_LEN,
    LETTERS,
    SEQ_LEN,
    decode,
    encode,
    eval_batch,
    prompt_for,
)
from model import Transformer

DEFAULT_KAPPAS = (1 / 64, 1 / 8, 1.0, 8.0)

# The training run per setting, as hydra overrides of experiments.train; `data=synthetic` and the
# arm's latent bits / kappa are added. Budgets are in tokens (steps x batch x 65 targets); the
# optimizer is the same for every arm.
TOKENS_PER_SEQ = SEQ_LEN - 1


def _lr_text(lr: float) -> str:
    """3e-3, not 0.003: the override reads as the paper-style value it was written as."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


@dataclass(frozen=True)
class SyntheticPreset:
    """One `--setting`: the model shape and training budget of every arm."""

    dim: int  # model.* of the 1M preset with these sizes, and train.batch_size
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    batch_size: int
    steps: int
    """Optimizer steps per arm; train.tokens = steps x batch_size x TOKENS_PER_SEQ."""
    val_every: int
    """logging.val_every (0: no periodic validation)."""
    ckpt_every: int
    """logging.ckpt_every."""
    lr: float | None = None
    """optim.lr; None keeps experiments.train's default."""
    val_tokens: int | None = None
    """data.val_tokens; None keeps the synthetic data config's default."""
    points: int = 0
    """logging.keep_eval_checkpoints: checkpoints kept evenly along training, each measured as
    the final model is (the agreement over training); 0 = the final model only."""
    high_latent_bits: int | None = None
    """H of every arm whose kappa is >= the run's H (`--latent-bits`): the KL to the uniform
    prior is at most H bits per token, so with kappa >= H the free-bits penalty
    max(0, KL - kappa) is identically zero and the arm trains with no KL penalty at all.
    None: every arm at the run's H (the committed CPU runs' layout; H = 16 costs about five
    times the H = 8 step on a CPU core: docs/SYNTHETIC.md)."""

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * TOKENS_PER_SEQ

    def overrides(self) -> list[str]:
        """The hydra overrides for experiments.train, in a fixed order."""
        return ["model=1M", f"model.dim={self.dim}", f"model.n_layers={self.n_layers}",
                f"model.n_heads={self.n_heads}", f"model.n_kv_heads={self.n_kv_heads}",
                f"model.ffn_dim={self.ffn_dim}", f"train.batch_size={self.batch_size}",
                f"train.tokens={self.tokens}",
                *([f"optim.lr={_lr_text(self.lr)}"] if self.lr is not None else []),
                *([f"data.val_tokens={self.val_tokens}"] if self.val_tokens is not None
                  else []),
                f"logging.val_every={self.val_every}", f"logging.ckpt_every={self.ckpt_every}",
                *([f"logging.keep_eval_checkpoints={self.points}"] if self.points else []),
                "logging.progress=false"]


PRESETS: dict[str, SyntheticPreset] = {
    # 4 layers, dim 64, about 0.2M parameters; 6400 steps of 32 sequences per arm (800 showed
    # two regimes of four, 3200 three in one seed: docs/SYNTHETIC.md), 8 checkpoints measured.
    "cpu": SyntheticPreset(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=192,
                           batch_size=32, steps=6400, lr=3e-3, val_every=800, ckpt_every=800,
                           points=8),
    # 8 layers, dim 256; 20000 steps of 128 sequences per arm; the 8-bit arm at H = 16 (the
    # paper's H), so its kappa is below H and the KL penalty acts.
    "gpu": SyntheticPreset(dim=256, n_layers=8, n_heads=8, n_kv_heads=4, ffn_dim=768,
                           batch_size=128, steps=20000, lr=1e-3, val_every=2000,
                           ckpt_every=2000, points=8, high_latent_bits=16),
    # a few steps of a tiny model, for tests.
    "smoke": SyntheticPreset(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64,
                             batch_size=8, steps=3, val_tokens=650, val_every=0,
                             ckpt_every=1000),
}


@dataclass
class SyntheticSettings:
    name: str = "default"
    setting: str = "cpu"
    kappas: tuple[float, ...] = DEFAULT_KAPPAS
    baseline: bool = True
    latent_bits: int = 8
    high_latent_bits: int | None = None
    """H of the arms whose kappa >= latent_bits; None: the setting's (SyntheticPreset), 0: none
    (every arm at latent_bits)."""
    overrides: list[str] = field(default_factory=list)
    n_prompts: int = 4
    n_shared_groups: int = 4
    group_size: int = 8
    figure_rows: int = 8
    temperature: float = 1.0
    n_eval: int = 512
    seed: int = 0
    threads: int = 1
    reuse: dict[str, str] = field(default_factory=dict)  # model label -> finished run dir


@dataclass
class Trained:
    model: Transformer
    info: dict[str, Any]  # run_id, run_dir, steps, train_wall_s, ...


TrainFn = Callable[[str, int, float, SyntheticSettings], Trained]


def parse_kappas(text: str) -> tuple[float, ...]:
    """The --kappa list (common.kappa's parser: space or comma separated, no value twice), at
    least one."""
    kappas = tuple(parse_kappa_list(text, "--kappa"))
    if not kappas:
        raise UsageError(f"--kappa: {text!r} holds no value; give free-bits thresholds "
                         "like '1/64 1/8 1 8'")
    return kappas


def model_label(latent_bits: int, kappa_bits: float | None) -> str:
    if latent_bits == 0 or kappa_bits is None:
        return "baseline"
    return f"kappa={kappa_label(kappa_bits)}"


def measure_device() -> str:
    """Where the trained models are measured: the GPU when there is one (the gpu setting's
    measurement of 9 checkpoints x 5 arms per seed would take hours on one CPU thread), else
    the CPU. The random draws come from CPU generators either way (the model draws on the
    generator's device), so prompts, Z and sampling are the same on both."""
    no_silent_cpu("CUDA_VISIBLE_DEVICES= runs it on the CPU anyway")  # issue 45
    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------- training
def train_with_experiments_train(label: str, latent_bits: int, kappa_bits: float,
                                 st: SyntheticSettings) -> Trained:
    """One arm through the LM runs' training loop (`experiments.train`)."""
    from experiments.train.config import compose  # imported here: hydra and the trainer are heavy
    from experiments.train.trainer import train

    ov = arm_overrides(st, latent_bits, kappa_bits)
    t0 = time.time()
    run = RunDir(Path(train(compose(ov))))
    return _finished(run, time.time() - t0, overrides=ov)


def load_finished_run(run_dir: str | os.PathLike, latent_bits: int,
                      kappa_bits: float) -> Trained:
    """A run experiments.train already finished (`--reuse label=run_dir`), checked against the
    arm it stands for; for when the run-id of the same settings has since changed."""
    run = RunDir(Path(run_dir))
    out = _finished(run, None, reused=True, data=run.record().data.get("source"))
    cfg = out.model.cfg
    if cfg.latent_bits != latent_bits or (latent_bits and abs(cfg.kappa_bits - kappa_bits) > 1e-12):
        raise ValueError(f"{run.path}: latent_bits={cfg.latent_bits}, kappa_bits="
                         f"{cfg.kappa_bits}; expected {latent_bits}, {kappa_bits}")
    return out


def _finished(run: RunDir, wall: float | None, **info: Any) -> Trained:
    """A finished run's final weights on the measuring device, with its steps and training wall
    time from its last `final` metrics line (`wall`: when that line has none)."""
    from model import load_checkpoint

    finals = [x for x in run.metrics_json() if x.get("kind") == "final"]
    final = finals[-1] if finals else {}
    model = load_checkpoint(run.final_checkpoint, map_location=measure_device()).model
    return Trained(model, {"run_id": run.run_id, "run_dir": str(run.path), **info,
                           "steps": final.get("step"), "train_wall_s": final.get("wall_s", wall)})


# --------------------------------------------------------------------------- measurement
def _seq_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits and (B, T) targets (-100: not scored) -> (B,) mean CE per sequence."""
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                           ignore_index=-100, reduction="none")
    keep = (targets != -100).float()
    return (ce.view_as(keep) * keep).sum(1) / keep.sum(1)


@torch.no_grad()
def evaluate(model: Transformer, n_eval: int, seed: int, batch_size: int = 128) -> dict[str, Any]:
    """Teacher-forced CE over the 64 body characters (nats/char) and KL per token (bits), with
    the SD over the held-out sequences of each CE (`ce_prior_sd`, `ce_encoder_sd`: the
    analysis's interval on CE is mean +- t * sd / sqrt(n_eval); each sequence draws its own
    prior Z, so the SD includes the prior draw)."""
    model.eval()
    x = eval_batch(seed, n_eval).to(model.device)
    inp, tgt = x[:, :-1], x[:, 1:].clone()
    tgt[:, 0] = -100  # '>' follows the prompt letter deterministically; score the body only
    free = arms.of_model(model.cfg.latent_bits).latent
    g = torch.Generator(device="cpu").manual_seed(seed + 17)
    per_p: list[torch.Tensor] = []
    per_e: list[torch.Tensor] = []
    kl = 0.0
    n = 0
    logits: list[torch.Tensor] = []  # the encoder's bit logits: the prior hole (issue 44)
    for s in range(0, n_eval, batch_size):
        xi, ti = inp[s:s + batch_size], tgt[s:s + batch_size]
        w = xi.shape[0]
        if free:
            op = model(xi, targets=ti, z="prior", generator=g)
            oe = model(xi, targets=ti, z="posterior", generator=g)
            per_p.append(_seq_ce(op.logits, ti).cpu())
            per_e.append(_seq_ce(oe.logits, ti).cpu())
            kl += float(oe.kl_tokens.mean()) * w
            logits.append(model.forward_lower(xi).bit_logits.float().cpu())
        else:
            per_p.append(_seq_ce(model(xi, targets=ti).logits, ti).cpu())
        n += w
    ln2 = float(torch.log(torch.tensor(2.0)))
    cp = torch.cat(per_p).double()
    ce = torch.cat(per_e).double() if free else None
    # every sequence scores the same 64 characters, so the mean of the per-sequence CEs is the
    # CE over all scored characters (what the ModelOutput's ce averages)
    split = code_marginal_kl(torch.cat(logits)) if free else {}
    return {"ce_prior": float(cp.mean()), "ce_prior_sd": float(cp.std()) if n > 1 else None,
            "marginal_bias_bits": split.get("marginal_bias_bits"),
            "information_bits": split.get("information_bits"),
            "ce_encoder": float(ce.mean()) if ce is not None else None,
            "ce_encoder_sd": float(ce.std()) if ce is not None and n > 1 else None,
            "kl_bits": kl / n / ln2 if free else None, "ce_scope": "body, nats/char",
            "n_eval": n_eval}


@torch.no_grad()
def generate_groups(model: Transformer, letters: Sequence[str], n_shared_groups: int,
                    group_size: int, temperature: float,
                    generator: torch.Generator) -> list[dict[str, Any]]:
    """Per prompt letter: group 0 draws Z per sequence; groups 1..K each pin one uniform Z.

    Every prompt's groups run in one batched generation (rows are independent).
    """
    model.eval()
    prompts = [encode(prompt_for(c)) for c in letters]
    P = len(prompts[0])
    n_groups = 1 + n_shared_groups
    rows_per_prompt = n_groups * group_size
    z: object = "prior"
    if arms.of_model(model.cfg.latent_bits).latent:
        C, T = model.cfg.n_codes, P + BODY_LEN
        parts = []
        for _ in letters:
            parts.append(torch.randint(0, C, (group_size, T), generator=generator))
            shared = torch.randint(0, C, (n_shared_groups, 1, T), generator=generator)
            parts.append(shared.expand(n_shared_groups, group_size, T).reshape(-1, T))
        z = torch.cat(parts).to(model.device)
    batch = [p for p in prompts for _ in range(rows_per_prompt)]
    gen = model.generate(batch, max_new_tokens=BODY_LEN, temperature=temperature, z=z,
                         generator=generator)
    out = []
    for b, toks in enumerate(gen.tokens):
        p, r = divmod(b, rows_per_prompt)
        g, row = divmod(r, group_size)
        out.append({"prompt_idx": p, "letter": letters[p], "group": g,
                    "group_kind": "per_sequence" if g == 0 else "shared", "row": row,
                    "text": decode(toks)})
    return out


def measure_points(label: str, trained: Trained, latent_bits: int, kappa_bits: float | None,
                   st: SyntheticSettings) -> list[dict[str, Any]]:
    """Every `eval_step_<N>.pt` the run kept (logging.keep_eval_checkpoints) before its final
    step, measured exactly as the final model is: the same held-out sequences, prompts and
    pinned codes, so a change over steps is the model's, not the draw's. The last kept
    checkpoint is the final weights; its record is the model record."""
    from model import load_checkpoint

    run_dir, final_step = trained.info.get("run_dir"), trained.info.get("steps")
    if not run_dir:
        return []
    recs: list[dict[str, Any]] = []
    for step, path in RunDir(Path(run_dir)).eval_checkpoints():
        if final_step is not None and step >= int(final_step):
            continue
        t0 = time.time()
        model = load_checkpoint(path, map_location=measure_device()).model
        pts = _measure_model(model, label, latent_bits, kappa_bits, st,
                             {"kind": "point", "step": step, "run_id": trained.info.get(
                                 "run_id"), "checkpoint": path.name}, "point_sample")
        pts[0]["measure_s"] = round(time.time() - t0, 2)
        recs += pts
    return recs


def _measure_model(m: Transformer, label: str, latent_bits: int, kappa_bits: float | None,
                   st: SyntheticSettings, head: dict[str, Any],
                   sample_kind: str) -> list[dict[str, Any]]:
    ev = evaluate(m, st.n_eval, st.seed)
    rec: dict[str, Any] = {"kind": head["kind"], "model": label,
                           "arm": arms.of_model(latent_bits).name,
                           "kappa_bits": kappa_bits if latent_bits else None,
                           "latent_bits": latent_bits,
                           **{k: v for k, v in head.items() if k != "kind"}, **ev}
    rng = random.Random(st.seed + 101)  # the same prompts for every model
    letters = [rng.choice(LETTERS) for _ in range(st.n_prompts)]
    g = torch.Generator(device="cpu").manual_seed(st.seed + 202)
    z_mode = "pinned uniform codes (prompt included)" if latent_bits else "none (no Z)"
    recs = [rec]
    step = {"step": head["step"]} if "step" in head else {}
    for s in generate_groups(m, letters, st.n_shared_groups, st.group_size, st.temperature, g):
        recs.append({"kind": sample_kind, "model": label, "arm": rec["arm"], **step,
                     "kappa_bits": rec["kappa_bits"], "z_mode": z_mode, **s})
    return recs


# --------------------------------------------------------------------------- driver
def run(st: SyntheticSettings, train_fn: TrainFn | None = None) -> Path:
    """Train every arm, measure it, write samples.jsonl; returns the output directory."""
    arms = check(st, compose_arms=train_fn is None)
    train_fn = train_fn or train_with_experiments_train
    torch.set_num_threads(st.threads)  # one thread is faster for this size on a shared CPU
    out_dir = results_root() / "synthetic" / st.name
    t0 = time.time()
    load_start = loadavg()  # wall times are comparable only at a known load (shared CPUs)
    for label in no_penalty_arms(arms):
        print(f"[synthetic] warning: {label} has kappa >= H = {st.latent_bits}, so its KL "
              "penalty is identically zero (KL <= H bits); --high-latent-bits 16 gives it one",
              flush=True)
    records: list[dict[str, Any]] = []
    for H, k in arms:
        label = model_label(H, k)
        print(f"[synthetic] {label}: training", flush=True)
        if label in st.reuse:
            trained = load_finished_run(st.reuse[label], H, 0.0 if k is None else k)
        else:
            trained = train_fn(label, H, 0.0 if k is None else k, st)
        # the model record and its samples, then those of every checkpoint kept along training
        recs = _measure_model(trained.model, label, H, k, st, {"kind": "model", **trained.info},
                              "sample") + measure_points(label, trained, H, k, st)
        r = recs[0]
        print(f"[synthetic] {label}: ce_prior={r['ce_prior']:.4f} ce_encoder="
              f"{r['ce_encoder']} kl_bits={r['kl_bits']} "
              f"train_wall_s={r.get('train_wall_s')}", flush=True)
        records += recs
    meta = {"kind": "meta", "name": st.name, "created": datetime.now(timezone.utc).isoformat(),
            "settings": {**asdict(st), "kappas": list(st.kappas),
                         "train_overrides": PRESETS[st.setting].overrides(),
                         "seq_len": SEQ_LEN,
                         "high_latent_bits": resolved_high_latent_bits(st),
                         "arm_latent_bits": {model_label(h, k): h for h, k in arms}},
            "wall_s": time.time() - t0, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "loadavg_start": load_start, "loadavg_end": loadavg()}
    atomic_write_text(out_dir / "samples.jsonl",
                      "".join(json.dumps(r) + "\n" for r in [meta, *records]))
    print(f"[synthetic] wrote {out_dir / 'samples.jsonl'} in {meta['wall_s']:.0f} s", flush=True)
    return out_dir


# --------------------------------------------------------------------------- input checks
# Keys the driver sets per arm; an override of them would silently train other arms.
OWN_KEYS = {"data": "the synthetic task is the data", "model.latent_bits": "use --latent-bits",
            "model.kappa_bits": "use --kappa"}


def resolved_high_latent_bits(st: SyntheticSettings) -> int | None:
    """--high-latent-bits, else the setting's; None when off (0 or unset everywhere)."""
    h = PRESETS[st.setting].high_latent_bits if st.high_latent_bits is None \
        else st.high_latent_bits
    return h or None


def no_penalty_arms(arms: Sequence[tuple[int, float | None]]) -> list[str]:
    """Labels of the Free Transformer arms with kappa >= H: KL <= H bits per token, so their
    free-bits penalty is identically zero."""
    return [model_label(h, k) for h, k in arms if h and k is not None and k >= h]


def arm_overrides(st: SyntheticSettings, latent_bits: int, kappa_bits: float) -> list[str]:
    return ["data=synthetic", *PRESETS[st.setting].overrides(),
            f"model.latent_bits={latent_bits}",
            f"model.kappa_bits={kappa_bits}", f"train.seed={st.seed}", *st.overrides]


def check_writable(d: Path, what: str) -> None:
    """UsageError unless d is, or can be made, a writable directory; creates nothing."""
    p = Path(d).absolute()
    if (bad := unwritable(p)) is not None:
        raise UsageError(f"{what} {p}: {bad}; set FTBENCH_RESULTS to a writable directory")


def check(st: SyntheticSettings, compose_arms: bool = True) -> list[tuple[int, float | None]]:
    """Every input problem, before any training or file: UsageError.
    Returns the arms, (latent bits, kappa or None), baseline first."""
    name = st.name  # one directory under <results>/synthetic/, never a path
    if not name.strip() or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise UsageError(f"--name {name!r}: must be a plain directory name (no path "
                         "separator, not empty, not . or ..), e.g. --name mid")
    if st.setting not in PRESETS:
        raise UsageError(f"--setting {st.setting!r}: allowed {sorted(PRESETS)}")
    for ov in st.overrides:
        key = ov.split("=", 1)[0].lstrip("+~")
        if key in OWN_KEYS:
            raise UsageError(f"override {ov!r}: {key} is set per arm here ({OWN_KEYS[key]})")
    high = resolved_high_latent_bits(st)
    if high is not None:
        over = [k for k in st.kappas if k >= st.latent_bits]
        if high <= st.latent_bits or any(k >= high for k in over):
            raise UsageError(
                f"--high-latent-bits {high}: must exceed --latent-bits {st.latent_bits} and "
                f"every kappa it applies to ({', '.join(kappa_label(k) for k in over) or '-'}), "
                "or else the KL penalty stays zero; e.g. 16")
    arms: list[tuple[int, float | None]] = [(0, None)] if st.baseline else []
    # the high H (where one is set) for the arms whose kappa >= the run's H
    arms += [(high if high is not None and k >= st.latent_bits else st.latent_bits, k)
             for k in st.kappas]
    if not arms:
        raise UsageError("nothing to train: --no-baseline with no --kappa")
    labels = [model_label(h, k) for h, k in arms]
    for label, rd in st.reuse.items():
        if label not in labels:
            raise UsageError(f"--reuse {label}={rd}: {label!r} is no arm here; arms: {labels}")
        if not (final := RunDir(Path(rd)).final_checkpoint).is_file():
            raise UsageError(f"--reuse {label}={rd}: no finished run there "
                                     f"({final.relative_to(rd)} missing)")
    check_writable(results_root() / "synthetic" / st.name, "results directory")
    if compose_arms:  # hydra's own checks (types, ranges) and where each run will go
        from experiments.train.config import compose

        for (h, k), label in zip(arms, labels, strict=True):
            if label in st.reuse:
                continue
            cfg = compose(arm_overrides(st, h, 0.0 if k is None else k))
            check_writable(runs_dir(cfg.paths.results), "runs directory")
    return arms


def parse_args(argv: Sequence[str] | None = None) -> SyntheticSettings:
    p = ArgParser(prog="python -m experiments.synthetic", description=__doc__.splitlines()[0])
    p.add_argument("--name", default="default", help="output: <results>/synthetic/<name>/")
    p.add_argument("--setting", default="cpu", choices=sorted(PRESETS))
    p.add_argument("--kappa", default="1/64 1/8 1 8",
                   help="free-bits thresholds in bits, space separated (fractions allowed)")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--latent-bits", type=positive_int, default=8, help="H")
    p.add_argument("--high-latent-bits", type=int, default=None,
                   help="H of the arms whose kappa >= --latent-bits (else their KL penalty is "
                        "identically zero); default: the setting's (gpu: 16, cpu: off); 0: off")
    p.add_argument("--n-prompts", type=positive_int, default=4)
    p.add_argument("--n-shared-groups", type=positive_int, default=4)
    p.add_argument("--group-size", type=positive_int, default=8)
    p.add_argument("--n-eval", type=positive_int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse", action="append", default=[], metavar="LABEL=RUN_DIR",
                   help="measure a finished run instead of training, e.g. kappa=1=results/runs/x")
    p.add_argument("overrides", nargs="*", help="extra hydra overrides for experiments.train")
    a = p.parse_args(argv)
    kappas = parse_kappas(a.kappa)
    bad = [r for r in a.reuse if "=" not in r.strip("=")]
    if bad:
        raise UsageError(f"--reuse {bad[0]!r}: give LABEL=RUN_DIR, e.g. "
                         "--reuse kappa=1=results/runs/<run-id>")
    same = {f.name: getattr(a, f.name) for f in fields(SyntheticSettings) if hasattr(a, f.name)}
    return SyntheticSettings(**{**same, "kappas": kappas, "baseline": not a.no_baseline,
                                "overrides": list(a.overrides),
                                "reuse": dict(r.rsplit("=", 1) for r in a.reuse)})


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        run(parse_args(sys.argv[1:] if argv is None else argv))
        return 0

    return cli("synthetic", body, "re-run the same command to resume (finished arms are not "
               "trained again)")


if __name__ == "__main__":
    sys.exit(main())
