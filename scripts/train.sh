#!/usr/bin/env bash
# Train the default CIFAR-10 recipe in ./.venv, creating it if needed.
#   bash scripts/train.sh                                  # downloads CIFAR-10 into ./data
#   DATA=../shared/data/cifar10-jpg bash scripts/train.sh  # a local image-folder copy
#   DATA=... bash scripts/train.sh --epochs 5              # any train.py flag passes through
source "$(dirname "$0")/env.sh"
python train.py --data "${DATA:-cifar10}" "$@"
