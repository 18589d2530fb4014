"""Tokenizers for training and for reading checkpoints back: `train_bpe` (byte-level BPE,
`<|endoftext|>` id 0 as eos, cached by the corpus' sha256 and the vocabulary size),
`tokenizer_ref` (the checkpoint's self-contained `tokenizer` entry) and `tokenizer_from_ref`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from common.errors import UsageError
from common.io import atomic_write_text, unwritable
from common.paths import cache_dir as default_cache

EOS = "<|endoftext|>"
_CACHE_VERSION = "bpe-v1"  # bump when the training recipe changes, so old caches are not reused


def corpus_checksum(texts: Iterable[str]) -> str:
    """sha256 over the documents, each length-prefixed so boundaries count."""
    from .sources import corpus_checksum_update

    h = hashlib.sha256()
    for t in texts:
        corpus_checksum_update(h, t)
    return h.hexdigest()


def train_bpe(texts: Iterable[str], vocab_size: int, *,
              cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """A byte-level BPE with `<|endoftext|>` as eos (id 0), cached by corpus checksum + size."""
    if not isinstance(vocab_size, int) or vocab_size < 257 + 1:
        # 256 byte symbols + the eos token are always in the vocabulary
        raise ValueError(f"vocab_size={vocab_size!r}: must be an integer >= 258 for byte-level BPE")
    docs = list(texts)
    if not docs:
        raise ValueError("train_bpe: empty corpus")
    key = hashlib.sha256(f"{_CACHE_VERSION}:{vocab_size}:{corpus_checksum(docs)}".encode())
    cache = Path(cache_dir) if cache_dir is not None else default_cache()
    path = cache / "tokenizers" / f"bpe-{vocab_size}-{key.hexdigest()[:16]}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if (why := unwritable(path.parent)) is not None:  # before the training, not a traceback after
        raise UsageError(f"tokenizer cache {path.parent}: {why}; set FTBENCH_CACHE (or "
                         "FTBENCH_RESULTS) to a writable directory")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    atomic_write_text(path, tok.to_str())  # concurrent runs never read half a file
    return tok


class TextTokenizer:
    """What training and evaluation need from a tokenizer."""

    eos_id: int | None
    bos_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def token_bytes(self) -> list[int]:
        """UTF-8 byte length of each token id (0 for special tokens), for bits per byte."""
        raise NotImplementedError


class BPETokenizer(TextTokenizer):
    def __init__(self, tok: Tokenizer, name: str = "bpe") -> None:
        self.tok = tok
        self.name = name
        self.eos_id = tok.token_to_id(EOS)
        self.bos_id = None
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> list[int]:
        special = {t.content for t in self.tok.get_added_tokens_decoder().values()}
        out = []
        for i in range(self.vocab_size):
            s = self.tok.id_to_token(i)
            # byte-level BPE spells each byte as one printable character
            out.append(0 if s is None or s in special else len(s))
        return out


class CharTokenizer(TextTokenizer):
    """One token per character of a fixed alphabet (the synthetic task); no eos."""

    def __init__(self, alphabet: str, name: str = "chars") -> None:
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise ValueError("CharTokenizer: the alphabet must be non-empty, without repeats")
        self.alphabet = alphabet
        self.name = name
        self.index = {c: i for i, c in enumerate(alphabet)}
        self.eos_id = None
        self.bos_id = None
        self.vocab_size = len(alphabet)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the alphabet "
                             f"{self.alphabet!r}") from None

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.alphabet[i] if 0 <= i < len(self.alphabet) else "?" for i in ids)

    def token_bytes(self) -> list[int]:
        return [len(c.encode("utf-8")) for c in self.alphabet]


def tokenizer_ref(tok: Tokenizer | TextTokenizer, name: str) -> dict[str, Any]:
    """The checkpoint's `tokenizer` entry (docs/RESULTS.md); self-contained, JSON-serialisable."""
    if isinstance(tok, CharTokenizer):
        return {"type": "chars", "alphabet": tok.alphabet, "eos_id": None, "bos_id": None,
                "name": name}
    if isinstance(tok, BPETokenizer):
        tok = tok.tok
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"tokenizer_ref: unsupported tokenizer type {type(tok).__name__}")
    js = tok.to_str()
    return {"type": "tokenizers", "json": js, "sha256": hashlib.sha256(js.encode()).hexdigest(),
            "eos_id": tok.token_to_id(EOS), "bos_id": None, "name": name}


def tokenizer_from_ref(ref: dict[str, Any]) -> TextTokenizer:
    """Rebuild the tokenizer a checkpoint was trained with (checks the stored sha256)."""
    if not isinstance(ref, dict) or "type" not in ref:
        raise ValueError("tokenizer_from_ref: expected a dict with 'type', got "
                         f"{type(ref).__name__}")
    if ref["type"] == "chars":
        return CharTokenizer(ref["alphabet"], name=ref.get("name", "chars"))
    if ref["type"] == "tokenizers":
        js = ref["json"]
        sha = hashlib.sha256(js.encode()).hexdigest()
        if ref.get("sha256") not in (None, sha):
            raise ValueError(f"tokenizer_from_ref: sha256 mismatch (stored {ref['sha256'][:12]}, "
                             f"actual {sha[:12]})")
        return BPETokenizer(Tokenizer.from_str(js), name=ref.get("name", "bpe"))
    raise ValueError(f"tokenizer_from_ref: unknown type {ref['type']!r}; allowed: "
                     "['chars', 'tokenizers']")


def tokenizer_sha256(tok: Tokenizer | TextTokenizer) -> str:
    """A stable identity for a tokenizer (what config.yaml records)."""
    if isinstance(tok, CharTokenizer):
        return hashlib.sha256(json.dumps({"chars": tok.alphabet}).encode()).hexdigest()
    return tokenizer_ref(tok, "")["sha256"]
