"""python -m experiments.corpus --data <name|path.yaml> --out <dir> [--vocab-size N] [--workers N]
[key=value ...]: build a sharded, pre-tokenized corpus with this machine's processes (`make
corpus` runs pipelines/corpus.py: the same through the one launcher). `--data`: a name under
experiments/train/conf/data or a YAML file of the `data` section's keys; `key=value` overrides
them. Bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from common.errors import ArgParser, UsageError, cli, positive_int
from common.io import read_yaml_mapping

from .config import GENERATED_SOURCES

CONF_DATA = Path(__file__).resolve().parents[1] / "train" / "conf" / "data"


def load_data_config(spec: str, overrides: list[str]) -> Any:
    """The DataConfig a name or a YAML path describes, with key=value overrides."""
    from .config import data_config

    p = CONF_DATA / f"{spec}.yaml" if "/" not in spec and not spec.endswith((".yaml", ".yml")) \
        else Path(spec).expanduser()
    if not p.is_file():
        names = sorted(q.stem for q in CONF_DATA.glob("*.yaml")
                       if q.stem not in GENERATED_SOURCES)
        raise UsageError(f"--data {spec!r}: no such file or config (names: {names})")
    d = read_yaml_mapping(p, UsageError, "data keys")
    d.pop("defaults", None)
    for ov in overrides:
        k, sep, v = ov.partition("=")
        if not sep:
            raise UsageError(f"{ov!r}: expected key=value")
        d[k.removeprefix("data.")] = yaml.safe_load(v)
    if d.get("source") in GENERATED_SOURCES:
        raise UsageError(f"data={d['source']} is generated on the fly; it has no corpus to build")
    return data_config(d, str(p))


def parser(prog: str = "python -m experiments.corpus") -> argparse.ArgumentParser:
    """The command line of a corpus build (pipelines.corpus adds the launcher's options)."""
    ap = ArgParser(prog=prog, description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="data config name or YAML path (default "
                    "stdlib; with --verify alone: the built corpus's own, from its manifest)")
    ap.add_argument("--out", required=True, help="output directory (resumed if a build is there)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="BPE vocabulary to train (the paper: 131072); ignored with data.tokenizer")
    ap.add_argument("--workers", type=positive_int, default=max(1, (os.cpu_count() or 1)),
                    help="worker processes (local) or array tasks at once (slurm)")
    ap.add_argument("--verify", action="store_true", help="re-hash every shard against the "
                    "manifest at the end; alone (no --data), verify the corpus built in --out, "
                    "reading what it needs from its manifest")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("overrides", nargs="*", help="data key=value overrides")
    return ap


def run(a: argparse.Namespace, runner: Any = None) -> int:
    """Build the corpus the parsed arguments describe (its units through `runner`, a
    build.UnitRunner, when given) and print its summary; UsageError on bad input."""
    from .build import MANIFEST, build, read_manifest, verify

    if a.verify and a.data is None and not a.overrides:
        # verification needs only the manifest: no data config, no vocabulary
        man = read_manifest(Path(a.out).expanduser())
        if man is None:
            raise UsageError(f"--out {a.out}: no {MANIFEST} to verify (not a built corpus; "
                             "give --data to build it)")
    else:
        dcfg = load_data_config(a.data or "stdlib", a.overrides)
        built = read_manifest(Path(a.out).expanduser())
        if a.vocab_size is None and built is not None:  # a corpus built already says its own
            a.vocab_size = built["request"]["tokenizer"].get("train_vocab_size")
        if dcfg.tokenizer is None and a.vocab_size is None:
            raise UsageError("give --vocab-size N (the paper's presets: 131072) or "
                             "data.tokenizer=<tokenizer.json>")
        man = build(dcfg, a.out, vocab_size=a.vocab_size, workers=a.workers,
                    progress=not a.quiet, runner=runner)
    if a.verify and (bad := verify(Path(a.out).expanduser())):
        raise UsageError(f"{a.out}: {len(bad)} shard(s) differ from the manifest: {bad[0]}")
    return _summary(a.out, man, verified=a.verify)


def _summary(out: str, man: dict[str, Any], verified: bool) -> int:
    t, v = man["tokens"]["train"], man["tokens"]["val"]
    print(f"corpus: {Path(out).expanduser().resolve()}: {man['documents']['train']:,} + "
          f"{man['documents']['val']:,} documents, {t:,} train + {v:,} val tokens "
          f"({man['dtype']}, {len(man['shards']) // 2} units, "
          f"tokenizer {man['tokenizer']['sha256'][:12]}, vocab {man['tokenizer']['vocab_size']})"
          + (f"; {len(man['shards'])} shards verified against the manifest" if verified else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("corpus", lambda: run(parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
