"""Corpora at scale: source -> tokenizer -> memory-mapped token shards, built once.

    config.py     the data section (DataConfig, HFSource): what a corpus is made of
    sources.py    documents from the stdlib, local files (txt/jsonl/json/parquet), HF datasets
    tokenizer.py  byte-level BPE and the character tokenizer, and the checkpoint's reference
    build.py      the build: scan, tokenizer, parallel resumable units, the manifest (corpus.json)
    shards.py     reading it: memory-mapped shards as one stream, the seeded order
    python -m experiments.corpus (make corpus) builds one; training reads it (data.corpus=<dir>)

Nothing here imports torch: build workers start fast.
"""
