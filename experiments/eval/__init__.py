"""Evaluation of checkpoints: lm-eval tasks through our native adapter (lm_adapter.py) and
EvalPlus code tasks in a sandbox, offline against pinned benchmark files (tasks/); run.py is
`python -m experiments.eval`, chain.py a run's chained evaluation. Every evaluator takes the
run as a common.paths.RunDir (a path is read as RunDir.at(path)).
"""
