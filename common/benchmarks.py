"""The benchmarks, one typed row each (`Benchmark`): the one place a benchmark's facts are
written; every list the suite keeps is derived from the rows. Adding one: docs/DESIGN.md,
"Adding a benchmark". Standard library only. `paper_metric` is transcribed from the paper's
Tables 1-2 (PAPER_METRICS_CHECKED); `requests` and `cost_min` were measured on a 16M checkpoint
(docs/BENCH.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SUITES = ("lm-eval", "evalplus")
SCORING = ("loglik", "generate")
"""'loglik': scored by log-likelihood only (its spec has no generation length); 'generate':
the model writes an answer."""
GROUPS = ("Generative code/math", "Multi-choice general knowledge / common sense",
          "Multi-choice text understanding", "Culture")
"""The paper's four row groups, in its order."""
CODE_MATH = GROUPS[0]
"""The group the paper's headline claim is about (the Free Transformer helps code and math)."""
GOLD_BPB_SUFFIX = "_gold_bpb"
"""`<task>_gold_bpb`: bits per byte of the gold answer, the smooth metric a generation
benchmark adds (its `gold_bpb` flag)."""
PAPER_METRICS_CHECKED = False
"""True once every `paper_metric` was checked against Tables 1-2 of arXiv 2510.17558 (the
project could read only the paper's opening; Meta's model cards confirm the metric names)."""
_ARROW = ("data-00000-of-00001.arrow", "dataset_info.json", "state.json")
"""The files of a Hugging Face `save_to_disk` copy."""


class BenchmarkError(ValueError):
    """A task name no row has (one line naming it and the known ones)."""


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: a row of the paper's table and, when the suite runs it, its task."""

    label: str
    """The paper's row name ("HumanEval+", "ARC-E")."""
    group: str
    """The paper's row group (one of GROUPS)."""
    paper_metric: str
    """The paper's metric for the row: pass@1, em, acc_char (log-likelihood per character),
    acc_completion (normalised by the completion's unconditional likelihood),
    macro_avg/acc_char."""
    note: str
    """Why our number is or is not the paper's; what the offline copy lacks."""
    task: str | None = None
    """The task this suite runs (lm-eval's stock task name, or the evalplus task); None: the
    suite cannot run the row."""
    suite: str | None = None
    """'lm-eval' or 'evalplus' (None: not run)."""
    scoring: str | None = None
    """'loglik' or 'generate' (one of SCORING)."""
    stock: str | None = None
    """lm-eval: the stock YAML, relative to lm_eval/tasks/; evalplus: its dataset name."""
    offline: tuple[str, ...] = ()
    """The files the task reads under BENCH_DATA (relative paths, each pinned by a sha256)."""
    offline_sums: str | None = None
    """A sha256sum file under BENCH_DATA whose every line is a file the task reads (MMLU's
    csvs); an absent one is itself the missing file."""
    offline_ready: bool = False
    """It runs offline from BENCH_DATA (an lm-eval task through the YAML experiments/eval/tasks
    writes, an evalplus task through its dataset file); False: online only."""
    fewshot_source: bool = True
    """The offline copy has the split the stock few-shot examples come from (train or dev);
    without it the task is exact offline only at its stock 0 shots."""
    partial: str | None = None
    """The label every table and file carries when the offline copy is not the whole stock
    evaluation set (its numbers are not comparable with stock ones)."""
    primary: str = "acc"
    """The metric its eval file marks primary (a result-file key: lm-eval's `metric,filter`
    with a `none` filter dropped)."""
    stock_metrics: tuple[str, ...] = ()
    """The metrics the stock task computes, as result-file keys."""
    metric: str | None = None
    """The metric the report's row shows: the paper's where a stock one is it, else the
    closest stock one (then `matches_paper` is False and the table marks it)."""
    matches_paper: bool = False
    """`metric` is the paper's metric (possibly under another name)."""
    default: bool = False
    """In the default set (`make eval` without TASKS; `TASKS=original` of bench-eval)."""
    gold_bpb: bool = False
    """It also scores the gold answer's bits per byte (task `<task>_gold_bpb`)."""
    chance: float | None = None
    """What a random guesser scores on `metric` (None: not stated)."""
    requests: int | None = None
    """Requests on its full split, gold-bpb requests included, as measured (None: not
    measured)."""
    cost_min: float | None = None
    """Minutes its full evaluation took on a 16M checkpoint on one 2-core machine thread, as
    measured (orders the bench-eval queue; None: not measured)."""
    title: str | None = None
    """What the suite's claims call the benchmark it runs when that is not the paper's row
    (MBPP+ for the paper's MBPP); None: `label`."""

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise BenchmarkError(f"{self.label}: group {self.group!r} is not one of {GROUPS}")
        if self.task is not None and (self.suite not in SUITES or self.scoring not in SCORING):
            raise BenchmarkError(f"{self.label}: suite {self.suite!r} / scoring "
                                 f"{self.scoring!r} must be one of {SUITES} / {SCORING}")

    @property
    def name(self) -> str:
        """The benchmark as the suite's claims name it: `title`, else the paper's `label`."""
        return self.title or self.label

    @property
    def gold_task(self) -> str | None:
        """`<task>_gold_bpb` when the benchmark scores its gold answers, else None."""
        return f"{self.task}{GOLD_BPB_SUFFIX}" if self.gold_bpb and self.task else None

    def paper_row(self) -> dict[str, object]:
        """The row as analysis/paper_groups.py hands it to the tables (benchmark, paper_metric,
        task, stock_metrics, metric, matches_paper, note)."""
        return {"benchmark": self.label, "paper_metric": self.paper_metric, "task": self.task,
                "stock_metrics": list(self.stock_metrics), "metric": self.metric,
                "matches_paper": self.matches_paper, "note": self.note}


