"""Recipes (issue 27): the paper's protocol as data files, every value sourced.

Checked here: every shipped recipe loads; its training overrides compose through
experiments.train.config.compose and plan to the recipe's tokens and global batch (step counts
worked out by hand, not by the code under test); its grid expands into cells that compose and
share every setting; the micro-batch table fits its GPUs and never changes the global batch;
docs/RECIPES.md prints exactly the recipes' tables; bad recipe files are refused in one line
naming the file and the key; and cpu-mini is small: at most 8 cells, each at most 16,384
training tokens, 2M parameters and 16 optimizer steps.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from experiments.train.config import compose
from experiments.train.plan import plan
from sweeps import recipe as R
from sweeps.grid import expand

ROOT = Path(__file__).resolve().parents[1]
PAPER = ("paper-1.5B", "paper-8B", "paper-8B-1T")
SHIPPED = (*PAPER, "cpu-mini")
# by hand: ceil(tokens / (1024 x 4096)); 47e9 / 4,194,304 = 11,205.6...
PAPER_STEPS = {"paper-1.5B": 11_206, "paper-8B": 47_684, "paper-8B-1T": 238_419}
PAPER_TOKENS = {"paper-1.5B": 47e9, "paper-8B": 200e9, "paper-8B-1T": 1e12}


@pytest.fixture(scope="module")
def recipes() -> dict[str, R.Recipe]:
    return {n: R.load(n) for n in SHIPPED}


@pytest.fixture(scope="module")
def composed(recipes):
    return {n: compose(list(r.training_overrides())) for n, r in recipes.items()}


def test_every_shipped_recipe_loads_and_every_value_has_a_source(recipes) -> None:
    assert set(SHIPPED) <= set(R.known())
    for r in recipes.values():
        keys = [f"{s}.{k}" for s, ks in R.SECTIONS.items() for k in ks]
        assert sorted(r.provenance) == sorted(keys)
        for p in r.provenance.values():
            assert p.basis in R.BASES and len(p.source) > 10


def test_what_the_paper_states_is_marked_paper_and_what_it_omits_is_not(recipes) -> None:
    """The issue: the paper gives shapes, vocabulary, tokens, the kappa grid, H and Table 3's
    averaging; it gives no batch, learning rate, schedule, warmup or data mix."""
    for n in PAPER:
        r = recipes[n]
        for key in ("model.preset", "train.tokens", "grid.kappa_bits", "grid.latent_bits",
                    "corpus.vocab_size", "eval.average_last"):
            assert r.provenance[key].basis == "paper", (n, key)
        for key in ("train.batch_size", "train.seq_len", "optim.lr", "optim.schedule",
                    "optim.warmup_steps", "optim.weight_decay", "optim.grad_clip",
                    "optim.beta1", "optim.beta2", "optim.eps", "corpus.sources"):
            assert r.provenance[key].basis != "paper", (n, key)
        assert r.train.tokens == PAPER_TOKENS[n]
        assert r.corpus.vocab_size == 2 ** 17
        assert r.grid.latent_bits == (16,)
        assert r.eval.average_last == pytest.approx(1 / 3)
    assert recipes["paper-1.5B"].grid.kappa_bits == (0.25, 0.5, 1.0, 2.0)
    assert recipes["paper-8B"].grid.kappa_bits == (0.25, 0.5, 1.0, 2.0)
    assert recipes["paper-8B-1T"].grid.kappa_bits == (0.5,)
    assert recipes["paper-1.5B"].preset == "1.5B"
    assert {recipes[n].preset for n in ("paper-8B", "paper-8B-1T")} == {"8B"}


def test_training_overrides_compose_to_the_recipe_values(recipes, composed) -> None:
    for n, r in recipes.items():
        cfg = composed[n]
        assert cfg.model.preset == r.preset
        assert cfg.model.vocab_size == r.corpus.vocab_size
        assert str(cfg.data.source) == r.corpus.data
        t, o = cfg.train, cfg.optim
        assert (t.seq_len, t.batch_size, str(t.precision)) == (
            r.train.seq_len, r.train.batch_size, r.train.precision)
        assert t.tokens == r.train.tokens and t.plan_world_size == r.train.gpus
        assert (o.lr, o.min_lr_ratio, o.warmup_steps, o.weight_decay, o.grad_clip, o.beta1,
                o.beta2, o.eps) == (r.optim.lr, r.optim.min_lr_ratio, r.optim.warmup_steps,
                                    r.optim.weight_decay, r.optim.grad_clip, r.optim.beta1,
                                    r.optim.beta2, r.optim.eps)
        if r.corpus.data == "hf":
            got = [(s.path, s.name, s.field, s.weight) for s in cfg.data.hf_sources]
            assert got == [(s.path, s.name, s.field, s.weight) for s in r.corpus.sources]
            assert sum(s.weight for s in r.corpus.sources) == pytest.approx(1.0)
            # one pass over the budget: at least 4 bytes of text per token streamed
            assert cfg.data.hf_max_bytes >= 4 * r.train.tokens


def test_paper_plans_give_the_recipe_tokens_and_a_4m_token_global_batch(recipes,
                                                                         composed) -> None:
    for n in PAPER:
        p = plan(composed[n], world_size=1)
        assert p.tokens_per_step == 1024 * 4096 == recipes[n].tokens_per_step
        assert p.batch_size == 1024
        assert p.steps == PAPER_STEPS[n] == recipes[n].steps
        assert p.tokens == PAPER_STEPS[n] * 4_194_304
        assert PAPER_TOKENS[n] <= p.tokens < PAPER_TOKENS[n] + p.tokens_per_step
        assert p.warmup_steps == 2000
    p = plan(composed["cpu-mini"], world_size=1)
    assert (p.tokens_per_step, p.steps, p.tokens) == (512, 8, 4096)


def test_the_grid_has_the_recipe_cells(recipes) -> None:
    for n, r in recipes.items():
        spec = r.sweep_spec()
        cells = expand(spec)
        nk, nh, ns = len(r.grid.kappa_bits), len(r.grid.latent_bits), len(r.grid.seeds)
        want = ns + nk * nh * ns
        want += nh * ns if "flops" in r.grid.controls else 0
        want += ns if "plus1" in r.grid.controls else 0
        assert len(cells) == want, n
        assert spec.tokens == r.train.tokens and spec.preset == r.preset
    assert len(expand(recipes["paper-1.5B"].sweep_spec())) == 3 * (1 + 4 + 1 + 1)
    assert sorted(c.arm for c in expand(recipes["paper-8B-1T"].sweep_spec())) == [
        "baseline", "baseline_flops", "free"]
    assert len(expand(recipes["paper-1.5B"].sweep_spec(seeds=[7]))) == 7


def test_every_cpu_mini_cell_composes_shares_settings_and_is_small(recipes) -> None:
    """The sweep planner composes every cell and checks the arms share every setting; the
    bound: <= 8 cells, each <= 16,384 tokens, <= 2M parameters, <= 16 steps."""
    from sweeps import plan as launcher

    r = recipes["cpu-mini"]
    p = launcher.plan(r.sweep_spec(), name="recipe-test")
    arms = {c.cell.arm for c in p.cells}
    assert arms == {"baseline", "free", "baseline_flops", "baseline_plus1"}
    assert len(p.cells) <= 8
    for c in p.cells:
        assert c.tokens <= 16_384, c.cell.name
        cfg = compose(list(c.cell.overrides))
        pl = plan(cfg, world_size=1)
        assert pl.params["total"] <= 2_000_000 and pl.steps <= 16, c.cell.name
    assert p.shared["optim.lr"] == r.optim.lr
    assert p.shared["train.batch_size"] == r.train.batch_size


def test_one_cell_of_each_arm_trains_the_recipe_and_bf16_settings(recipes, composed) -> None:
    """One cell per arm of every recipe: a Free Transformer trains the baseline's tokens at its
    own latent settings (equal tokens, the paper's protocol); the 1.5B +1 control has 29 layers.
    Issue 36: the paper recipes (bf16) compile each block and set model.mapper_bf16 (the
    results tests: tests/test_compile.py, tests/test_mapper_bf16.py); cpu-mini (fp32, CPU)
    sets neither. mapper_bf16 is semantic where there is a mapper: it is in the paper's Free
    Transformer cells' run-ids (this changed them), not in the baselines'; compile is not."""
    from experiments.train.plan import run_id, semantic

    for n, r in recipes.items():
        cfg = composed[n]
        on = n in PAPER
        assert r.model.mapper_bf16 is on and r.train.compile is on, n
        assert cfg.model.mapper_bf16 is on and cfg.train.compile is on, n
        assert r.provenance["model.mapper_bf16"].basis == "ours"
        assert r.provenance["train.compile"].basis == "ours"
        if on:
            assert str(cfg.train.precision) == "bf16", n
            src = r.provenance["model.mapper_bf16"].source
            assert "tests/test_mapper_bf16.py" in src and "tests/test_model.py" in src
            assert "tests/test_compile.py" in r.provenance["train.compile"].source
        # one cell per arm: kappa, H and seed do not touch these keys (composing every cell of
        # every recipe took ~14 s)
        for c in {c.arm: c for c in reversed(expand(r.sweep_spec()))}.values():
            cell = compose(list(c.overrides))
            assert cell.model.mapper_bf16 is on and cell.train.compile is on, c.name
            # in the run-id of the cells with a mapper only: a baseline trains the same
            has_mapper = on and bool(cell.model.latent_bits)
            assert ("mapper_bf16" in semantic(cell)["model"]) is has_mapper, c.name
            assert cell.optim.lr == r.optim.lr and cell.model.vocab_size == r.corpus.vocab_size
            if c.arm == "free":
                p = plan(cell, world_size=1)
                assert cell.model.latent_bits in r.grid.latent_bits, c.name
                assert cell.model.kappa_bits in r.grid.kappa_bits, c.name
                assert p.steps == r.steps and p.tokens_per_step == r.tokens_per_step, c.name
            if (n, c.arm) == ("paper-1.5B", "baseline_plus1"):
                assert cell.model.n_layers == 29 and cell.model.latent_bits == 0
    cell = compose([*recipes["paper-1.5B"].training_overrides(), "model.latent_bits=16"])
    assert run_id(cell) != run_id(compose([*recipes["paper-1.5B"].training_overrides(),
                                           "model.latent_bits=16", "model.mapper_bf16=false"]))
    assert run_id(cell) == run_id(compose([*recipes["paper-1.5B"].training_overrides(),
                                           "model.latent_bits=16", "train.compile=false"]))


def test_micro_batches_never_change_the_global_batch(recipes) -> None:
    """Every shipped recipe on every GPU type trains its measured micro-batch (whose records
    tests/test_recipe_memory.py checks) with the recipe's global batch and steps."""
    for n, r in recipes.items():
        table = r.micro_batches()
        assert set(table) == set(R.GPU_TYPES), n
        for gpu, mb in table.items():
            p = plan(compose(list(r.training_overrides(gpu=gpu))), world_size=r.train.gpus)
            assert (p.micro_batch_size, p.grad_accum) == (mb.micro_batch_size, mb.grad_accum)
            assert p.batch_size == r.train.batch_size and p.steps == r.steps, (n, gpu)
    assert recipes["paper-1.5B"].micro_batches()["H100-80GB"].parallel == "ddp"
    assert recipes["paper-8B"].micro_batches()["H100-80GB"].parallel == "fsdp"
    with pytest.raises(R.UsageError, match="unknown GPU type 'V100'"):
        recipes["paper-1.5B"].training_overrides(gpu="V100")


def test_eval_settings(recipes) -> None:
    from analysis.paper_groups import PAPER_GROUPS

    paper_tasks = tuple(row["task"] for rows in PAPER_GROUPS.values() for row in rows
                        if row["task"])
    for n in PAPER:
        r = recipes[n]
        assert r.eval.tasks == paper_tasks
        assert r.eval.points == 9 and r.table3_points() == (7, 8, 9)
        assert r.eval.z == "prior"
        assert r.eval_runs() == [["--tasks", ",".join(paper_tasks), "--z", "prior"]]
    assert recipes["cpu-mini"].table3_points() == (2,)
    assert recipes["cpu-mini"].eval.points == 2


def test_eval_runs_group_tasks_by_fewshot(tmp_path: Path) -> None:
    raw = _raw("cpu-mini")
    raw["eval"]["tasks"]["value"] = ["gsm8k", "arc_easy", "mmlu", "commonsense_qa"]
    raw["eval"]["fewshot"]["value"] = {"gsm8k": 5, "mmlu": 5, "arc_easy": 0}
    raw["eval"]["points"]["value"] = 6
    r = R.load(_write(tmp_path, raw))
    assert r.eval_runs() == [
        ["--tasks", "commonsense_qa", "--z", "prior"],
        ["--tasks", "arc_easy", "--z", "prior", "--fewshot", "0"],
        ["--tasks", "gsm8k,mmlu", "--z", "prior", "--fewshot", "5"]]
    assert r.table3_points() == (5, 6)  # 4/6 is the boundary itself, not inside the last third


def test_docs_print_every_recipe_table(recipes) -> None:
    doc = (ROOT / "docs" / "RECIPES.md").read_text(encoding="utf-8")
    for n, r in recipes.items():
        assert r.table() in doc, f"docs/RECIPES.md is out of date for {n}: " \
                                 f"python -m sweeps.recipe table {n}"
        if n in PAPER:
            assert R.micro_table(r) in doc, f"micro-batch table of {n} out of date"


# ------------------------------------------------------------------------- bad input
def _raw(name: str) -> dict:
    return yaml.safe_load((R.RECIPES_DIR / f"{name}.yaml").read_text(encoding="utf-8"))


def _write(tmp_path: Path, raw: dict | str, name: str = "mine.yaml") -> Path:
    p = tmp_path / name
    p.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw), encoding="utf-8")
    return p


