"""A corpus against its budget, before anything is built (docs/DATA.md, "Epochs are
explicit"): per hf source, the passes the token budget needs from its known size
(`check_budget`: what `make paper DRY=1` prints and refuses on), and for the shipped corpora an
upper bound of their tokens (`token_bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.errors import UsageError

from .sources import source_label, stdlib_docs, stdlib_root

if TYPE_CHECKING:
    from experiments.corpus.config import DataConfig


@dataclass(frozen=True)
class SourceSize:
    tokens: float
    """Tokens of one pass, as the provenance counts them (its own tokenizer)."""
    documents: int | None
    provenance: str


SOURCE_SIZES: dict[tuple[str, str | None], SourceSize] = {
    ("HuggingFaceFW/fineweb-edu", "default"): SourceSize(
        1.3e12, None, "dataset card, huggingface.co/datasets/HuggingFaceFW/fineweb-edu: 1.3T "
        "tokens (GPT-2 tokenizer)"),
    ("HuggingFaceFW/fineweb-edu", "sample-350BT"): SourceSize(
        350e9, None, "the config's name (dataset card: a 350B GPT-2-token sample)"),
    ("HuggingFaceFW/fineweb-edu", "sample-100BT"): SourceSize(
        100e9, None, "the config's name (dataset card: a 100B GPT-2-token sample)"),
    ("HuggingFaceFW/fineweb-edu", "sample-10BT"): SourceSize(
        10e9, None, "the config's name (dataset card: a 10B GPT-2-token sample)"),
    ("HuggingFaceTB/finemath", "finemath-3plus"): SourceSize(
        34e9, 21_400_000, "dataset card, huggingface.co/datasets/HuggingFaceTB/finemath: "
        "FineMath-3+ 34B tokens, 21.4M documents"),
    ("HuggingFaceTB/finemath", "finemath-4plus"): SourceSize(
        9.6e9, 6_700_000, "dataset card, huggingface.co/datasets/HuggingFaceTB/finemath: "
        "FineMath-4+ 9.6B tokens, 6.7M documents"),
    ("bigcode/starcoderdata", None): SourceSize(
        250e9, None, "dataset card, huggingface.co/datasets/bigcode/starcoderdata: 783 GB of "
        "code in 86 languages with GitHub issues, Jupyter notebooks and commits, about 250B "
        "tokens"),
}
"""Known sizes of the sources the shipped recipes name, keyed by (path, config name). A source
not here has an unknown size: the plan says so, and its `passes` cap (default 1) stops the build
naming it if it runs out."""

MAX_PASSES = 4
"""The most passes the plan accepts over one source: Muennighoff et al. 2023, "Scaling
Data-Constrained Language Models" (arXiv 2305.16264), find up to about 4 epochs of repeated data
train about as well as unique data, and returns fall quickly beyond."""


@dataclass(frozen=True)
class SourcePlan:
    label: str
    share: float
    tokens: float
    """The tokens this source must give to the stream (its share of it)."""
    size: SourceSize | None
    passes: float | None
    """tokens / size.tokens; None when the size is unknown."""
    allowed: int
    """data.hf_sources[].passes: the most the stream may make."""


def stream_tokens(train_tokens: float, val_fraction: float) -> float:
    """Tokens the stream must hold so that its training split (1 - val_fraction of it, by the
    documents' hashes) holds `train_tokens`."""
    return train_tokens / (1.0 - val_fraction)


def plan_sources(dcfg: DataConfig, train_tokens: float) -> list[SourcePlan]:
    """Per hf source: its share of the stream's bytes (its weight), the tokens it gives when the
    training split holds `train_tokens`, and the passes over it that takes."""
    total = stream_tokens(train_tokens, dcfg.val_fraction)
    wsum = sum(s.weight for s in dcfg.hf_sources)
    out = []
    for s in dcfg.hf_sources:
        share = s.weight / wsum
        size = SOURCE_SIZES.get((s.path, s.name))
        need = share * total
        out.append(SourcePlan(source_label(s), share, need, size,
                              need / size.tokens if size else None, s.passes))
    return out


def passes_for(dcfg: DataConfig, train_tokens: float) -> list[int]:
    """Per hf source, the `passes` cap its planned passes need (at least 1): what a recipe
    writes into data.hf_sources[].passes."""
    return [max(1, math.ceil(p.passes - 1e-9)) if p.passes is not None else 1
            for p in plan_sources(dcfg, train_tokens)]


@dataclass(frozen=True)
class BudgetCheck:
    lines: list[str]
    refusal: str | None


def _t(x: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.0f}"


def check_budget(dcfg: DataConfig, train_tokens: float, *,
                 bytes_per_token: float | None = None) -> BudgetCheck:
    """The corpus of `dcfg` against `train_tokens` (the most any cell of the sweep trains on).
    hf mixture: one line per source (share, tokens, known size, passes) and the byte cap; a
    refusal (one line) when a source needs more passes than its cap or MAX_PASSES, or the byte
    cap streams too little. stdlib and text files: `token_bound` against the budget."""
    lines: list[str] = []
    if dcfg.source == "hf":
        total = stream_tokens(train_tokens, dcfg.val_fraction)
        lines.append(f"corpus budget: {_t(train_tokens)} training tokens (the costliest cell) "
                     f"= {_t(total)} streamed at val_fraction {dcfg.val_fraction:g}; per "
                     "source (its weight is its share of the text):")
        refusal = None
        for p in plan_sources(dcfg, train_tokens):
            if p.passes is None:
                lines.append(f"  {p.label}: {p.share:.1%} = {_t(p.tokens)} tokens; size unknown "
                             f"(not in experiments/corpus/budget.py SOURCE_SIZES): at most "
                             f"{p.allowed} pass(es), the build stops naming it if it runs out")
                continue
            lines.append(f"  {p.label}: {p.share:.1%} = {_t(p.tokens)} tokens of "
                         f"{_t(p.size.tokens)} ({p.size.provenance}) = {p.passes:.2f} passes"
                         f" (allowed {p.allowed})"
                         + ("; repeats" if p.passes > 1 else ""))
            if refusal is None and p.passes > MAX_PASSES:
                refusal = (f"corpus: {p.label} is too small for its {p.share:.1%} share: "
                           f"{_t(p.tokens)} tokens = {p.passes:.2f} passes over its "
                           f"{_t(p.size.tokens)}, more than MAX_PASSES={MAX_PASSES} (repeated "
                           "data loses its value beyond, arXiv 2305.16264); lower its weight "
                           "or add a larger source")
            elif refusal is None and p.passes > p.allowed:
                refusal = (f"corpus: {p.label} needs {p.passes:.2f} passes for its "
                           f"{p.share:.1%} share but data.hf_sources[].passes={p.allowed}; "
                           f"give it passes: {math.ceil(p.passes)} or lower its weight")
        if dcfg.hf_max_bytes is None:
            lines.append("  data.hf_max_bytes=null: the stream ends when the first source "
                         "finishes its passes")
        elif bytes_per_token:
            have = dcfg.hf_max_bytes / bytes_per_token
            lines.append(f"  data.hf_max_bytes={dcfg.hf_max_bytes:,} = {_t(have)} tokens at "
                         f"{bytes_per_token:g} bytes per token; {have / total:.3f} of the "
                         "stream the budget needs")
            if refusal is None and have < total * (1 - 1e-9):
                refusal = (f"corpus: data.hf_max_bytes={dcfg.hf_max_bytes:,} streams about "
                           f"{_t(have)} tokens at {bytes_per_token:g} bytes per token; the "
                           f"budget needs {_t(total)} ({_t(train_tokens)} training tokens at "
                           f"val_fraction {dcfg.val_fraction:g}); raise data.hf_max_bytes to "
                           f"{math.ceil(total * bytes_per_token):,}")
        return BudgetCheck(lines, refusal)
    bound = token_bound(dcfg)
    if bound is None:
        return BudgetCheck([f"corpus budget: {_t(train_tokens)} training tokens; the "
                            f"{dcfg.source} corpus's size is known once built"], None)
    tokens, text_bytes, how = bound
    lines.append(f"corpus budget: {_t(train_tokens)} training tokens; the {dcfg.source} corpus "
                 f"holds at most {tokens:,} ({how})")
    if train_tokens > dcfg.max_epochs * tokens:
        return BudgetCheck(lines, (
            f"train.tokens asks for {train_tokens:,.0f} tokens = at least "
            f"{train_tokens / tokens:.3g} passes over the {dcfg.source} corpus (at most "
            f"{tokens:,} training tokens: {how}); data.max_epochs={dcfg.max_epochs:g}: use a "
            "larger corpus (data.corpus, make corpus), fewer tokens, or raise data.max_epochs"))
    return BudgetCheck(lines, None)


# ---------------------------------------------------------------- the shipped corpora's size
def token_bound(dcfg: DataConfig) -> tuple[int, int, str] | None:
    """(an upper bound of the training tokens, the text's bytes, how it is known) of a stdlib
    or text-file corpus (None for parquet, hf, synthetic): a byte-level BPE token covers at
    least one byte, each document adds one eos."""
    if dcfg.source == "stdlib":  # the files read as the build reads them, about a second
        texts = [t for _, t in stdlib_docs(dcfg.max_bytes)]
        nbytes, docs = sum(len(t.encode("utf-8")) for t in texts), sum(1 for t in texts if t)
        return nbytes + docs, nbytes, (f"{nbytes:,} bytes in {docs:,} files of "
                                       f"{stdlib_root()}: at most a token per byte, plus eos")
    if dcfg.source == "files" and dcfg.max_bytes is None:
        from .sources import expand_globs

        try:
            paths = expand_globs(dcfg.paths)
        except UsageError:
            return None
        if any(p.suffix == ".parquet" for p in paths):
            return None  # compressed: its text is larger than the file
        # .txt: a document per file; .jsonl, .json: the file holds at least its text (JSON adds
        # quotes and escapes) and each non-empty document at least a byte, so eos at most
        # doubles it
        nbytes = sum(p.stat().st_size for p in paths)
        txt = sum(1 for p in paths if p.suffix not in (".jsonl", ".json"))
        json_bytes = sum(p.stat().st_size for p in paths if p.suffix in (".jsonl", ".json"))
        return nbytes + txt + json_bytes, nbytes, (f"{nbytes:,} bytes in {len(paths):,} "
                                                   "files: at most a token per byte, plus eos")
    return None


def bound_refusal(dcfg: DataConfig, samples_asked: int, seq_len: int) -> tuple[str, str | None]:
    """The dry run's epochs line for a corpus not built yet, and the refusal (one line) when
    even the upper bound of its tokens gives more passes than data.max_epochs."""
    b = token_bound(dcfg)
    if b is None:
        return ("epochs      unknown until the corpus is built (make corpus, or the run's "
                "start); checked then against data.max_epochs"), None
    tokens, _, how = b
    n = max(1, (tokens - 1) // seq_len)
    ep = samples_asked / n
    line = (f"epochs      at least {ep:.4g} passes over the corpus (not built yet; at most "
            f"{tokens:,} training tokens: {how}); data.max_epochs={dcfg.max_epochs:g}")
    if ep > dcfg.max_epochs + 1e-9:
        return line, (f"train.tokens asks for {samples_asked * seq_len:,} tokens = at least "
                      f"{ep:.3g} passes over the {dcfg.source} corpus (at most {tokens:,} "
                      f"training tokens: {how}); data.max_epochs={dcfg.max_epochs:g}: use a "
                      "larger corpus, fewer tokens, or raise data.max_epochs")
    return line, None


def manifest_lines(man: dict[str, Any]) -> list[str]:
    """A built hf corpus's per-source passes, as its manifest records them."""
    out = []
    for m in man.get("source", {}).get("mixture") or []:
        label = m["path"] + (f" ({m['name']})" if m.get("name") else "")
        passes = f"{m['passes']:.2f} passes" if m.get("passes") is not None else m["passes_note"]
        out.append(f"  {label}: {m['documents']:,} documents, {m['bytes']:,} bytes, {passes} "
                   f"(allowed {m['passes_allowed']})")
    return out