_G1, _G2, _G3, _G4 = GROUPS
_CHAR = "lm-eval acc_norm divides by the choice's length in characters"
_NO_COMPLETION = "no stock completion-normalised metric; acc_norm (per character) is closest"
_ACC_NORM = ("acc", "acc_norm")
_EM = "exact_match,remove_whitespace"
TRIVIAQA_PARTIAL = "partial (7,993 of 17,944)"

BENCHMARKS: tuple[Benchmark, ...] = (
    # ---- Generative code/math
    Benchmark("HumanEval+", _G1, "pass@1", task="humaneval_plus", suite="evalplus",
              scoring="generate", stock="humaneval",
              offline=("humanevalplus/HumanEvalPlus-v0.1.10.jsonl",), offline_ready=True,
              primary="pass@1_plus",
              stock_metrics=("pass@1_base", "pass@1_plus"), metric="pass@1_plus",
              matches_paper=True, default=True, gold_bpb=True, chance=0.0, requests=328,
              cost_min=3.0,
              note="evalplus (HumanEval+ v0.1.10), greedy; plus = base and extra tests"),
    Benchmark("MBPP", _G1, "pass@1", task="mbpp_plus", suite="evalplus", scoring="generate",
              stock="mbpp", offline=("mbppplus/MbppPlus-v0.2.0.jsonl",), offline_ready=True,
              primary="pass@1_plus",
              stock_metrics=("pass@1_base", "pass@1_plus"), metric="pass@1_base",
              default=True, gold_bpb=True, chance=0.0, requests=756, cost_min=5.0,
              title="MBPP+",
              note="the suite runs MBPP+ v0.2.0 (378 tasks, evalplus); the paper's MBPP is the "
                   "original set, so the problems differ (pass@1_base is the closer number)"),
    Benchmark("GSM8K", _G1, "em", task="gsm8k", suite="lm-eval", scoring="generate",
              stock="gsm8k/gsm8k.yaml", offline=("gsm8k/test.jsonl", "gsm8k/train.jsonl"),
              offline_ready=True, primary="exact_match,strict-match",
              stock_metrics=("exact_match,strict-match", "exact_match,flexible-extract"),
              metric="exact_match,strict-match", matches_paper=True, default=True,
              gold_bpb=True, chance=0.0, requests=2638, cost_min=12.0,
              note="stock 5-shot; the paper's answer extraction is not stated"),
    # ---- Multi-choice general knowledge / common sense
    Benchmark("MMLU", _G2, "macro_avg/acc_char", task="mmlu", suite="lm-eval",
              scoring="loglik", stock="mmlu/default", offline_sums="mmlu/SHA256SUMS",
              offline_ready=True, primary="acc", stock_metrics=("acc",), metric="acc",
              default=True, chance=0.25, requests=56168, cost_min=14.0,
              note="stock: letter choices (A-D), so length normalisation would change nothing, "
                   "but the stock group acc is weighted by subject size (a micro average), the "
                   "paper's a macro average over subjects"),
    Benchmark("CSQA", _G2, "acc_char", task="commonsense_qa", suite="lm-eval",
              scoring="loglik", stock="commonsense_qa/default.yaml",
              offline=("commonsenseqa/train_rand_split.jsonl",
                       "commonsenseqa/dev_rand_split.jsonl"),
              offline_ready=True, primary="acc", stock_metrics=("acc",), metric="acc",
              default=True, chance=0.2, requests=6105, cost_min=1.5,
              note="stock scores the letters A-E, not the answer texts"),
    Benchmark("HellaSwag", _G2, "acc_char", task="hellaswag", suite="lm-eval",
              scoring="loglik", stock="hellaswag/hellaswag.yaml",
              offline=tuple(f"hellaswag/validation/{f}" for f in _ARROW), offline_ready=True,
              fewshot_source=False, primary="acc_norm", stock_metrics=_ACC_NORM,
              metric="acc_norm", matches_paper=True, requests=40168, cost_min=10.0, note=_CHAR),
    Benchmark("WinoGrande", _G2, "acc_char", task="winogrande", suite="lm-eval",
              scoring="loglik", stock="winogrande/default.yaml",
              offline=tuple(f"winogrande/validation/{f}" for f in _ARROW), offline_ready=True,
              fewshot_source=False, primary="acc", stock_metrics=("acc",), metric="acc",
              matches_paper=True, requests=2534, cost_min=1.0,
              note="partial scoring: every option scores the same continuation, so length "
                   "normalisation cannot change the choice (acc = acc_char)"),
    Benchmark("OBQA", _G2, "acc_completion", task="openbookqa", suite="lm-eval",
              scoring="loglik", stock="openbookqa/openbookqa.yaml",
              offline=("openbookqa/test.tsv",), offline_ready=True, fewshot_source=False,
              primary="acc_norm", stock_metrics=_ACC_NORM, metric="acc_norm", requests=2000,
              cost_min=0.5, note=_NO_COMPLETION),
    Benchmark("ARC-E", _G2, "acc_completion", task="arc_easy", suite="lm-eval",
              scoring="loglik", stock="arc/arc_easy.yaml",
              offline=("arc/arc_easy_test.llmfoundry.jsonl",), offline_ready=True,
              fewshot_source=False, primary="acc_norm", stock_metrics=_ACC_NORM,
              metric="acc_norm", default=True, chance=0.25, requests=9504, cost_min=2.0,
              note=_NO_COMPLETION),
    Benchmark("ARC-C", _G2, "acc_completion", task="arc_challenge", suite="lm-eval",
              scoring="loglik", stock="arc/arc_challenge.yaml",
              offline=("arc/arc_challenge_test.llmfoundry.jsonl",), offline_ready=True,
              fewshot_source=False, primary="acc_norm", stock_metrics=_ACC_NORM,
              metric="acc_norm", default=True, chance=0.25, requests=4688, cost_min=1.0,
              note=_NO_COMPLETION),
    Benchmark("PIQA", _G2, "acc_char", task="piqa", suite="lm-eval", scoring="loglik",
              stock="piqa/piqa.yaml", offline=("piqa/valid.jsonl", "piqa/valid-labels.lst"),
              offline_ready=True, fewshot_source=False, primary="acc_norm",
              stock_metrics=_ACC_NORM, metric="acc_norm", matches_paper=True, requests=3676,
              cost_min=2.0, note=_CHAR),
    # ---- Multi-choice text understanding
    Benchmark("RACE-high", _G3, "acc_char", task="race", suite="lm-eval", scoring="loglik",
              stock="race/race.yaml", primary="acc", stock_metrics=("acc",), metric="acc",
              note="stock race is the high-school split only; no acc_norm; online only (no "
                   "offline copy)"),
    Benchmark("RACE-middle", _G3, "acc_char",
              note="lm-eval has no stock RACE-middle task and there is no offline copy"),
    Benchmark("BoolQ", _G3, "acc_completion", task="boolq", suite="lm-eval", scoring="loglik",
              stock="super_glue/boolq/default.yaml", offline=("boolq/val.jsonl",),
              offline_ready=True, fewshot_source=False, primary="acc", stock_metrics=("acc",),
              metric="acc", requests=6540, cost_min=3.0,
              note="stock scores ' no' / ' yes' unnormalised"),
    # ---- Culture
    Benchmark("NQ", _G4, "em", task="nq_open", suite="lm-eval", scoring="generate",
              stock="nq_open/nq_open.yaml", offline=("nq_open/NQ-open.dev.jsonl",),
              offline_ready=True, fewshot_source=False, primary=_EM, stock_metrics=(_EM,),
              metric=_EM, matches_paper=True, requests=3610, cost_min=4.0,
              note="stock 0-shot, answers normalised (case, punctuation, articles)"),
    Benchmark("TriviaQA", _G4, "em", task="triviaqa", suite="lm-eval", scoring="generate",
              stock="triviaqa/default.yaml",
              offline=tuple(f"triviaqa/rc.wikipedia.nocontext_validation/{f}" for f in _ARROW),
              offline_ready=True, fewshot_source=False, partial=TRIVIAQA_PARTIAL, primary=_EM,
              stock_metrics=(_EM,), metric=_EM, matches_paper=True, cost_min=8.0,
              note=f"offline: {TRIVIAQA_PARTIAL} (the Wikipedia questions of the rc.nocontext "
                   "validation split); not comparable with stock triviaqa numbers"),
)
"""Every benchmark, in the paper's table order (group by group)."""

