"""`python -m experiments.eval.tasks <benchmarks dir> [<out dir>]` (`make tasks BENCH_DATA=...
[OUT=...]`): check the data against its sha256 pins and write the offline lm-eval task YAMLs
(default results/lm_eval_tasks/), for any lm-eval backend: `lm_eval ... --include_path <out>`.
Bad data or an output path that is a file: one line, exit 2, nothing written."""

from __future__ import annotations

import sys

from common.text import one_line
from experiments.eval.tasks import benchdata, default_tasks_dir, write_task_dir


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(argv) <= 2 or argv[0].startswith("-"):
        print("usage: python -m experiments.eval.tasks <benchmarks dir> [<out dir>]",
              file=sys.stderr)
        sys.exit(2)
    try:
        out = write_task_dir(argv[0], argv[1] if len(argv) > 1 else default_tasks_dir())
    except (benchdata.DataError, NotADirectoryError, PermissionError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote the offline lm-eval tasks to {out}: lm_eval ... --include_path {out}")


if __name__ == "__main__":
    main()
