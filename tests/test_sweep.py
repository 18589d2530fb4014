"""Sweeps (issue 4), fast part: grid, bad input, shared-settings guard, cluster config, status,
and a requeue through submitit's own checkpoint path with a stand-in trainer.

The end-to-end sweeps with the real trainer are tests/test_e2e.py (local) and tests/test_slurm.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import BENCH

from common.errors import UsageError
from common.paths import RunDir
from common.records import EvalSpec, EvalState, Manifest, ManifestCell
from sweeps import backend
from sweeps import driver as D
from sweeps import launcher as L
from sweeps import manifest as SM
from sweeps.grid import (
    ARCH_KNOBS,
    Cell,
    SweepSpec,
    expand,
    parse_amount,
    shared_settings,
)
from sweeps.job import CellJob

ROOT = Path(__file__).resolve().parents[1]


def spec(**kw: object) -> SweepSpec:
    args = dict(kappa="0.5 2 4", h="16", seeds="0 1")
    args.update(kw)
    return SweepSpec.from_text(**args)  # type: ignore[arg-type]


# ------------------------------------------------------------------ grid
def test_grid_arms_and_overrides() -> None:
    cells = expand(spec(h="8 16", controls="flops plus1", tokens="50k"))
    names = [c.name for c in cells]
    # one baseline per seed, one FT per (kappa, H, seed), controls per (H, seed) / per seed
    assert names[:2] == ["baseline-s0", "baseline-s1"]
    assert sum(c.arm == "free" for c in cells) == 3 * 2 * 2
    assert sum(c.arm == "baseline_flops" for c in cells) == 2 * 2
    assert sum(c.arm == "baseline_plus1" for c in cells) == 2
    assert len(set(names)) == len(names)
    ft = next(c for c in cells if c.name == "free-k0.5-H16-s1")
    assert ft.overrides == ("model=1M", "data=stdlib", "train.tokens=50000",
                            "model.latent_bits=16", "model.kappa_bits=0.5", "train.seed=1")
    flops = next(c for c in cells if c.name == "baseline_flops-H8-s0")
    assert "train.compute_match=flops" in flops.overrides
    assert "train.match_latent_bits=8" in flops.overrides
    plus1 = next(c for c in cells if c.arm == "baseline_plus1")
    assert "model.n_layers=5" in plus1.overrides  # the 1M preset has 4 layers
    # fractions; a value given twice, in any spelling, is refused (common.kappa's one rule)
    assert spec(kappa="1/64 1/8 2").kappa_bits == (1 / 64, 0.125, 2.0)
    with pytest.raises(UsageError, match=r"KAPPA: 1/8 given twice in '1/64 1/8 0.125 2'"):
        spec(kappa="1/64 1/8 0.125 2")
    assert parse_amount("3M", "TOKENS") == 3e6 and parse_amount("2e6", "TOKENS") == 2e6
    # the default name is a content hash: same grid -> same name, another grid -> another
    assert spec().default_name() == spec().default_name() != spec(seeds="0").default_name()


RUN = ["run", "--dry", "1"]
REFUSALS = [  # (entry point, argv, its one line after "<prog>: error: "): one row per check
    ("sweeps", [*RUN, "--kappa", "0.5 x"], "KAPPA: 'x' is not a number"),
    ("sweeps", [*RUN, "--kappa", "0.5 -1"], "KAPPA: '-1' must be a finite number >= 0"),
    ("sweeps", [*RUN, "--kappa", ""], "empty grid: KAPPA has no values"),
    ("sweeps", [*RUN, "--h", "32"], "H: 32 is outside 1..20"),
    ("sweeps", [*RUN, "--seeds", "-1"], "SEEDS: -1 is outside >= 0"),
    ("sweeps", [*RUN, "--preset", "nope"], "PRESET: unknown preset 'nope'"),
    ("sweeps", [*RUN, "--tokens", "1M", "--flops", "1e12"], "give TOKENS or FLOPS, not both"),
    ("sweeps", [*RUN, "--tokens", "lots"], "TOKENS='lots' is not a positive number"),
    ("sweeps", [*RUN, "--controls", "bigger"], "CONTROLS: unknown control 'bigger'"),
    ("sweeps", ["run", "--launcher", "pbs"], "LAUNCHER: 'pbs' is not local or slurm"),
    ("sweeps", ["run", "--launcher", "slurm", "--cluster", "/none.yaml"], "LAUNCHER=slurm needs"),
    ("sweeps", ["run", "--jobs", "0"], "JOBS: '0' must be an integer >= 1"),
    ("sweeps", [*RUN, "--name", "a/b"], "NAME: 'a/b' may use letters, digits"),
    ("sweeps", [*RUN, "--eval-points", "3"], "EVAL_POINTS=3 evaluates kept checkpoints: it "
     "needs EVAL=1"),
    ("sweeps", [*RUN, "--eval", "1", "--eval-points", "1"], "EVAL_POINTS: 1 must be >= 2"),
    ("sweeps", [*RUN, "--eval", "1", "--eval-points", "x"], "EVAL_POINTS: 'x' must be an "
     "integer >= 1"),
    ("sweeps", [*RUN, "--likelihood-rows", "-3"], "LIKELIHOOD_ROWS: '-3' must be an integer"),
    ("sweeps", ["run", "--dry", "maybe"], "argument --dry: invalid choice: 'maybe'"),
    ("sweeps", ["status", "nosuch"], "no sweep 'nosuch'"),
    ("sweeps", [*RUN, "--gpu", "H100-80GB"], "GPU: a GPU type is read from a recipe's"),
    ("sweeps", [*RUN, "--recipe", "cpu-mini", "--kappa", "1"],
     "RECIPE=cpu-mini sets the grid and the budget; KAPPA cannot be given"),
    # EVAL_ARGS are checked when the sweep is planned (DRY=1 too), before anything trains
    *(("sweeps", [*RUN, "--kappa", "1", "--h", "4", "--eval", "1", "--eval-args", args],
       f"EVAL_ARGS: {msg}") for args, msg in (
        (f"--tasks arc_eazy --limit 2 --data {BENCH}",
         "--tasks: unknown task(s) arc_eazy (did you mean arc_easy?)"),
        (f"--tasks arc_easy,race --data {BENCH}", "--tasks: no offline data for race"),
        ("--tasks 'arc_easy", "No closing quotation"))),
    ("sweeps.recipe", ["show", "nope"], "recipe 'nope': unknown"),
    ("pipelines.paper", ["--recipe", "nope"], "RECIPE: recipe 'nope': unknown; known recipes"),
    ("pipelines.paper", [], "RECIPE is required"),
    ("pipelines.paper", ["--recipe", "cpu-mini", "--seeds", "a b"], "SEEDS: 'a'"),
    ("pipelines.paper", ["--recipe", "cpu-mini", "--bench-data", "/no/such/dir"], "BENCH_DATA="),
    ("pipelines.paper", ["--recipe", "cpu-mini", "--gpus", "0"], "GPUS: '0'"),
    ("pipelines.paper", ["--recipe", "cpu-mini", "--name", "a b"], "NAME: 'a b' may use"),
]


@pytest.mark.parametrize("module, argv, msg", REFUSALS,
                         ids=[f"{m}:{' '.join(a)}"[:60] for m, a, _ in REFUSALS])
def test_bad_input_is_one_line_exit_2_nothing_written(module: str, argv: list[str], msg: str,
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The one usage-error path of each entry point (common.errors.cli): exit 2, one line on
    stderr naming the value, nothing under the results root; a real run too, not just DRY."""
    import importlib

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FTBENCH_DATA", raising=False)
    # lm-eval's task index takes seconds to build; the evaluator's own tests read the real one
    monkeypatch.setattr("experiments.eval.run._all_lm_eval_tasks", lambda: frozenset({"x"}))
    main = importlib.import_module(module if "." in module else f"{module}.__main__").main
    prog = {"sweeps": "sweep", "sweeps.recipe": "recipe", "pipelines.paper": "paper"}[module]
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{prog}: error: ") and msg in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "results").exists()


