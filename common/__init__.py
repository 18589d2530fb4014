"""Conventions shared by every package, each written once: where results live and the typed
directories that spell their layout (`paths`: RunDir, SweepDir), the typed record of every
result file and the one EvalSpec (`records`), the arms a sweep trains (`arms`), the benchmarks
(`benchmarks`), how files are written and locked and whether a place can be written (`io`),
what a result file records about its origin (`provenance`), how kappa is read and labelled
(`kappa`), and the one line an error message becomes (`text`). Depends on nothing but the
standard library (PyYAML is imported only when a run record is read or written)."""
