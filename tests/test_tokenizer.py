"""experiments/corpus/tokenizer.py: byte-level BPE, its cache, the checkpoint reference."""

from __future__ import annotations

import hashlib
import json

import pytest

from experiments.corpus.tokenizer import (
    EOS,
    CharTokenizer,
    tokenizer_from_ref,
    tokenizer_ref,
    train_bpe,
)
from experiments.train.synthetic_data import ALPHABET

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i, 'héllo wörld ✓')\n",
] * 40


def test_bpe_vocab_eos_round_trip_and_reference(tmp_path):
    with pytest.raises(ValueError, match=">= 258"):
        train_bpe(TEXTS, 100, cache_dir=tmp_path)
    tok = train_bpe(TEXTS, 300, cache_dir=tmp_path)
    assert tok.get_vocab_size() == 300
    assert tok.token_to_id(EOS) == 0
    t = tokenizer_from_ref(tokenizer_ref(tok, "t"))
    assert (t.eos_id, t.bos_id, t.vocab_size) == (0, None, 300)
    s = "x = 'ünïcode ✓'\n\tif  x:\n" + EOS + "z"
    ids = t.encode(s)
    assert t.decode(ids) == s
    assert ids.count(0) == 1  # the special token is one id, not spelled out
    # bytes per token: eos counts 0, every other token its UTF-8 length
    tb = t.token_bytes()
    assert sum(tb[i] for i in ids) == len(s.encode()) - len(EOS)
    # the checkpoint reference: plain data, its hash checked
    ref = tokenizer_ref(tok, "bpe300-test")
    assert set(ref) == {"type", "json", "sha256", "eos_id", "bos_id", "name"}
    assert ref["type"] == "tokenizers" and ref["name"] == "bpe300-test"
    assert ref["sha256"] == hashlib.sha256(ref["json"].encode()).hexdigest()
    assert (ref["eos_id"], ref["bos_id"]) == (0, None)
    json.dumps(ref)  # plain data: torch.load(weights_only=True) and JSON both take it
    bad = dict(ref, sha256="0" * 64)
    with pytest.raises(ValueError, match="sha256 mismatch"):
        tokenizer_from_ref(bad)
    with pytest.raises(ValueError, match="allowed"):
        tokenizer_from_ref({"type": "sentencepiece"})


def test_bpe_cache_is_keyed_by_corpus_and_size(tmp_path):
    a = train_bpe(TEXTS, 300, cache_dir=tmp_path)
    files = sorted((tmp_path / "tokenizers").glob("*.json"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    b = train_bpe(iter(TEXTS), 300, cache_dir=tmp_path)  # any iterable; loaded, not retrained
    assert b.to_str() == a.to_str()
    assert files[0].stat().st_mtime_ns == mtime
    train_bpe(TEXTS, 280, cache_dir=tmp_path)
    train_bpe(TEXTS + ["one more document"], 300, cache_dir=tmp_path)
    assert len(list((tmp_path / "tokenizers").glob("*.json"))) == 3


def test_char_tokenizer_for_the_synthetic_task():
    tok = CharTokenizer(ALPHABET, name="synthetic")
    ref = tokenizer_ref(tok, "synthetic")
    assert ref["type"] == "chars" and ref["alphabet"] == ALPHABET
    t = tokenizer_from_ref(ref)
    assert t.vocab_size == len(ALPHABET) == 29 and t.eos_id is None
    s = "K>___KKKKKKKK__!_"
    assert t.decode(t.encode(s)) == s
    assert t.encode("_!>A") == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not in the alphabet"):
        t.encode("a")

