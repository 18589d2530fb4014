"""The old home of `experiments.eval.tasks.benchdata` (the pinned offline benchmark files), kept
as a re-export while sweeps/ and the drivers import it from here; new code imports
experiments.eval.tasks.benchdata."""

from experiments.eval.tasks.benchdata import (  # noqa: F401
    ENV_VAR,
    SUMS,
    TASK_SUMS,
    DataCheck,
    DataError,
    data_dir,
    needed_files,
    pinned_checksums,
    require,
    verify,
)
