"""`make bench`: training, generation, mapper and evaluation speed beside HF transformers,
x-transformers and lm-eval's `hf` backend (issue 8); what each section measures is its function
in `sections` and its paragraph in docs/BENCH.md, which `python -m experiments.bench` writes
for the full size (beside its JSON, `$FTBENCH_RESULTS/bench/<timestamp>.json`, otherwise).

Every comparison runs its contenders in one process, interleaved rep by rep (the order rotates
each rep), after warm-up; a figure is the median of the reps with min and max, and a ratio the
median of the per-rep paired ratios, so drift on a shared machine cancels.

Modules: `harness` (sizes, interleaved timing, machine), `contenders` (the models and workloads
compared), `sections` (one function per section), `report` (targets, Markdown), `__main__`
(the CLI). One-off measurements docs/BENCH.md quotes by hand are scripts in dev/bench/.
"""
