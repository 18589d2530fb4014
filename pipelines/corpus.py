"""`make corpus` / `python -m pipelines.corpus`: `python -m experiments.corpus` with its
tokenizing units submitted through the one launcher (docs/DATA.md): `--launcher local`, WORKERS
processes of this machine; `slurm`, a job array with the cluster file's `corpus` section. Bad
input (a bad cluster file too, before the scan starts): one line, exit 2, nothing written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common.errors import cli
from experiments.corpus.__main__ import parser
from experiments.corpus.__main__ import run as build_here
from sweeps.launcher import make_launcher


def _main(argv: list[str] | None) -> int:
    ap = parser("python -m pipelines.corpus")
    ap.description = __doc__
    ap.add_argument("--launcher", choices=["local", "slurm"], default="local",
                    help="where the units run: local processes, or a SLURM job array")
    ap.add_argument("--cluster", default=None,
                    help="slurm: the cluster file (sweeps/cluster.example.yaml; default "
                         "FTBENCH_CLUSTER or sweeps/cluster.yaml)")
    a = ap.parse_args(argv)
    # made (and a bad cluster file refused) before the scan starts; the job array's scripts
    # and logs go to <out>/slurm, a name the build's own files never use
    launcher = make_launcher(a.launcher, Path(a.out).expanduser().resolve() / "slurm",
                             jobs=a.workers, cluster_file=a.cluster or None, job_name="corpus")
    return build_here(a, launcher)


def main(argv: list[str] | None = None) -> int:
    return cli("corpus", lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