def test_limit_is_per_subject_of_a_grouped_task() -> None:
    """LIMIT on MMLU (a group of subjects) is per subject: the dry run says what it comes to."""
    assert backend.limit_lines(["arc_easy", "mmlu"], 5) == [
        "  limit 5 is per subject in mmlu: 57 subjects x 5 = 285 questions, 1,140 requests"]
    assert backend.limit_lines(["mmlu"], None) == []


# ------------------------------------------------------------------ shared-settings guard
def _cfg(lr: float = 1e-3, latent: int = 0, kappa: float = 0.5, seed: int = 0,
         layers: int = 4, tokens: int = 1000, match: str = "none") -> dict:
    return {"model": {"dim": 128, "n_layers": layers, "latent_bits": latent,
                      "kappa_bits": kappa},
            "optim": {"lr": lr, "weight_decay": 0.1},
            "train": {"seed": seed, "tokens": tokens, "compute_match": match,
                      "batch_size": 8},
            "paths": {"results": f"/tmp/r{seed}"}}


def test_guard_accepts_architecture_knobs_only() -> None:
    cells = [Cell("baseline-s0", "baseline", 0, ()), Cell("free-s0", "free", 0, ()),
             Cell("free-s1", "free", 1, ()), Cell("plus1-s0", "baseline_plus1", 0, ()),
             Cell("flops-s0", "baseline_flops", 0, ())]
    cfgs = [_cfg(), _cfg(latent=16, kappa=2), _cfg(latent=16, seed=1), _cfg(layers=5),
            _cfg(match="flops", tokens=3000)]
    shared = shared_settings(cells, cfgs, ignore=("paths.",))
    assert shared["optim.lr"] == 1e-3 and shared["model.dim"] == 128
    assert not set(shared) & {*ARCH_KNOBS, "train.seed", "train.tokens", "paths.results"}

    # the optimizer tuned for one arm and not the other: refused, naming key and cells
    bad = [_cfg(), _cfg(latent=16, lr=3e-4)]
    with pytest.raises(UsageError, match=r"optim.lr is 0.001 in baseline-s0 but 0.0003 in "
                                         r"free-s0"):
        shared_settings(cells[:2], bad)
    # only the equal-FLOPs control may change its horizon; a plain arm may not
    with pytest.raises(UsageError, match="train.tokens"):
        shared_settings(cells[:2], [_cfg(), _cfg(latent=16, tokens=5)])