def _edit(section: str, key: str, value):
    def f(raw: dict) -> None:
        raw[section][key]["value"] = value
    return f


BAD = [  # the file's shape and value types (OmegaConf), the recipe's own checks, and one
    # refusal of each check it hands on (the trainer's config and plan, the grid's, the
    # evaluator's: their own tests and tests/test_refusals.py cover the rest of each)
    ("unknown top key", lambda raw: raw.update(extras={}), "extras: Key 'extras' not in"),
    ("missing key", lambda raw: raw["optim"].pop("eps"), "optim.eps: missing"),
    ("leaf without source", lambda raw: raw["optim"]["lr"].pop("source"),
     "optim.lr.source: missing"),
    ("bare leaf", lambda raw: raw["optim"].update(lr=1e-3), "optim.lr: Invalid type"),
    ("bad basis", lambda raw: raw["optim"]["lr"].update(basis="folklore"),
     "optim.lr.basis: Invalid value 'folklore'"),
    ("empty source", lambda raw: raw["optim"]["lr"].update(source="  "),
     "optim.lr: source must be"),
    ("precision", _edit("train", "precision", "fp8"), "train.precision='fp8': allowed values"),
    ("batch vs gpus", _edit("train", "gpus", 3), "train.batch_size=8 does not split"),
    ("schedule", _edit("optim", "schedule", "wsd"),
     "optim.schedule.value: Invalid value 'wsd', expected one of [cosine]"),
    ("seeds a string", _edit("grid", "seeds", "0 1"), "grid.seeds.value: Invalid value"),
    ("kappa repeated", _edit("grid", "kappa_bits", [0.5, "1/2"]), "grid.kappa_bits: 0.5 given "
                                                                   "twice"),
    ("hf without sources", _edit("corpus", "data", "hf"), "corpus.sources=[]: data=hf needs"),
    ("paths off files", _edit("corpus", "paths", ["a.txt"]), "only data=files takes"),
    ("unknown task", _edit("eval", "tasks", ["arc_easy", "no_such_task"]), "no_such_task"),
    ("fewshot stray task", _edit("eval", "fewshot", {"mmlu": 5}), "eval.fewshot"),
    ("one eval point", _edit("eval", "points", 1), "eval.points=1: must be an integer >= 2"),
    ("fractional eval points", _edit("eval", "points", 2.5), "eval.points.value: Value '2.5'"),
    ("posterior z", _edit("eval", "z", "posterior"),
     "eval.z.value: Invalid value 'posterior', expected one of [prior, prior-k]"),
]


