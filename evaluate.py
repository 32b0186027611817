"""`python evaluate.py` in a checkout: the evaluation command is vit/evaluate.py's (`python -m
vit.evaluate`, or `vit-evaluate` once the package is installed); this file keeps the
repository's command working as it did."""

import sys

from vit.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