class _FakeTrain:
    """compose/run_id/run_dir with train.py's contract, over plain dicts (no hydra, no torch);
    the results root `results` (and with `logging`, the trainer's keep_eval_checkpoints)."""

    def __init__(self, results: Path = Path("/tmp/ftbench-fake"), logging: bool = False) -> None:
        self.results, self.logging = results, logging

    def compose(self, overrides: list[str]) -> object:
        from types import SimpleNamespace as NS

        d = {"model": {"preset": "1M", "latent_bits": 0, "kappa_bits": 0.5, "n_layers": 4},
             "optim": {"lr": 0.001}, "train": {"seed": 0, "tokens": 1000, "flops": None,
                                               "seq_len": 64, "compute_match": "none",
                                               "match_latent_bits": 16},
             "data": {"source": "stdlib"}, "paths": {"results": str(self.results)}}
        if self.logging:
            d["logging"] = {"keep_eval_checkpoints": 0}
        for o in overrides:
            k, v = o.split("=", 1)
            if "." not in k or k.split(".")[0] not in d:
                continue
            a, b = k.split(".")
            d[a][b] = type(d[a][b])(v) if d[a][b] is not None else float(v)
        self.last = d
        ns = NS(**{k: NS(**v) for k, v in d.items()})
        ns._dict = d
        return ns

    def run_id(self, cfg: object) -> str:
        import hashlib

        return hashlib.sha256(json.dumps(cfg._dict, sort_keys=True).encode()).hexdigest()[:12]

    def run_dir(self, cfg: object) -> Path:
        return self.results / "runs" / self.run_id(cfg)


def _use_fake(monkeypatch: pytest.MonkeyPatch, fake: _FakeTrain) -> None:
    """sweeps.backend over the fake trainer: a plain token budget (no FLOPs matching)."""
    monkeypatch.setattr(backend, "compose", lambda cell: fake.compose(list(cell.overrides)))
    monkeypatch.setattr(backend, "run_id", fake.run_id)
    monkeypatch.setattr(backend, "run_dir", fake.run_dir)

    def planned(cfg: object) -> tuple[float, float]:
        tokens = float(cfg.train.tokens)
        return tokens, tokens * backend.flops_per_token(cfg)

    monkeypatch.setattr(backend, "planned", planned)


@pytest.fixture(autouse=True)
def _fake_to_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    orig = backend.to_dict
    monkeypatch.setattr(backend, "to_dict",
                        lambda cfg: cfg._dict if hasattr(cfg, "_dict") else orig(cfg))
    orig_fpt = backend.flops_per_token

    def fpt(cfg: object) -> float:
        if not hasattr(cfg, "_dict"):
            return orig_fpt(cfg)
        from model import get_preset, train_flops_per_token

        m = cfg._dict["model"]
        mc = get_preset("1M", latent_bits=int(m["latent_bits"]), n_layers=int(m["n_layers"]))
        return train_flops_per_token(mc, 64).total

    monkeypatch.setattr(backend, "flops_per_token", fpt)


# ------------------------------------------------------------------ cluster config
def test_local_sizing() -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    assert L.local_jobs(None) == (cores, 1)
    assert L.local_jobs(1) == (1, cores)


