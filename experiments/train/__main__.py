"""`python -m experiments.train key=value ...`: one training run (either arm)."""

import sys

from .trainer import main

if __name__ == "__main__":
    sys.exit(main())
