"""`python train.py` in a checkout: the training command is vit/train.py's (`python -m
vit.train`, or `vit-train` once the package is installed); this file keeps the repository's
command, `torchrun ... train.py` and scripts/train.sh working as they did."""

import sys

from vit.train import main

if __name__ == "__main__":
    sys.exit(main())