# ------------------------------------------------------------------ requeue (submitit's path)
STANDIN = textwrap.dedent("""
    import json, pathlib, signal, sys, time
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    run = pathlib.Path(sys.argv[1])
    ck = run / "checkpoints"; ck.mkdir(parents=True, exist_ok=True)
    state = ck / "state.json"
    step = json.loads(state.read_text())["step"] if state.exists() else 0
    with open(run / "starts.txt", "a") as f: f.write(f"{step}\\n")
    total = step + 5 if step else 10**6  # a fresh start runs until the signal comes
    while step < total:
        if stop:  # like train.py: write a checkpoint and exit
            state.write_text(json.dumps({"step": step})); sys.exit(75)
        time.sleep(0.05); step += 1
    (ck / "final.pt").write_text("done")
""")


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_requeue_through_submitit_checkpoint(tmp_path: Path) -> None:
    """USR2 from submitit's local controller (timeout - signal_delay) -> CellJob.checkpoint():
    the trainer checkpoints on SIGTERM, submitit requeues, the trainer resumes and finishes."""
    import submitit

    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    run = tmp_path / "run"
    # submitit's controller sends USR2 ~4 s into each attempt (timeout_min must be an integer)
    ex = submitit.LocalExecutor(folder=tmp_path / "jobs", max_num_timeout=5)
    ex.update_parameters(timeout_min=1, signal_delay_s=56)
    job = ex.submit(CellJob("standin", [sys.executable, str(script), str(run)],
                            run_dir=str(run), threads=1))
    t0 = time.time()
    while not job.done() and time.time() - t0 < 60:
        time.sleep(0.3)
    assert job.result()["state"] == "done"
    starts = [int(s) for s in (run / "starts.txt").read_text().split()]
    # the last attempt resumed where the checkpoint written on the signal left it (an attempt
    # signalled before the stand-in set its handler would restart from the same step)
    assert starts[0] == 0 and len(starts) >= 2 and starts == sorted(starts), starts
    assert starts[-1] > 0, starts
    assert (run / "checkpoints" / "final.pt").exists()
    log = Path(job.paths.stdout).read_text() + Path(job.paths.stderr).read_text()
    assert "asking the trainer to checkpoint" in log and "Requeued job" in log


