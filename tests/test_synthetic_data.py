"""The synthetic task's generator (paper §4.1): statistics on a large seeded sample."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from experiments.train.synthetic_data import (
    ALPHABET,
    BODY_LEN,
    LETTERS,
    NOISE_P,
    RUN_LEN,
    SEQ_LEN,
    batches,
    decode,
    encode,
    eval_batch,
    make_example,
    prompt_for,
    stream,
)

N = 20_000


@pytest.fixture(scope="module")
def sample() -> list[tuple[str, dict]]:
    it = stream(1234)
    return [next(it) for _ in range(N)]


def test_constants_match_the_paper() -> None:
    assert (BODY_LEN, RUN_LEN, NOISE_P, SEQ_LEN) == (64, 8, 1 / 16, 66)
    assert LETTERS == "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    assert len(set(ALPHABET)) == len(ALPHABET) == 29


def test_structure_of_every_sequence(sample: list[tuple[str, dict]]) -> None:
    for text, truth in sample:
        assert len(text) == SEQ_LEN
        letter, start = truth["letter"], truth["start"]
        assert text[:2] == prompt_for(letter) == f"{letter}>"  # prompt letter matches the run
        body = text[2:]
        assert 0 <= start <= BODY_LEN - RUN_LEN
        noise = set(truth["noise"])
        assert noise == {i for i, c in enumerate(body) if c == "!"}
        for i, c in enumerate(body):
            if i in noise:
                continue
            # the run is exactly the 8 positions start..start+7 (where not replaced by noise)
            assert c == (letter if start <= i < start + RUN_LEN else "_")


def test_noise_rate_and_uniformity(sample: list[tuple[str, dict]]) -> None:
    n_chars = N * BODY_LEN
    rate = sum(len(t["noise"]) for _, t in sample) / n_chars
    sd = math.sqrt(NOISE_P * (1 - NOISE_P) / n_chars)
    assert abs(rate - 1 / 16) < 5 * sd, rate
    # noise hits every body position at the same rate (the prompt is never noised)
    per_pos = Counter(i for _, t in sample for i in t["noise"])
    assert len(per_pos) == BODY_LEN
    assert max(abs(c / N - NOISE_P) for c in per_pos.values()) < 0.015
    # position and letter uniform: each of the 57 starts and 26 letters near its share
    starts = Counter(t["start"] for _, t in sample)
    assert sorted(starts) == list(range(BODY_LEN - RUN_LEN + 1))
    assert max(abs(c / N - 1 / 57) for c in starts.values()) < 0.006
    letters = Counter(t["letter"] for _, t in sample)
    assert sorted(letters) == list(LETTERS)
    assert max(abs(c / N - 1 / 26) for c in letters.values()) < 0.01


def test_stream_is_seeded_and_eval_is_disjoint() -> None:
    a, b = stream(7), stream(7)
    assert [next(a) for _ in range(50)] == [next(b) for _ in range(50)]
    x1 = next(batches(7, 16))
    x2 = next(batches(7, 16))
    assert x1.shape == (16, SEQ_LEN) and bool((x1 == x2).all())
    assert decode(x1[0].tolist()) == make_example(random.Random(7))[0]
    ev = eval_batch(7, 16)
    assert not bool((ev == x1).all(dim=1).any())
    assert encode(decode(ev[3].tolist())) == ev[3].tolist()