@pytest.mark.parametrize("what,edit,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_recipe_files_are_one_line_errors(what, edit, msg, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # lm-eval's task index takes seconds to build; the evaluator's own tests read the real one
    monkeypatch.setattr("experiments.eval.run._all_lm_eval_tasks", lambda: frozenset({"x"}))
    raw = _raw("cpu-mini")
    edit(raw)
    p = _write(tmp_path, raw)
    with pytest.raises(R.UsageError) as ei:
        R.load(p)
    text = str(ei.value)
    assert "\n" not in text and "mine.yaml" in text, text
    assert msg in text, text


def test_bad_hf_source_entry(tmp_path: Path) -> None:
    """A mixture entry is the trainer's data.hf_sources[] (its schema) and a category."""
    raw = _raw("paper-1.5B")
    raw["corpus"]["sources"]["value"][0]["mirror"] = "x"
    with pytest.raises(R.UsageError, match=r"mine.yaml: corpus.sources: .*mirror"):
        R.load(_write(tmp_path, raw))
    raw = _raw("paper-1.5B")
    raw["corpus"]["sources"]["value"][1]["weight"] = 0
    with pytest.raises(R.UsageError, match=r"mine.yaml: corpus.sources: .*weight"):
        R.load(_write(tmp_path, raw))


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(R.UsageError, match="recipe 'paper-3B': unknown; known recipes: .*"
                                            "paper-1.5B"):
        R.load("paper-3B")
    with pytest.raises(R.UsageError, match="no such recipe file"):
        R.load(tmp_path / "absent.yaml")
    with pytest.raises(R.UsageError, match="RECIPE is empty"):
        R.load("")
    p = _write(tmp_path, "model: {preset: [\n", "broken.yaml")
    with pytest.raises(R.UsageError, match=r"broken.yaml: not valid YAML \(.*line 2"):
        R.load(p)
    p = _write(tmp_path, "- 1\n- 2\n", "list.yaml")
    with pytest.raises(R.UsageError, match="list.yaml: expected a mapping"):
        R.load(p)


def test_a_tokenizer_path_reaches_the_config(tmp_path: Path) -> None:
    """data.tokenizer exists since the corpus builder (issue 25): the recipe's path arrives."""
    raw = _raw("cpu-mini")
    raw["corpus"]["tokenizer"]["value"] = "tok/tokenizer.json"
    r = R.load(_write(tmp_path, raw))
    assert compose(list(r.training_overrides())).data.tokenizer == "tok/tokenizer.json"


def test_paths_and_names_with_commas_and_quotes_reach_the_config_intact(tmp_path: Path) -> None:
    raw = _raw("cpu-mini")
    raw["corpus"]["data"]["value"] = "files"
    paths = ["corpus dir/a,b.txt", "it's/*.jsonl", "x:y=z\\"]
    raw["corpus"]["paths"]["value"] = paths
    cfg = compose(list(R.load(_write(tmp_path, raw)).training_overrides()))
    assert cfg.data.paths == paths
    raw = _raw("paper-1.5B")
    raw["corpus"]["sources"]["value"][0].update(path="json", name="a,b:c")
    cfg = compose(list(R.load(_write(tmp_path, raw)).training_overrides()))
    assert (cfg.data.hf_sources[0].path, cfg.data.hf_sources[0].name) == ("json", "a,b:c")


def test_a_users_file_path_loads(tmp_path: Path) -> None:
    raw = _raw("cpu-mini")
    raw["train"]["tokens"]["value"] = "8k"
    r = R.load(_write(tmp_path, raw))
    assert r.train.tokens == 8000 and r.name == "mine"
    assert plan(compose(list(r.training_overrides())), world_size=1).steps == math.ceil(8000 / 512)