def test_killed_child_is_interrupted_not_failed(tmp_path: Path) -> None:
    """A trainer killed by a signal leaves the cell resumable; an error exit fails it."""
    run = tmp_path / "run"
    j = CellJob("c", [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"],
                run_dir=str(run))
    r = j()
    assert r["state"] == "interrupted" and "SIGKILL" in r["reason"]
    bad = CellJob("c", [sys.executable, "-c", "raise SystemExit(3)"], run_dir=str(run))
    with pytest.raises(RuntimeError, match="exited with code 3"):
        bad()


# ------------------------------------------------------------------ chained evaluation (issue 12)
class _Ex:
    """An in-process stand-in for submitit's local executor: train jobs write final.pt, eval
    jobs do what `eval_do` says. Records every job's environment."""

    envs: list[tuple[str, dict]] = []
    eval_do = "fail"
    n = 0

    def __init__(self, folder: Path, cluster: str = "local", **_: object) -> None:
        self.folder = folder

    def update_parameters(self, **_: object) -> None:
        pass

    def submit(self, job: CellJob) -> object:
        from types import SimpleNamespace as NS

        from submitit.core.utils import FailedJobError

        _Ex.n += 1
        _Ex.envs.append((job.kind, dict(job.env)))
        err = res = None
        if job.kind == "train":
            ck = Path(job.run_dir) / "checkpoints"
            ck.mkdir(parents=True, exist_ok=True)
            (ck / "final.pt").write_text("x")
            res = {"state": "done"}
        elif _Ex.eval_do == "fail":
            err = FailedJobError("eval c exited with code 2: error: boom")
        else:
            run = Path(job.argv[3])
            if _Ex.eval_do == "write":
                from experiments.eval.run import planned_specs, validate_args

                specs = planned_specs(validate_args(job.argv[4:]), 64)  # the cells' seq_len
                for sp in specs.values():
                    (run / "eval").mkdir(parents=True, exist_ok=True)
                    (run / "eval" / EvalSpec.from_json(sp).file_name(6)).write_text("{}")
            res = {"state": "done"}

        def result() -> object:
            if err:
                raise err
            return res

        return NS(job_id=str(100000 + _Ex.n), done=lambda: True, result=result)


@pytest.fixture
def in_process_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake trainer with its results under tmp_path, and submitit's executor as _Ex."""
    import submitit

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    monkeypatch.delenv("FTBENCH_DATA", raising=False)
    _use_fake(monkeypatch, _FakeTrain(tmp_path))
    monkeypatch.setattr(D, "POLL_S", 0.0)
    monkeypatch.setattr(submitit, "AutoExecutor", _Ex)
    monkeypatch.setattr(D, "_cold_cache", lambda c: False)


def test_failed_chained_eval_is_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture,
                                          in_process_sweep: None) -> None:
    from sweeps.__main__ import main

    # --likelihood-rows 0: the fake trainer writes no checkpoint to measure (the chained
    # likelihood is covered by tests/test_e2e.py)
    base = ["run", "--kappa", "1", "--h", "4", "--tokens", "1k", "--name", "ev", "--eval", "1",
            "--likelihood-rows", "0",
            "--eval-args", f"--tasks arc_easy,humaneval_plus --limit 2 --data {BENCH}"]
    assert main([*base, "--dry", "1"]) == 0  # DRY=1: checked and shown, nothing written
    out = capsys.readouterr().out
    assert "eval (checked): lm-eval tasks arc_easy, limit 2, z prior, gen_tokens None" in out
    assert "eval (checked): evalplus tasks humaneval_plus" in out
    assert not (tmp_path / "sweeps").exists()
    _Ex.eval_do = "fail"
    assert main(base) == 1  # every cell trained, every evaluation failed: not a success
    out = capsys.readouterr().out
    assert "2 cells: 0 pending, 0 running, 2 done, 0 failed; eval: 0 pending, 0 running, " \
           "0 done, 2 failed" in out
    assert "eval: eval c exited with code 2: error: boom" in out
    assert out.rstrip().splitlines()[-3:] == [  # the last lines: what to run next
        "next: make report NAME=ev   (the HTML report; a partial sweep works, each missing "
        "cell says why)", "      make sweep-status NAME=ev   (the cells' states)",
        "      re-run the same command to resume what is unfinished (RETRY_FAILED=1 also "
        "reruns failed cells)"]
    assert ("train", {"FTBENCH_LAUNCHER": "local"}) in _Ex.envs
    assert "eval: 0 pending, 0 running, 0 done, 2 failed" in SM.table(SM.status("ev", tmp_path))
    m = json.loads((tmp_path / "sweeps" / "ev" / "manifest.json").read_text())
    from experiments.eval.run import spec_id

    assert m["eval_spec"]["suite"] == "lm-eval+evalplus" and m["eval_spec_id"]
    assert set(m["eval_specs"]) == {"lm-eval", "evalplus"}
    # the union keeps each suite's own spec inside (manifest.build), and the
    # analysis matches each suite's file through it
    from analysis.frame import _matches_manifest

    assert m["eval_spec"]["suites"] == {s: v["spec"] for s, v in m["eval_specs"].items()}
    assert m["eval_spec_id"] == spec_id(m["eval_spec"])
    for v in m["eval_specs"].values():
        assert _matches_manifest(v["spec"], v["spec_id"], m["eval_spec"], m["eval_spec_id"])
    assert m["skipped_controls"] == {}
    lm_spec = m["eval_specs"]["lm-eval"]["spec"]
    assert lm_spec == {"suite": "lm-eval", "tasks": ["arc_easy"], "limit": 2, "z_mode": "prior",
                       "k": 1, "fewshot": None, "gen_tokens": None,
                       "data_checksums": lm_spec["data_checksums"],
                       "context": 64}  # the cells' train.seq_len: the evaluation window
    assert list(lm_spec["data_checksums"]) == ["arc/arc_easy_test.llmfoundry.jsonl"]
    assert m["eval_specs"]["lm-eval"]["spec_id"] == spec_id(lm_spec)
    for c in m["cells"]:
        assert c["eval"]["state"] == "failed" and "boom" in c["eval"]["reason"]

    # exit 0 but no eval file for the sweep's spec: failed too, with the reason
    _Ex.eval_do = "nothing"
    assert main(base) == 1
    m = json.loads((tmp_path / "sweeps" / "ev" / "manifest.json").read_text())
    assert all("wrote no file for lm-eval (spec_id" in c["eval"]["reason"] for c in m["cells"])
    capsys.readouterr()

    _Ex.eval_do = "write"
    assert main(base) == 0, capsys.readouterr()
    m = json.loads((tmp_path / "sweeps" / "ev" / "manifest.json").read_text())
    for c in m["cells"]:
        ev = c["eval"]
        assert ev["state"] == "done" and ev["spec_id"] == m["eval_spec_id"]
        assert ev["files"]["lm-eval"] == f"eval/lm-eval.limit2.{spec_id(lm_spec)}.step6.json"
        assert ev["files"]["evalplus"].startswith("eval/evalplus.limit2.")
    # the same spec again: nothing to evaluate; another spec: evaluated again
    n = _Ex.n
    assert main(base) == 0 and _Ex.n == n
    assert main([*base[:-1], f"--tasks arc_easy --limit 3 --data {BENCH}"]) == 0
    assert _Ex.n == n + 2
    m = json.loads((tmp_path / "sweeps" / "ev" / "manifest.json").read_text())
    assert all(c["eval"]["file"].startswith("eval/lm-eval.limit3.") for c in m["cells"])


