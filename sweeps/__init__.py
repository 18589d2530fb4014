"""Grids over kappa, H, seed and arm, run through submitit (local or SLURM).

    grid.py      parse/validate the make variables, expand arms into cells, shared-settings guard
    plan.py      compose the cells, their eval specs, the dry-run text (submits nothing)
    manifest.py  results/sweeps/<name>/manifest.json: every state transition of a cell, refresh,
                 the status table
    launcher.py  submits: local driver (JOBS at once) and SLURM job arrays; reports outcomes
    job.py       the submitit callable: runs the trainer/evaluator, checkpoint() -> requeue
    backend.py   the only door into experiments/ (config, plan, eval specs, eval chain)
    errors.py    SweepError
    __main__.py  `python -m sweeps run|status|eval-run` behind `make sweep` / `make sweep-status`
"""
