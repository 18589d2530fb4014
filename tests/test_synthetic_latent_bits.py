"""Issue 38: kappa >= H makes the free-bits penalty identically zero (KL <= H bits per token),
so an arm whose kappa reaches the run's H gets a larger H where the setting (or
--high-latent-bits) says so: the gpu setting trains its 8-bit arm at H = 16."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import UsageError
from experiments.synthetic import (
    PRESETS,
    check,
    no_penalty_arms,
    parse_args,
)


@pytest.fixture(autouse=True)
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))


def arms(argv: list[str]) -> list[tuple[int, float | None]]:
    return check(parse_args(argv), compose_arms=False)


@pytest.mark.parametrize("argv,high,no_penalty", [
    (["--setting", "gpu"], 16, []),  # the gpu setting: the 8-bit arm at H = 16
    ([], 8, ["kappa=8"]),  # the cpu setting keeps H = 8 and names the arm without penalty
    (["--high-latent-bits", "16"], 16, []),
    (["--setting", "gpu", "--high-latent-bits", "0"], 8, ["kappa=8"]),
])
def test_the_arm_at_kappa_8_gets_the_high_h_where_set(argv: list[str], high: int,
                                                      no_penalty: list[str]) -> None:
    a = arms(argv)
    assert a == [(0, None), (8, 1 / 64), (8, 1 / 8), (8, 1.0), (high, 8.0)]
    assert no_penalty_arms(a) == no_penalty and PRESETS["gpu"].high_latent_bits == 16


@pytest.mark.parametrize("argv", [["--high-latent-bits", "8"],
                                  ["--high-latent-bits", "12", "--kappa", "1 8 12"],
                                  ["--setting", "gpu", "--kappa", "16"]])
def test_a_high_h_that_leaves_the_penalty_zero_is_refused(argv: list[str]) -> None:
    with pytest.raises(UsageError, match="--high-latent-bits"):
        arms(argv)


def test_models_are_measured_on_the_gpu_when_there_is_one(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    import torch

    from experiments.synthetic import measure_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measure_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert measure_device() == "cuda"
