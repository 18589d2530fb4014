"""Evaluation of checkpoints: lm-eval tasks through our native adapter and EvalPlus code tasks
in a sandbox, offline against pinned benchmark files.

    run.py            `python -m experiments.eval`: specs, result files, resume
    lm_adapter.py     FTBenchLM, lm-eval's model for our checkpoints (Z modes, generation rule)
    tasks/            the stock lm-eval tasks pointed at local files, and the pinned
                      benchmark files and their sha256 sums (tasks/benchdata.py; what each
                      benchmark is: its row in common/benchmarks.py)
    likelihood.py     the honest likelihood bound; probe.py: does the decoder use Z?
    chain.py          a run's chained evaluation (final, kept points, likelihood)

Every evaluator takes the run as a common.paths.RunDir (a path is read as RunDir.at(path)).
    hf_export.py      `python -m experiments.eval.hf_export`: a baseline as LlamaForCausalLM
"""