def test_skipped_controls_shown_in_dry_and_plan_and_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture, in_process_sweep: None) -> None:
    """CONTROLS=flops under a FLOPs budget would duplicate the baseline: not trained, and the
    DRY=1 text, the run's plan lines and the manifest (`skipped_controls`) all say why."""
    from sweeps.__main__ import main
    from sweeps.grid import skipped_controls

    args = ["run", "--kappa", "1", "--h", "4", "--flops", "1e9", "--controls", "flops plus1",
            "--name", "sk"]
    why = skipped_controls(spec(kappa="1", h="4", seeds="0", flops="1e9",
                                controls="flops plus1"))
    assert set(why) == {"baseline_flops"}
    assert main([*args, "--dry", "1"]) == 0
    out = capsys.readouterr().out
    assert f"skipped control: {why['baseline_flops']}" in out
    assert not any(ln.startswith("baseline_flops") for ln in out.splitlines())  # no cell
    _Ex.envs.clear()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"skipped control: {why['baseline_flops']}" in out
    m = json.loads((tmp_path / "sweeps" / "sk" / "manifest.json").read_text())
    assert m["skipped_controls"] == why
    # every train job tells the trainer how it was launched
    assert [e for k, e in _Ex.envs if k == "train"] == [{"FTBENCH_LAUNCHER": "local"}] * 3
    cell = ManifestCell.from_json(m["cells"][0])
    assert D._train_job(cell, None, "slurm").env == {"FTBENCH_LAUNCHER": "slurm"}


# ------------------------------------------------------------------ live progress (issues 15, 46)
def _lines(run: Path, recs: list[dict], at: float) -> None:
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    os.utime(run / "metrics.jsonl", (at, at))


def test_status_shows_phase_step_tokens_per_s_and_eta(tmp_path: Path) -> None:
    """A running cell shows its phase, the step of its last metrics line, its tokens/s and the
    ETA to its planned tokens and validations; the head line the sweep's ETA over its slots;
    a cell not running shows '-'."""
    from sweeps import manifest as M

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("run_id: r\n")
    t = time.time()
    _lines(run, [{"kind": "train", "step": s, "tokens": 1000 * s, "tokens_per_s": 500.0}
                 for s in (10, 20, 30)], t)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # a line being written
    os.utime(run / "metrics.jsonl", (t, t))
    assert M.live_progress(run, 90_000) == {"step": 30, "tokens": 30_000, "tokens_per_s": 500.0,
                                            "eta_s": 120.0}
    cfg = {"train": {"batch_size": 4, "seq_len": 250}, "logging": {"val_every": 0},
           "data": {"val_tokens": 1500}}  # 90 steps; validations at 0 and 90
    m = {"name": "s", "launcher": "local", "local": {"jobs": 1}, "cells": [
        {"cell": "a", "arm": "baseline", "run_id": "x", "state": "running", "job_id": "1",
         "run_dir": str(run), "tokens": 90_000, "flops_per_token": 1e6, "config": cfg},
        {"cell": "b", "arm": "baseline", "run_id": "y", "state": "pending", "job_id": None,
         "run_dir": str(tmp_path / "none"), "tokens": 90_000, "flops_per_token": 1e6,
         "config": cfg}]}
    rows = M.table(Manifest.from_json(m), now=t + 20).splitlines()
    # a: 60k tokens and the last validation (1500 tokens at a third of a training token) at
    # 500 tokens/s, less the 20 s since its line = 101 s; b after it: 180 + 2 validations
    assert rows[0].endswith("; training ETA 4.7 min"), rows[0]
    assert rows[1].split()[:8] == ["cell", "arm", "run-id", "state", "phase", "step", "tok/s",
                                   "ETA"]
    assert rows[2].split()[3:9] == ["running", "training", "30/90", "500", "101", "s"]
    assert rows[3].split()[3:8] == ["pending", "-", "-", "-", "-"]
    assert M.live_progress(tmp_path / "none", 1) is None


