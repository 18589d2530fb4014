"""The paper's synthetic sequences (§4.1), from a seeded stream (never stored): 64 underscores
with an upper-case letter repeated 8 times at a random position, each character replaced by '!'
with probability 1/16, the prompt "<letter>>" prepended (66 characters). Training and
evaluation use different seeds (`TRAIN_SEED_OFFSET`, `EVAL_SEED_OFFSET`).
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator

import torch

BODY_LEN = 64
RUN_LEN = 8
NOISE_P = 1.0 / 16.0
LETTERS = string.ascii_uppercase
ALPHABET = "_!>" + LETTERS  # every character a sequence can hold; index = token id
PROMPT_LEN = 2
SEQ_LEN = PROMPT_LEN + BODY_LEN
TRAIN_SEED_OFFSET = 0
EVAL_SEED_OFFSET = 1_000_003


def make_example(rng: random.Random) -> tuple[str, dict]:
    """One sequence and its ground truth: letter, run start, noise positions."""
    letter = rng.choice(LETTERS)
    start = rng.randrange(BODY_LEN - RUN_LEN + 1)
    body = ["_"] * BODY_LEN
    body[start:start + RUN_LEN] = [letter] * RUN_LEN
    noise = [i for i in range(BODY_LEN) if rng.random() < NOISE_P]
    for i in noise:
        body[i] = "!"
    return f"{letter}>" + "".join(body), {"letter": letter, "start": start, "noise": noise}


def prompt_for(letter: str) -> str:
    """The prompt the paper prepends: "<letter>>"."""
    if letter not in LETTERS:
        raise ValueError(f"prompt letter must be one of {LETTERS!r}, got {letter!r}")
    return f"{letter}>"


def encode(text: str) -> list[int]:
    return [ALPHABET.index(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(ALPHABET[i] if 0 <= i < len(ALPHABET) else "?" for i in ids)


def stream(seed: int) -> Iterator[tuple[str, dict]]:
    """An endless, reproducible stream of (sequence, truth) pairs."""
    rng = random.Random(seed)
    while True:
        yield make_example(rng)


def batches(seed: int, batch_size: int) -> Iterator[torch.Tensor]:
    """Endless (batch_size, SEQ_LEN) LongTensors of token ids from `stream(seed)`."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    it = stream(seed)
    while True:
        yield torch.tensor([encode(next(it)[0]) for _ in range(batch_size)], dtype=torch.long)


def eval_batch(seed: int, n: int) -> torch.Tensor:
    """n held-out sequences (n, SEQ_LEN), from a stream disjoint in seed from training."""
    return next(batches(seed + EVAL_SEED_OFFSET, n))
