"""Corpora at scale: source -> tokenizer -> memory-mapped token shards, built once
(`python -m experiments.corpus`, `make corpus`); training reads one with data.corpus=<dir>.
Nothing here imports torch: build workers start fast.
"""
