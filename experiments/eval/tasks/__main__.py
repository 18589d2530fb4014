"""`python -m experiments.eval.tasks <benchmarks dir> [<out dir>]` (`make tasks BENCH_DATA=...
[OUT=...]`): check the data against its sha256 pins and write the offline lm-eval task YAMLs
(default results/lm_eval_tasks/), for any lm-eval backend: `lm_eval ... --include_path <out>`.
Bad data or an output path that is a file: one line, exit 2, nothing written."""

from __future__ import annotations

import sys

from common.errors import ArgParser, cli
from experiments.eval.tasks import default_tasks_dir, write_task_dir


def _main(argv: list[str] | None) -> int:
    ap = ArgParser(prog="python -m experiments.eval.tasks", description=__doc__)
    ap.add_argument("data", help="the offline benchmarks dir")
    ap.add_argument("out", nargs="?", help="where the YAMLs go (default results/lm_eval_tasks)")
    a = ap.parse_args(argv)
    out = write_task_dir(a.data, a.out or default_tasks_dir())
    print(f"wrote the offline lm-eval tasks to {out}: lm_eval ... --include_path {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("tasks", lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