def test_phases_from_the_run_files_and_no_eta_of_0(tmp_path: Path) -> None:
    """Each phase is read from what the run wrote; an ETA is unknown ('?') until a speed is
    known and once its estimate is spent, never '0 s' for work in progress."""
    import datetime as dt

    from sweeps import manifest as M

    run = tmp_path / "r"
    t = time.time()
    cfg = {"train": {"batch_size": 4, "seq_len": 250}, "logging": {"val_every": 10},
           "data": {"val_tokens": 3000}}  # 30 steps of 1000 tokens; validations 0, 10, 20, 30
    c = ManifestCell(cell="free-x", arm="free", run_id="r", run_dir=str(run), state="running",
                     tokens=30_000, flops_per_token=1e6, config=cfg,
                     started=dt.datetime.fromtimestamp(t - 100, dt.timezone.utc).isoformat())
    lv = M.live(c, now=t)
    assert (lv.phase, lv.eta_s) == ("starting", None)  # no run record yet: corpus, model
    late = dataclasses.replace(c, started=dt.datetime.fromtimestamp(
        t - 10, dt.timezone.utc).isoformat())  # the sweep's speed: 1e9 FLOP/s = 1000 tokens/s
    assert M.live(late, flop_rate=1e9, now=t).eta_s == pytest.approx(
        (30_000 + 4 * 3000 * 2 / 3) / 1000 - 10, abs=1)
    run.mkdir()
    (run / "config.yaml").write_text("run_id: r\n")
    os.utime(run / "config.yaml", (t - 60, t - 60))
    _lines(run, [], t - 60)
    assert M.live(c, now=t).phase == "validating"  # step 0's, before its line
    _lines(run, [{"kind": "val", "step": 0, "val_tokens": 3000}], t - 50)
    lv = M.live(c, now=t)  # 3000 tokens x 2 passes / 3 in 10 s: 200 tokens/s estimated
    assert (lv.phase, lv.step, lv.steps, lv.tokens_per_s, lv.speed) == (
        "training", 0, 30, None, pytest.approx(200.0))
    assert lv.eta_s == pytest.approx((30_000 + 3 * 2000) / 200 - 50)
    train = {"kind": "train", "step": 10, "tokens": 10_000, "tokens_per_s": 1000.0}
    _lines(run, [{"kind": "val", "step": 0}, train], t - 1)
    assert M.live(c, now=t).phase == "validating"  # step 10 validates
    _lines(run, [{"kind": "val", "step": 0}, {**train, "step": 30, "tokens": 30_000}], t - 60)
    lv = M.live(c, now=t)
    assert (lv.phase, lv.eta_s) == ("validating", None)  # the last one, over its estimate
    assert "ETA ?" not in M.dur(None) and M.dur(None) == "?"
    _lines(run, [{**train, "step": 30}, {"kind": "val", "step": 30}, {"kind": "final"}], t)
    assert M.live(c, now=t).phase == "saving"
    done = dataclasses.replace(c, state="done")
    assert M.live(done, now=t) is None
    done.eval = EvalState(state="running")
    assert M.live(done, now=t).phase == "evaluating"


