"""The data section of the config (`data.*`), the one `Choice` base every config choice uses
and the checks every section's `__post_init__` runs. It lives with the corpus builder;
experiments/train/config.py composes and re-exports it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Choice(str, Enum):
    """A config choice: compares, prints and serialises as its plain string value (OmegaConf
    lists the members as the allowed values)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last: list[Any]) -> str:
        return name  # Choice("X", "a b"): members valued by their names


DataSource = Choice("DataSource", "stdlib files hf synthetic random", module=__name__)


DATA_SOURCES = tuple(DataSource)
GENERATED_SOURCES = (DataSource.synthetic, DataSource.random)
"""Sources drawn on the fly from a seeded stream (no corpus on disk, no tokenizer, no passes).
`random`: uniform tokens (what `make gpu-check RECIPE=..` trains on)."""


def check_choice(obj: Any, name: str, allowed: tuple[str, ...], section: str) -> None:
    """ValueError naming `<section>.<name>` and the allowed values unless the field is one."""
    v = getattr(obj, name)
    if v not in allowed:
        raise ValueError(f"{section}.{name}={v!r}: allowed values "
                         f"{[str(a) for a in allowed]}")


def check_positive(obj: Any, *names: str, section: str, allow_zero: bool = False,
                   allow_none: bool = False) -> None:
    """ValueError naming `<section>.<name>` unless each field is a finite number > 0 (>= 0
    with allow_zero; None passes with allow_none)."""
    for name in names:
        v = getattr(obj, name)
        if v is None and allow_none:
            continue
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
            v >= 0 if allow_zero else v > 0)
        if not ok:
            raise ValueError(f"{section}.{name}={v!r}: must be a finite number "
                             f"{'>= 0' if allow_zero else '> 0'}")


@dataclass
class HFSource:
    path: str = ""
    """`datasets.load_dataset` path: a hub name ("HuggingFaceFW/fineweb-edu") or a builder
    ("json", "text", "parquet") with `data_files`."""
    name: str | None = None
    """Dataset config name (e.g. "sample-10BT")."""
    split: str = "train"
    field: str = "text"
    """Column holding the document text."""
    weight: float = 1.0
    """Relative weight in the mixture: its share of the streamed text's bytes."""
    data_files: list[str] | None = None
    passes: int = 1
    """The most passes the stream may make over this source. A source that must repeat to fill
    its share says so here (a recipe writes what experiments.corpus.budget plans from the
    source's known size); one that runs out after its passes stops the build naming it."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("data.hf_sources[].path is required (a hub name or a builder)")
        check_positive(self, "weight", section="data.hf_sources[]")
        if not isinstance(self.passes, int) or isinstance(self.passes, bool) or self.passes < 1:
            raise ValueError(f"data.hf_sources[].passes={self.passes!r}: must be an integer "
                             ">= 1 (the most passes over this source)")


@dataclass
class DataConfig:
    source: DataSource = DataSource.stdlib
    """stdlib (offline default: this interpreter's standard-library .py files) | files | hf |
    synthetic (the paper's §4.1 sequences, character-level)."""
    paths: list[str] = field(default_factory=list)
    """files: glob patterns of .txt / .jsonl / .json files (jsonl: one JSON object per line)."""
    text_field: str = "text"
    """files: the JSONL field holding a document."""
    hf_sources: list[HFSource] = field(default_factory=list)
    """hf: the mixture, each entry streamed with `datasets.load_dataset(..., streaming=True)`."""
    hf_max_bytes: int | None = 200_000_000
    """hf: stop streaming after this many bytes of text; null: the whole stream (the first
    source of a mixture to finish its passes ends it). A run may still read it only
    data.max_epochs times."""
    max_bytes: int | None = None
    """Cap on the corpus (documents in a fixed order until the cap); None = everything."""
    val_fraction: float = 0.05
    """Share of documents held out for validation, chosen by a hash of each document's key."""
    val_tokens: int = 65_536
    """Size of the fixed validation set in tokens (first chunks of the held-out stream)."""
    corpus: str | None = None
    """A corpus directory built by `make corpus` (python -m experiments.corpus): training opens
    its shards and tokenizer, and the other keys of this section are not read. null: the
    section's corpus is built under paths.cache on first use (one builder; other ranks wait)."""
    tokenizer: str | None = None
    """A tokenizers JSON file (with <|endoftext|>) used instead of training a BPE; model.vocab_size
    must equal its size."""
    tokenizer_sample_bytes: int = 1_000_000_000
    """The BPE is trained on the training documents of lowest sample hash up to this many bytes
    (every training document, in order, when the corpus is smaller)."""
    shard_bytes: int = 64_000_000
    """Text per shard (a unit of parallel, resumable work; the token stream does not depend on
    it)."""
    max_epochs: float = 1.0
    """Passes over the training corpus a run may make; a run asking for more is refused at plan
    time, naming the corpus size and the tokens asked."""

    def __post_init__(self) -> None:
        check_choice(self, "source", DATA_SOURCES, "data")
        check_positive(self, "hf_max_bytes", section="data", allow_none=True)
        check_positive(self, "val_tokens", "tokenizer_sample_bytes", "shard_bytes",
                       "max_epochs", section="data")
        check_positive(self, "max_bytes", section="data", allow_none=True)
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction!r}: must be in (0, 1)")
        if self.source == "files" and not self.paths:
            raise ValueError("data=files needs data.paths=[glob,...] (text, jsonl or json files)")
        if self.source == "hf" and not self.hf_sources:
            raise ValueError("data=hf needs data.hf_sources=[{path:...,field:text,weight:1},...]")


def data_config(d: dict[str, Any], where: str) -> DataConfig:
    """The DataConfig of a mapping of data keys, checked as the training config is (OmegaConf
    against the schema, then `__post_init__`); UsageError naming `where` and the problem."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from common.errors import UsageError

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), d))
    except (OmegaConfBaseException, ValueError) as e:  # e.g. "Key 'sourc' not in 'DataConfig'"
        raise UsageError(f"{where}: {str(e).splitlines()[0]}") from None