EXTRA_DATA: dict[str, str] = {"mmlu_validation": "mmlu/validation/SHA256SUMS"}
"""Offline data pinned under its own key though no task reads it yet: MMLU's validation split
(`save_to_disk` copies), listed by this sha256sum file (paths relative to the data dir)."""

_BY_TASK = {b.task: b for b in BENCHMARKS if b.task}


def benchmark(task: str) -> Benchmark:
    """The row of a task (a `<task>_gold_bpb` task gives its benchmark's row); BenchmarkError
    (one line) for a task no row has."""
    b = find(task)
    if b is None:
        raise BenchmarkError(f"task {task!r}: no benchmark row (known: {', '.join(_BY_TASK)})")
    return b


def find(task: object) -> Benchmark | None:
    """The row of a task or of its `<task>_gold_bpb`, else None."""
    if not isinstance(task, str):
        return None
    b = _BY_TASK.get(task)
    if b is None and task.endswith(GOLD_BPB_SUFFIX):
        b = _BY_TASK.get(task[:-len(GOLD_BPB_SUFFIX)])
        b = b if b is not None and b.gold_bpb else None
    return b


def tasks(*, suite: str | None = None, scoring: str | None = None,
          default: bool | None = None, offline_ready: bool | None = None,
          fewshot_source: bool | None = None, order: str = "paper") -> tuple[str, ...]:
    """The task names of the runnable rows with the given properties (None: any), in the
    paper's table order ('paper') or `make eval`'s ('run': lm-eval before evalplus)."""
    rows = [b for b in BENCHMARKS if b.task
            and (suite is None or b.suite == suite)
            and (scoring is None or b.scoring == scoring)
            and (default is None or b.default == default)
            and (offline_ready is None or b.offline_ready == offline_ready)
            and (fewshot_source is None or b.fewshot_source == fewshot_source)]
    if order == "run":
        rows.sort(key=lambda b: SUITES.index(b.suite or ""))
    elif order != "paper":
        raise ValueError(f"order {order!r}: 'paper' or 'run'")
    return tuple(b.task for b in rows if b.task)


def gold_tasks(names: Iterable[str] | None = None) -> tuple[str, ...]:
    """`<task>_gold_bpb` of the gold-scoring rows among `names` (None: every row), paper
    order."""
    keep = None if names is None else set(names)
    return tuple(b.gold_task for b in BENCHMARKS
                 if b.gold_task and (keep is None or b.task in keep))


def by_group() -> dict[str, list[Benchmark]]:
    """{group: its rows}, in the paper's order."""
    out: dict[str, list[Benchmark]] = {g: [] for g in GROUPS}
    for b in BENCHMARKS:
        out[b.group].append(b)
    return out
