"""`make bench`: training, generation, mapper and evaluation speed beside HF transformers,
x-transformers and lm-eval's `hf` backend; each section is a function in `sections` and a
paragraph of docs/BENCH.md. Contenders run in one process, interleaved rep by rep after
warm-up; a figure is the median with min and max, a ratio the median of paired ratios.
"""
