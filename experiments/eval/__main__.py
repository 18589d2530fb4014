"""`python -m experiments.eval <run dir or checkpoint> [options]` (see experiments/eval/run.py)."""

import sys

from experiments.eval.run import main

if __name__ == "__main__":
    sys.exit(main())
