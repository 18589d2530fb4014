"""`make lm-eval CKPT=... ARGS="--tasks arc_easy --limit 20"`: lm-eval's own CLI
(`lm_eval.__main__.cli_evaluate`, every `lm_eval run` flag) with our model registered as
`ftbench`, so lm-eval's outputs, tables and tools apply unchanged.

Our flags, taken out before lm-eval sees the rest:
- `--ckpt <run dir|.pt>`: adds `--model ftbench --model_args checkpoint=<ckpt>` (merged with any
  `--model_args` given, e.g. `z=prior-k,k=4`);
- `--data <benchmarks dir>`: checks the files against their sha256 pins, writes the offline task
  YAMLs (`python -m experiments.eval.tasks`, default results/lm_eval_tasks/) and adds
  `--include_path` to them, so the stock task names read the local files.
`--device` defaults to cuda when torch sees a GPU, else cpu; a device this machine lacks is
named as such (one line, exit 2) instead of surfacing as a checkpoint that will not load. A
missing or corrupt checkpoint, bad data or a bad device: one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys

from common.text import one_line
from experiments.eval.run import EvalArgsError, resolve_device
from experiments.eval.tasks import benchdata
from model.checkpoint import CheckpointError


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `name` in argv (`--x v` or `--x=v`), else None."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _drop(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a == name:
            skip = i + 1 < len(argv)
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def build_argv(argv: list[str]) -> list[str]:
    """Our flags resolved into the lm-eval argv (EvalArgsError / DataError / FileNotFoundError
    on bad input, before anything loads)."""
    from common.paths import RunDir

    ours = argparse.ArgumentParser(add_help=False)
    ours.add_argument("--ckpt")
    ours.add_argument("--data")
    a, rest = ours.parse_known_args(argv)
    rest = [x for x in rest if x != "run"]
    if a.ckpt:
        ck = RunDir.at(a.ckpt).checkpoint()  # FileNotFoundError: one line
        if "," in str(ck):
            raise EvalArgsError(f"--ckpt {ck}: a path with a comma cannot go into --model_args")
        given = _flag(rest, "--model_args")
        rest = _drop(_drop(rest, "--model_args"), "--model")
        rest += ["--model", "ftbench", "--model_args",
                 f"checkpoint={ck}" + (f",{given}" if given else "")]
    if a.data:
        from experiments.eval.tasks import default_tasks_dir, write_task_dir

        rest += ["--include_path", str(write_task_dir(a.data, default_tasks_dir()))]
    device = resolve_device(_flag(rest, "--device"))
    return ["run", *_drop(rest, "--device"), "--device", device]


def main(argv: list[str] | None = None) -> None:
    import experiments.eval.lm_adapter  # noqa: F401 - registers `ftbench` with lm-eval

    try:
        args = build_argv(list(sys.argv[1:] if argv is None else argv))
    except (EvalArgsError, benchdata.DataError, FileNotFoundError) as e:
        _die(e)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *args]
    try:
        cli_evaluate()
    except CheckpointError as e:  # raised while lm-eval builds the model: nothing written yet
        _die(e)


def _die(e: Exception) -> None:
    print(f"error: {one_line(e)}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
