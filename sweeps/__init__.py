"""Grids over kappa, H, seed and arm, run through submitit (local or SLURM).

    grid.py      parse/validate the make variables, expand arms into cells, shared-settings guard
    backend.py   the only place that talks to experiments/ (config.compose, plan.run_id/plan)
    job.py       the submitit callable: runs the trainer/evaluator, checkpoint() -> requeue
    launcher.py  plan, dry run, manifest, local driver (JOBS at once) and SLURM job arrays
    manifest.py  results/sweeps/<name>/manifest.json and the status table
    __main__.py  `python -m sweeps run|status` behind `make sweep` / `make sweep-status`
"""
