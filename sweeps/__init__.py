"""Grids over kappa, H, seed and arm, run through the one launcher interface (local or SLURM).

    api.py       the typed front door: SweepRequest -> plan / dry_run / run / status, returning
                 the typed manifest; `python -m sweeps` and every pipeline go through it
    grid.py      the typed grid (SweepSpec): make's text parsed once, each arm's cells
                 (common.arms), the shared-settings guard
    plan.py      compose the cells, their eval specs, the dry-run text (submits nothing)
    manifest.py  results/sweeps/<name>/manifest.json (its schema, every state transition a
                 method: common.records.Manifest): build, lock, save, refresh from facts, the
                 status table
    driver.py    drives a plan's cells through a launcher: local slots (JOBS at once) or one
                 SLURM job array; typed events as jobs start and end
    launcher.py  the one launcher interface (LocalLauncher, SlurmLauncher): every job the suite
                 submits, and the one translation of the cluster schema to submitit's parameters
    cluster.py   the cluster schema (sweeps/cluster.yaml): main settings, eval and corpus sections
    job.py       the submitit callable: runs the trainer/evaluator, checkpoint() -> requeue
    backend.py   the only door into experiments/ (config, plan, eval specs, eval chain)
    recipe.py    the paper's setups as data files (recipes/): experiments of the training config
    __main__.py  `python -m sweeps run|status|eval-run` behind `make sweep` / `make sweep-status`
"""
