"""Evaluation of checkpoints: lm-eval tasks through our native adapter and EvalPlus code tasks
in a sandbox, offline against pinned benchmark files.

    run.py            `python -m experiments.eval`: specs, result files, resume (was eval.py)
    lm_adapter.py     FTBenchLM, lm-eval's model for our checkpoints (Z modes, generation rule)
    tasks/            the stock lm-eval tasks pointed at local files
    benchdata.py      the pinned benchmark files and their sha256 sums
    hf_export.py      `python -m experiments.eval.hf_export`: a baseline as LlamaForCausalLM
"""
