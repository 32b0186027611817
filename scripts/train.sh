#!/usr/bin/env bash
# Train CIFAR-10 in ./.venv (created if needed), with the recipe that suits this machine:
#   a GPU: configs/cifar10_gpu_speedrun.yaml (the images augmented on the GPU, a compiled step,
#   a CNN teacher, as many epochs as fit in 290 s; 89.59% on an H200 before its latest levers:
#   docs/gpu.md), one process; GPU_RECIPE=deit chooses
#   configs/cifar10.yaml (the DeiT-style 200-epoch recipe, --amp) instead;
#   no GPU: the ~30-minute CPU recipe, NPROC processes of one thread each under torchrun
#   (default 2), the config's images per step in all (its batch_size x 2: 128, 256 for the fast
#   recipe): configs/cifar10_cpu_bf16.yaml where the CPU has
#   AMX (bfloat16 fastest there: a deeper model and more epochs in the time); where it has
#   AVX512-BF16 alone, configs/cifar10_cpu_bf16_avx512_fast.yaml if its bfloat16 products
#   measure >= 3.2x float32's (more epochs, CutMix), else configs/cifar10_cpu_bf16_avx512.yaml;
#   configs/cifar10_cpu.yaml (float32) on every other CPU. CPU_RECIPE=float32, bfloat16,
#   bfloat16-avx512 or bfloat16-avx512-fast chooses.
#   bash scripts/train.sh                                  # downloads CIFAR-10 into ./data
#   DATA=../shared/data/cifar10-jpg bash scripts/train.sh  # a local image-folder copy
#   DATA=... bash scripts/train.sh --epochs 5              # any train.py flag passes through
#   bash scripts/train.sh --resume runs/RUN                # continue a run as it was started
#   bash scripts/train.sh --help                           # these settings, then train.py's flags
# Paths (DATA, --resume, --output-dir, ...) are the user's, read from the current directory; the
# recipes' configs are the repository's, wherever it is run from.
# A mistake is one line from train.py, with its exit status (2); Ctrl-C ends with one line
# naming the command that continues the run (status 130). The processes start through
# `python -m vit.distributed`: torchrun, with their exit status and messages as its own.
export VIT_TRAIN_COMMAND="bash $(printf %q "$0")"  # train.py names it to continue a run
source "$(dirname "$0")/env.sh"

for ARG in "$@"; do
    if [ "$ARG" = --help ] || [ "$ARG" = -h ]; then
        # one process: under torchrun each would print train.py's help
        cat <<'EOF'
usage: [DATA=...] [NPROC=N] [CPU_RECIPE=...] [GPU_RECIPE=...] bash scripts/train.sh [TRAIN.PY FLAGS]
Trains CIFAR-10 with the recipe that suits this machine; settings (environment):
  DATA        --data: cifar10 (default, downloaded into ./data), cifar100 or an image folder
  NPROC       processes on a CPU, under torchrun (default 2; a resumed run: its own number)
  CPU_RECIPE  auto (default: by the CPU), float32, bfloat16, bfloat16-avx512,
              bfloat16-avx512-fast
  GPU_RECIPE  speedrun (default: configs/cifar10_gpu_speedrun.yaml) or deit (configs/cifar10.yaml)
Any train.py flag follows; --resume RUN continues a run as it was started. train.py's flags:

EOF
        exec python "$ROOT/train.py" --help
    fi
done

# NPROC is checked before anything slow (the GPU probe, the bfloat16 timing): an integer that
# divides 256, every CPU recipe's images per step being 128 or 256; that it divides the chosen
# recipe's, once the recipe is chosen.
if [ -n "${NPROC:-}" ] && { ! [[ "$NPROC" =~ ^[1-9][0-9]{0,3}$ ]] || [ $((256 % NPROC)) -ne 0 ]; }; then
    echo "[vit] NPROC=$NPROC: processes on a CPU; accepted: an integer >= 1 that divides the" \
        "recipe's images per step (128; 256 for bfloat16-avx512-fast)" >&2
    exit 2
fi

RESUME=""
PREVIOUS=""
for ARG in "$@"; do
    [ "$PREVIOUS" = --resume ] && RESUME="$ARG"
    case "$ARG" in --resume=*) RESUME="${ARG#--resume=}" ;; esac
    PREVIOUS="$ARG"
