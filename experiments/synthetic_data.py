"""The paper's synthetic sequences (§4.1), from a seeded stream (never stored).

A sequence is 64 underscores with an upper-case letter repeated 8 times at a uniformly random
position; every character of those 64 is then replaced by '!' with probability 1/16; the prompt
"<letter>>" is prepended. Total length 66 characters.
"""

from __future__ import annotations

import random
import string

BODY_LEN = 64
RUN_LEN = 8
NOISE_P = 1.0 / 16.0
LETTERS = string.ascii_uppercase
ALPHABET = "_!>" + LETTERS  # every character a sequence can hold; index = token id
SEQ_LEN = 2 + BODY_LEN


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


def encode(text: str) -> list[int]:
    return [ALPHABET.index(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(ALPHABET[i] if 0 <= i < len(ALPHABET) else "?" for i in ids)
