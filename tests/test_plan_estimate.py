"""The dry run's plan before a GPU-hour is spent: the paper's implied MFU, token counts with
suffixes, and `--help` generated from the dataclasses (the parallelism, memory and wall-time
lines at the paper's shapes: tests/test_plan_cluster.py)."""

from __future__ import annotations

import dataclasses

import pytest

import experiments.train.trainer as T
from common.errors import UsageError
from experiments.train.config import GROUPS, compose, config_help
from experiments.train.plan import paper_implied_mfu


def test_the_papers_15b_run_implies_about_31_percent_mfu_and_tokens_round_up_to_steps(
        tmp_path, capsys):
    r = paper_implied_mfu()
    assert r["mfu_6n"] == pytest.approx(0.31, abs=0.015)
    assert r["mfu"] > r["mfu_6n"]  # attention over a 4096-token context adds FLOPs
    # (the CPU rate measured here: tests/test_train.py's dry run)
    assert T.main(["model=1M", "train.seq_len=32", "train.batch_size=4", "train.tokens=20k",
                   f"paths.results={tmp_path}", "train.dry_run=true",
                   "train.cpu_tokens_per_s=1000"]) == 0
    assert "tokens      20,096 = 157 steps x 128 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("text,value", [("20k", 20_000), ("2M", 2_000_000), ("1e6", 1e6),
                                        ("1.5G", 1.5e9), ("2_000", 2000), ("5e6", 5e6)])
def test_token_counts_take_the_same_suffixes_as_sweeps(text, value):
    assert compose([f"train.tokens={text}"]).train.tokens == value
    assert compose([f"train.flops={text}"]).train.flops == value


@pytest.mark.parametrize("text", ["20x", "-5k", "0", "k", "nan"])
def test_a_bad_token_count_is_one_line(text):
    with pytest.raises(UsageError, match=r"train\.tokens=.* (is not a positive number|> 0)"):
        compose([f"train.tokens={text}"])


def test_help_lists_every_key_with_its_default_and_docstring(capsys):
    assert T.main(["--help"]) == 0
    out = capsys.readouterr().out
    text = config_help()
    for section, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            assert f"  {section}.{f.name} [" in text, f"{section}.{f.name}"
    assert "train.tokens [2000000]" in text
    assert "Budget in training tokens" in text.split("train.tokens [2000000]")[1][:200]
    assert "model.latent_bits [0]\n      H: 0 is the baseline decoder" in text
    assert "logging.keep_eval_checkpoints [0]" in out and "train.parallel ['auto']" in out


@pytest.mark.slow  # two interpreters through a pipe; the help text itself: the test above
def test_help_starts_with_the_keys_and_ends_quietly_into_a_closed_pipe():
    import subprocess
    import sys

    cmd = f"{sys.executable} -m experiments.train --help"
    r = subprocess.run(f"{cmd} | head -2", shell=True, capture_output=True, text=True,
                       timeout=120, check=False)
    usage, first = r.stdout.splitlines()
    assert usage.startswith("usage: make train") and first.startswith("Model presets:")
    # a reader that leaves before the first line (`true`): no BrokenPipeError traceback
    r = subprocess.run(f"{cmd} | true", shell=True, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0 and r.stderr == "", r.stderr