done
if [ -n "$RESUME" ]; then
    # The run's own data, recipe and number of processes (its config.yaml): none of the
    # recipe's flags is added. DATA, if given, is checked against the run's data.
    RUN_NPROC="$(sed -n 's/^processes: *\([0-9][0-9]*\) *$/\1/p' "$RESUME/config.yaml" 2>/dev/null || true)"
    if [ -n "${NPROC:-}" ] && [ -n "$RUN_NPROC" ] && [ "$NPROC" != "$RUN_NPROC" ]; then
        # train.py would refuse it too, advising this same command while NPROC stays set
        echo "[vit] NPROC=$NPROC: $RESUME trains in $RUN_NPROC process(es); leave NPROC out" \
            "(a resumed run takes its own number) or set NPROC=$RUN_NPROC" >&2
        exit 2
    fi
    NPROC="${NPROC:-${RUN_NPROC:-1}}"
    echo "[vit] resuming $RESUME with its own settings: $NPROC process(es)"
    if [ "$NPROC" = 1 ]; then
        exec python "$ROOT/train.py" ${DATA:+--data "$DATA"} "$@"
    fi
    exec python -m vit.distributed --standalone --nproc_per_node "$NPROC" "$ROOT/train.py" \
        ${DATA:+--data "$DATA"} "$@"
fi

DATA="${DATA:-cifar10}"
if python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    case "${GPU_RECIPE:-speedrun}" in
        speedrun)
            echo "[vit] GPU found: the GPU speedrun recipe, configs/cifar10_gpu_speedrun.yaml"
            exec python "$ROOT/train.py" --config "$ROOT/configs/cifar10_gpu_speedrun.yaml" \
                --data "$DATA" "$@" ;;
        deit)
            echo "[vit] GPU found: the DeiT-style recipe, configs/cifar10.yaml with --amp"
            exec python "$ROOT/train.py" --config "$ROOT/configs/cifar10.yaml" --amp \
                --data "$DATA" "$@" ;;
        *)
            echo "[vit] GPU_RECIPE=$GPU_RECIPE: accepted: speedrun (the default), deit" >&2
            exit 2 ;;
    esac
fi
NPROC="${NPROC:-2}"
CPU_RECIPE="${CPU_RECIPE:-auto}"
if [ "$CPU_RECIPE" = auto ]; then
    # the recipe, and on an AVX512-BF16 CPU without AMX the measured speed that chose it, rounded
    # once so that the figure printed is the figure compared (unrounded, 3.17 printed as 3.2 chose plain)
    read -r CPU_RECIPE SPEEDUP <<<"$(python -c "from vit.inference import precision as p
s = round(p.cpu_bf16_matmul_speedup(), 2) if p.cpu_has_avx512_bf16() and not p.cpu_has_amx() else None
print(p.cpu_training_recipe(s), '' if s is None else f'{s:.2f}')")"
    if [ -n "$SPEEDUP" ]; then
        WHY="; bfloat16 matrix products ${SPEEDUP}x float32's here (the fast recipe from 3.2x)"
    fi
fi
case "$CPU_RECIPE" in
    float32) CONFIG=configs/cifar10_cpu.yaml ;;
    bfloat16) CONFIG=configs/cifar10_cpu_bf16.yaml ;;
    bfloat16-avx512) CONFIG=configs/cifar10_cpu_bf16_avx512.yaml ;;
    bfloat16-avx512-fast) CONFIG=configs/cifar10_cpu_bf16_avx512_fast.yaml ;;
    *)
        echo "[vit] CPU_RECIPE=$CPU_RECIPE: accepted: auto (the default), float32, bfloat16," \
            "bfloat16-avx512, bfloat16-avx512-fast" >&2
        exit 2
        ;;
esac
# A CPU config's batch_size is per process of the two it was measured with: NPROC processes
# share the same images per step.
STEP_IMAGES=$((2 * $(sed -n 's/^batch_size: *\([0-9][0-9]*\).*/\1/p' "$ROOT/$CONFIG")))
if [ $((STEP_IMAGES % NPROC)) -ne 0 ]; then
    echo "[vit] NPROC=$NPROC: processes on a CPU; accepted: an integer >= 1 that divides the" \
        "$CPU_RECIPE recipe's $STEP_IMAGES images per step" >&2
    exit 2
fi
echo "[vit] no GPU: the $CPU_RECIPE CPU recipe, $CONFIG, $NPROC process(es) x 1 thread${WHY:-}"
exec python -m vit.distributed --standalone --nproc_per_node "$NPROC" "$ROOT/train.py" \
    --config "$ROOT/$CONFIG" --batch-size $((STEP_IMAGES / NPROC)) --data "$DATA" "$@"
