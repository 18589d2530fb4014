"""`make lm-eval CKPT=... ARGS="--tasks arc_easy --limit 20"`: lm-eval's own CLI with our model
registered as `ftbench`. Our flags, taken out first: `--ckpt <run dir|.pt>` (adds `--model
ftbench --model_args checkpoint=<ckpt>`, merged with any given) and `--data <benchmarks dir>`
(checks the pins, writes the offline task YAMLs and adds `--include_path`). `--device`
defaults to cuda when torch sees a GPU. Bad input: one line, exit 2.
"""

from __future__ import annotations

import sys

from common.errors import ArgParser, UsageError, cli
from experiments.eval.run import checkpoint_of, resolve_device
from model.checkpoint import CheckpointError


def build_argv(argv: list[str]) -> list[str]:
    """Our flags resolved into the lm-eval argv (UsageError on bad input, before anything
    loads). lm-eval's --model, --model_args and --device are parsed here too (argparse, no
    abbreviations), to be merged with --ckpt and resolved."""
    ours = ArgParser(add_help=False, allow_abbrev=False)
    for flag in ("--ckpt", "--data", "--model", "--model_args", "--device"):
        ours.add_argument(flag)
    a, rest = ours.parse_known_args(argv)
    rest = [x for x in rest if x != "run"]
    if a.ckpt:
        ck = checkpoint_of(a.ckpt)
        if "," in str(ck):
            raise UsageError(f"--ckpt {ck}: a path with a comma cannot go into --model_args")
        rest += ["--model", "ftbench", "--model_args",
                 f"checkpoint={ck}" + (f",{a.model_args}" if a.model_args else "")]
    else:  # lm-eval's own model: its flags go through as given
        rest += [*(["--model", a.model] if a.model else []),
                 *(["--model_args", a.model_args] if a.model_args else [])]
    if a.data:
        from experiments.eval.tasks import default_tasks_dir, write_task_dir

        rest += ["--include_path", str(write_task_dir(a.data, default_tasks_dir()))]
    return ["run", *rest, "--device", resolve_device(a.device)]


def _main(argv: list[str]) -> int:
    import experiments.eval.lm_adapter  # noqa: F401 - registers `ftbench` with lm-eval

    args = build_argv(argv)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *args]
    try:
        cli_evaluate()
    except CheckpointError as e:  # raised while lm-eval builds the model: nothing written yet
        raise UsageError(str(e)) from None
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("lm-eval", lambda: _main(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