def test_sweeps_list(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`make sweeps`: one line per sweep, newest first, with cells trained and its grid; one
    line and exit 0 when there is none."""
    from fake import write_fake_sweep

    from sweeps.__main__ import main

    assert main(["list", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == \
        f"no sweeps under {tmp_path / 'sweeps'} (make sweep starts one)"
    write_fake_sweep(tmp_path, "old", seeds=(0,), pending=("free-k4-H16-s0",))
    man = write_fake_sweep(tmp_path, "new", kappas=(1.0,), controls=())
    for f in tmp_path.glob("runs/*/metrics.jsonl"):
        os.utime(f, (0, 0))
    os.utime(man.parent.parent / "old" / "manifest.json", (0, 0))
    os.utime(man, (2e9, 2e9))
    assert main(["list", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out] == ["new", "old"]
    assert "2033-05-18 03:33 UTC  4/4 trained  arms baseline,free; kappa 1; H 16; seeds 0 1; " \
           "controls none" in out[0]
    assert "4/5 trained" in out[1] and "controls baseline_flops" in out[1]


@pytest.mark.slow  # a real 2-cell sweep, interrupted and run again
def test_ctrl_c_is_one_line_and_the_rerun_resumes(tmp_path: Path) -> None:
    """SIGINT to the sweep's process group, as a terminal's Ctrl-C sends it: no traceback
    (submitit's local controllers printed two), one line saying how to resume, exit 130; the
    same command again resumes the interrupted cells from their checkpoints."""
    import signal

    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path / "results"),
           "FTBENCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    env.pop("FTBENCH_DATA", None)
    argv = [sys.executable, "-m", "sweeps", "run", "--kappa", "1", "--h", "4", "--tokens",
            "32k", "--name", "cc", "--jobs", "2", "--overrides",
            "train.seq_len=64 train.batch_size=4 data.max_bytes=300000 data.val_tokens=1024 "
            "logging.val_every=0 logging.ckpt_every=4 logging.log_every=4"]
    p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()
    while time.time() - t0 < 300 and p.poll() is None and not any(
            '"kind": "train"' in f.read_text() for f in tmp_path.glob("results/runs/*/"
                                                                      "metrics.jsonl")):
        time.sleep(0.5)
    assert p.poll() is None, p.communicate()
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, (out, err)
    assert "Traceback" not in err and err.strip().splitlines() == [
        "sweep: interrupted; re-run the same command to resume"], err
    assert "interrupted: stopping" in out and "-> pending (interrupted" in out, out
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    logs = [f.read_text() for f in tmp_path.glob("results/runs/*/train.log")]
    assert len(logs) == 2 and any("resumed from step_" in x for x in logs), logs


# ------------------------------------------------------------------ layout (issue 23)
def test_backend_is_the_only_door_into_experiments() -> None:
    """Every `import experiments...` in sweeps/ is in backend.py (no exemption)."""
    import ast

    offenders = []
    for path in sorted((ROOT / "sweeps").glob("*.py")):
        if path.name == "backend.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                else []
            if any(m.split(".")[0] == "experiments" for m in mods):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_cell_states_are_written_by_the_manifest_only() -> None:
    """No module but manifest.py assigns a cell's `state` (the launcher reports outcomes)."""
    import re

    pat = re.compile(r"""(\bstate=|\[["']state["']\]\s*(?!=)\s*=(?!=))""")
    writers = [p.name for p in (ROOT / "sweeps").glob("*.py")
               if p.name not in ("manifest.py", "job.py") and pat.search(p.read_text())]
    assert writers == []


def test_manifest_transitions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cell's transitions write exactly what the driver's dict updates used to."""
    c = ManifestCell(cell="x", arm="free", run_dir=str(tmp_path), attempts=1, slot=7, step=3)
    c.job_started("123")
    assert (c.state, c.job_id, c.reason, c.attempts, c.slot) == \
        ("running", "123", None, 2, 7)  # SLURM: no slot, the old one is left
    assert c.started is not None
    c.job_started("124", slot=0)
    assert c.slot == 0 and c.attempts == 3
    c.job_ended("failed", "boom", 12.34, RunDir(c.run))
    assert (c.state, c.reason, c.wall_s, c.step) == ("failed", "boom", 12.3, 3)
    m = Manifest(name="m", eval_spec_id="abc", eval_specs={})
    c.eval_started(m, "9")
    assert c.to_json()["eval"] == {"state": "running", "job_id": "9", "spec_id": "abc"}
    assert c.eval_ended(m, "pending", "killed", 1.0, RunDir(c.run)) == ("failed", "killed")
    assert c.needs_eval(m)
    assert c.eval is not None
    c.eval.state = "done"
    assert not c.needs_eval(m) and c.needs_eval(Manifest(name="m", eval_spec_id="o"))
    cells = [ManifestCell(cell=s, arm="baseline", state=s)
             for s in ("pending", "running", "done", "failed")]
    m = Manifest(name="m", cells=cells)
    assert m.select(False) == [cells[0]]
    assert m.select(True) == [cells[0], cells[3]]
    # the file round trip keeps every key, the unknown ones included
    d = {**cells[3].to_json(), "from_a_newer_version": 1}
    assert ManifestCell.from_json(d).to_json() == d


def test_overrides_split_like_a_shell_not_on_commas() -> None:
    """A hydra list is one override; quotes hold a value with a space; an open quote is one
    line, never a half-parsed grid."""
    s = SweepSpec.from_text(kappa="1", h="4", seeds="0",
                            overrides="data.data_files=[a.txt,b.txt]  'run.tag=a b' optim.lr=1e-3")
    assert s.overrides == ("data.data_files=[a.txt,b.txt]", "run.tag=a b", "optim.lr=1e-3")
    assert SweepSpec.from_text(kappa="1", h="4", seeds="0", overrides=["a=1,2"]).overrides == (
        "a=1,2",)
    with pytest.raises(UsageError, match="OVERRIDES: No closing quotation"):
        SweepSpec.from_text(kappa="1", h="4", seeds="0", overrides="optim.lr='1e-3")
