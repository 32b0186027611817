#!/usr/bin/env bash
# Train CIFAR-10 in ./.venv (created if needed), with the recipe that suits this machine:
#   a GPU: configs/cifar10.yaml (200 epochs, --amp), one process;
#   no GPU: configs/cifar10_cpu.yaml (the ~30-minute CPU recipe), NPROC processes of one
#   thread each under torchrun (default 2), 128 images per step in all.
#   bash scripts/train.sh                                  # downloads CIFAR-10 into ./data
#   DATA=../shared/data/cifar10-jpg bash scripts/train.sh  # a local image-folder copy
#   DATA=... bash scripts/train.sh --epochs 5              # any train.py flag passes through
source "$(dirname "$0")/env.sh"
DATA="${DATA:-cifar10}"
if python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "[vit] GPU found: the GPU recipe, configs/cifar10.yaml with --amp"
    exec python train.py --config configs/cifar10.yaml --amp --data "$DATA" "$@"
fi
NPROC="${NPROC:-2}"
if [ $((128 % NPROC)) -ne 0 ]; then
    echo "[vit] NPROC=$NPROC does not divide the recipe's 128 images per step" >&2
    exit 2
fi
echo "[vit] no GPU: the CPU recipe, configs/cifar10_cpu.yaml, $NPROC process(es) x 1 thread"
exec python -m torch.distributed.run --standalone --nproc_per_node "$NPROC" train.py \
    --config configs/cifar10_cpu.yaml --batch-size $((128 / NPROC)) --data "$DATA" "$@"
