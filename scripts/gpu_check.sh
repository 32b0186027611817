#!/usr/bin/env bash
# The GPU path, checked on a GPU in one command: the `gpu` tests, the GPU recipe on real
# CIFAR-10 for a time box (resumed exactly from chunk to chunk), inference throughput ours/timm,
# and one JSON + one log of what was measured (docs/gpu.md says how to read them).
#
#   bash scripts/gpu_check.sh OUTDIR [STAGE ...]    # on the GPU machine; STAGE: tests train bench
#                                                   # speedrun pipeline finetune (default: the
#                                                   # first three)
#   bash scripts/gpu_check.sh --pack                # here, before: build/gpu (data and wheels)
#   bash scripts/gpu_check.sh --restore FOLDER      # here, after: what came back -> build/gpu/resume
#   bash scripts/gpu_check.sh --pack-backbone DIR   # here: a transformers folder in bfloat16 ->
#                                                   # build/gpu-backbone/NAME (the finetune stage)
#   bash scripts/gpu_check.sh --help                # this, up to the next line
#
# Without CUDA it says so in one line and exits with status 3 in seconds, writing nothing.
#
# OUTDIR gets gpu_check.json (GPU name, versions, test counts, per chunk: status, seconds, peak
# memory; per epoch: seconds, images/s, accuracy; images/s ours and timm), gpu_check.log (all
# output), run/ (the train.py run folder) and, where $OUT is set (the device tool's machine),
# copies of the JSON, the log and the run's resumable state (run-state.tgz.part-*, 15 MiB each)
# in $OUT, the only folder that comes back from there.
#
# With the device tool (docs/gpu.md): one command runs at most 10 minutes, 15 minutes of device
# time a session (a machine's start included), and the machine keeps files only while it stays
# warm (30 s after a call):
#   1. here:   bash scripts/gpu_check.sh --pack          (CIFAR-10 packed, ~18 MiB; the wheels of
#              albumentations and its needs, which the GPU image lacks; ~22 MiB to carry)
#   2. run:    bash scripts/gpu_check.sh build/gpu-check          carry ["build/gpu"], 600 s
#              (tests, then training for VIT_GPU_TRAIN_SECONDS=240, then the benchmark)
#   3. here:   bash scripts/gpu_check.sh --restore FILES_AT   (the folder the files came back to)
#   4. run:    VIT_GPU_TRAIN_SECONDS=500 bash scripts/gpu_check.sh build/gpu-check train
#              carry ["build/gpu"]: it resumes the run, from build/gpu-check/run on a machine
#              still warm, else from build/gpu/resume (step 3); repeat 3-4 while time is left.
#
# Settings (environment): VIT_GPU_TRAIN_SECONDS (the train stage's time box, default 240; the
# run is stopped as Ctrl-C stops it, after its last complete epoch's checkpoint), VIT_GPU_EPOCHS
# (the recipe's length, default configs/cifar10.yaml's 200; a new run only), VIT_GPU_WORKERS
# (data loader processes, default: cores - 2, at most 12), VIT_GPU_TRAIN_ARGS (train.py flags
# added to a new run's: another recipe, e.g. "--opt muon"), VIT_GPU_BENCH_ARGS
# (benchmarks/inference_throughput.py flags in place of the defaults), VIT_GPU_TESTS (pytest
# flags selecting the tests, default "-k cuda": the CUDA cases; "" for the CPU cases too),
# PYTHON (default python3).
# The speedrun stage (issue 38; docs/gpu.md): configs/cifar10_gpu_speedrun.yaml once per seed of
# VIT_GPU_SEEDS (default "0"), one after another (VIT_GPU_SEEDS_TOGETHER=1: all at once, side by
# side on the one GPU, under CUDA MPS where the machine has it; VIT_GPU_VARIANTS, flag sets with
# ';' between them: each seed once per variant, all at once), each the whole train.py command
# timed as a first run on a bare machine (caches of its own for decoded images and compiled
# kernels), time-boxed to VIT_GPU_SPEEDRUN_SECONDS (default 330; a box too short for the recipe's
# time_budget gives the run --time-budget 20 s short of it), VIT_GPU_SPEEDRUN_ARGS added, its
# final weights evaluated with --tta flip beside; a run that fails (not one its time box stops) is
# tried again with each of VIT_GPU_FALLBACKS (default "--no-graph-step --compile-mode
# reduce-overhead --no-graph-update;--no-graph-step --compile-mode default
# --no-graph-update;--no-graph-step --no-compile --no-graph-update;--no-graph-step --compile-mode
# reduce-overhead --no-graph-update --distillation-type none") added. Then
# benchmarks/training_pipeline.py (today's pipeline against the speedrun's, model by model:
# images/s, ms per step, the GPU's busy share, the kernels and host operations that take the
# epoch's time; VIT_GPU_PIPELINE_ARGS adds flags, e.g. "--configs
# configs/cifar10_gpu_speedrun.yaml --shapes config" for the speedrun's row alone;
# VIT_GPU_PIPELINE=0 skips it; the pipeline stage runs it alone). VIT_GPU_SPEEDRUN_ARGS="auto
# [FLAGS]": the benchmark first instead (unless OUTDIR holds its rows from an earlier call;
# stopped in time for a seed's shortest box and its TTA), then the seeds with the flags
# scripts/choose_speedrun_flags.py takes from its rows (FLAGS after them), side by side or one
# after the other as it says (VIT_GPU_SEEDS_TOGETHER, where set, has the last word). All of it
# ends by VIT_GPU_DEADLINE seconds after the script began (default 560, for a 600 s call): a
# seed's time box shrinks to what is left (one under VIT_GPU_SPEEDRUN_MIN_SECONDS, default 60, is
# not started), the benchmark stops there with the rows it has, and the tests stage (after the
# seeds, say) with the cases it has. gpu_check.json's "speedrun" (per attempt: seed, status,
# flags, time box, wall seconds, every epoch with its time since the command started, when it
# first reached 90, 93 and 94%, top-1 single view and with TTA, how many runs shared the GPU),
# "pipeline" and "speedrun_choice".
# Last, any stage: the environment and the speedrun's records (speedrun, pipeline,
# speedrun_choice) as tables (scripts/gpu_report.py); the other records are in the JSON only.
# The finetune stage (issue 40; docs/training.md): benchmarks/finetune_table.py on all of
# CIFAR-10 at 224 px, 3 epochs, --amp: probe then fine-tune with layer decay (the probe's
# accuracy its epoch 0), the head alone, full with layer decay, from VIT_GPU_BACKBONE (default
# build/gpu-backbone/dinov2-small, packed by --pack-backbone; VIT_GPU_BACKBONE_MODEL its
# architecture, default vit_small_patch14_dinov2; VIT_GPU_FINETUNE_ARGS more flags). The
# backbone (44 MB in bfloat16) and the packed images do not fit one call's 64 MiB: send the
# images first (a call carrying build/gpu, e.g. the tests stage), then at once, on the warm
# machine, the backbone (carry ["build/gpu-backbone"]) with this stage.
# VIT_GPU_BUILD (default build/gpu) and VIT_GPU_DATA (default /tmp/vit-cifar10-jpg): where the
# carried files and the unpacked images are. VIT_GPU_CHECK_CPU=1 runs the stages on the CPU,
# to test this script's mechanics (tests/test_gpu.py does): its figures mean nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
BUILD="${VIT_GPU_BUILD:-build/gpu}" # what travels: carry ["build/gpu"]
PACKED="$BUILD/cifar10-jpg.npz"
WHEELS="$BUILD/wheels"
BACKBONE="${VIT_GPU_BACKBONE_BUILD:-build/gpu-backbone}"  # what the finetune stage's call carries
RESUME="$BUILD/resume"
DATA="${VIT_GPU_DATA:-/tmp/vit-cifar10-jpg}"  # one path on every machine: a resume checks it
SITE="/tmp/vit-gpu-site"
LIMIT_MIB=64                       # the device tool's working-tree limit, carry included
# albumentations and what it needs beyond the GPU image's packages (CPython 3.12 wheels;
# stringzilla 3: 0.3 MB where 4 is 4 MB)
WHEEL_LIST="albumentations==2.0.8 albucore==0.0.24 pydantic==2.14.4 pydantic-core==2.50.5
annotated-types==0.8.0 typing-inspection==0.4.5 stringzilla==3.12.6 simsimd==6.5.16"

say() { echo "gpu_check.sh: $*" >&2; }

travel_mib() {  # what a device call would send from this checkout: the tree and build/gpu
    { git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null \
        | awk '$2 == "total" {s += $1} END {print s + 0}'; du -sb "$BUILD" | cut -f1; } \
        | awk '{s += $1} END {printf "%.1f", s / 2^20}'
}

over_limit() {  # over_limit MIB: whether a call sending MIB would pass the tool's limit
    awk -v s="$1" -v l="$LIMIT_MIB" 'BEGIN {exit !(s > l)}'
}

pack() {  # here: the data and the wheels into build/gpu (ignored by git: never committed)
    # --overwrite: the file is this script's own build output, packed again on each --pack
    # (it imports the package's vit.utils.files: from this checkout, where no install has it)
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" scripts/pack_cifar10.py --overwrite --output "$PACKED" "$@"
    mkdir -p "$WHEELS"
    # shellcheck disable=SC2086  # the list splits into one argument per wheel
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" $WHEEL_LIST
    local size
    size="$(travel_mib)"
    echo "$BUILD: $(find "$WHEELS" -name '*.whl' | wc -l) wheels; a device call sends ${size} MiB" \
        "of the ${LIMIT_MIB} MiB it may (carry [\"$BUILD\"])"
    over_limit "$size" && {
        say "over the device tool's ${LIMIT_MIB} MiB: pack a subset (--per-class N)"
        exit 2
    }
    return 0
}

restore() {  # here: the state and records that came back from $OUT, for the next call
    local from="$1"
    if ! ls "$from"/run-state.tgz.part-* >/dev/null 2>&1; then
        say "--restore $from: no run-state.tgz.part-* there (the files a train stage puts in \$OUT)"
        exit 2
    fi
    rm -rf "$RESUME.tmp"
    mkdir -p "$RESUME.tmp"
    cp "$from"/run-state.tgz.part-* "$RESUME.tmp/"
    for f in gpu_check.json gpu_check.log; do
        if [ -f "$from/$f" ]; then cp "$from/$f" "$RESUME.tmp/"; fi
    done
    rm -rf "$RESUME"
    mv "$RESUME.tmp" "$RESUME"
    local size
    size="$(travel_mib)"
    echo "$RESUME: the run's state for the next call; it sends ${size} MiB of ${LIMIT_MIB}"
    if over_limit "$size"; then
        echo "over ${LIMIT_MIB} MiB in one call: send it in two on one warm machine (docs/gpu.md," \
            "'Resuming in two calls'): first carry [\"$PACKED\", \"$WHEELS\"], then [\"$RESUME\"]"
    fi
}

pack_backbone() {  # here: a transformers folder's weights in bfloat16 (half the bytes to carry)
    local from="$1" to
    if [ ! -f "$from/model.safetensors" ]; then  # checked before anything is made
        say "--pack-backbone $from: no model.safetensors there; give a transformers folder"
        exit 2
    fi
    to="$BACKBONE/$(basename "$from")"
    mkdir -p "$to"
    "$PYTHON" - "$from" "$to" <<'PY'
import os, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
source, target = Path(sys.argv[1]), Path(sys.argv[2])
tensors = load_file(source / "model.safetensors")
halved = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
# written beside, then renamed: a stopped pack leaves the earlier file or none, never half of
# one for the next call to carry
tmp = target / "model.safetensors.tmp"
try:
    save_file(halved, tmp, metadata={"format": "pt"})
    os.replace(tmp, target / "model.safetensors")
finally:
    tmp.unlink(missing_ok=True)
for name in ("config.json", "preprocessor_config.json"):
    if (source / name).is_file():
        shutil.copy(source / name, target / name)
PY
    echo "$to: $(du -sm "$to" | cut -f1) MiB (bfloat16); carry [\"$BACKBONE\"] alone, after a" \
        "call that carried build/gpu on the same warm machine"
}

case "${1:-}" in
    --pack) shift; pack "$@"; exit 0 ;;
    --pack-backbone)
        [ $# -eq 2 ] || { say "--pack-backbone takes one transformers folder"; exit 2; }
        pack_backbone "$2"; exit 0 ;;
    --restore)
        [ $# -eq 2 ] || { say "--restore takes one folder (where the device's files came back)"; exit 2; }
        restore "$2"; exit 0 ;;
    -h | --help)  # the header's first paragraphs: what it does, its usage, without a GPU
        sed -n '2,/^# Without CUDA/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0 ;;
    "" | -*)
        say "usage: bash scripts/gpu_check.sh OUTDIR [tests] [train] [bench] [speedrun]" \
            "[pipeline] [finetune] | --pack | --pack-backbone FOLDER | --restore FOLDER" \
            "| --help"
        exit 2 ;;
esac
OUTDIR="$1"
shift
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(tests train bench)
for STAGE in "${STAGES[@]}"; do
    case "$STAGE" in
        tests | train | bench | speedrun | pipeline | finetune) ;;
        *) say "unknown stage '$STAGE'; accepted: tests, train, bench, speedrun, pipeline, finetune"; exit 2 ;;
    esac
done

DEVICE=cuda
if [ -n "${VIT_GPU_CHECK_CPU:-}" ]; then DEVICE=cpu; fi
# No GPU: one line, nothing written.
if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
    2>/dev/null; then
    say "no CUDA GPU here (torch.cuda.is_available() is False, or no torch for $PYTHON); nothing was run"
    exit 3
fi

mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
JSON="$OUTDIR/gpu_check.json"
LOG="$OUTDIR/gpu_check.log"
if [ ! -f "$JSON" ] && [ -f "$RESUME/gpu_check.json" ]; then  # a fresh machine: the records so far
    cp "$RESUME/gpu_check.json" "$JSON"
    if [ -f "$RESUME/gpu_check.log" ]; then cp "$RESUME/gpu_check.log" "$LOG"; fi
fi
exec > >(tee -a "$LOG") 2>&1
copy_out() {  # $OUT is what comes back from the device tool's machine: the records, always
    if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
        for f in "$JSON" "$LOG"; do
            if [ -f "$f" ]; then cp "$f" "$OUT/"; fi
        done
    fi
}
MPS_STARTED=0  # the CUDA MPS daemon this script started (seeds side by side), stopped at exit
stop_mps() {
    if [ "$MPS_STARTED" = 1 ]; then echo quit | nvidia-cuda-mps-control || true; MPS_STARTED=0; fi
}
trap 'stop_mps; copy_out' EXIT
STARTED_AT="$(date +%s)"  # the speedrun stage's VIT_GPU_DEADLINE counts from here
echo "== gpu_check.sh $(date -u +%FT%TZ): stages ${STAGES[*]} into $OUTDIR"

# The package from this checkout; albumentations & co from the carried wheels if missing here.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export NO_ALBUMENTATIONS_UPDATE=1  # no network there: skip albumentations' version check
# a warm machine keeps what an earlier call installed (the call that sends the run's state
# carries no wheels: the two-call resume in docs/gpu.md)
if [ -d "$SITE/albumentations" ]; then export PYTHONPATH="$PYTHONPATH:$SITE"; fi
if ! "$PYTHON" -c "import albumentations" 2>/dev/null; then
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        say "albumentations is missing and $WHEELS holds no wheels: run --pack here, carry $BUILD"
        exit 2
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$PYTHONPATH:$SITE"
fi

record() {  # record KEY VALUE_JSON_FILE [append]: put (or append) a value into gpu_check.json
    "$PYTHON" - "$JSON" "$@" <<'EOF'
import fcntl, json, sys
from pathlib import Path
path, key, value_file = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
value = json.loads(Path(value_file).read_text())
# runs side by side (the speedrun stage's) record at once: one writer at a time
with open(path.with_suffix(".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    data = json.loads(path.read_text()) if path.is_file() else {}
    if sys.argv[4:] == ["append"]:
        data.setdefault(key, []).append(value)
    else:
        data[key] = value
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
EOF
}

"$PYTHON" - "$OUTDIR/environment.json" <<'EOF'
import json, os, platform, subprocess, sys
import timm, torch
cuda = torch.cuda.is_available()
props = torch.cuda.get_device_properties(0) if cuda else None
try:
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30,
    ).stdout.strip()
except OSError:
    smi = None
env = {
    "gpu": torch.cuda.get_device_name(0) if cuda else None,
    "gpu_memory_bytes": props.total_memory if cuda else None,
    "multiprocessors": props.multi_processor_count if cuda else None,
    "driver": smi,
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "cudnn": torch.backends.cudnn.version(),
    "timm": timm.__version__,
    "python": platform.python_version(),
    "cpu_cores": len(os.sched_getaffinity(0)),
}
open(sys.argv[1], "w").write(json.dumps(env))
print("environment:", env)
EOF
record environment "$OUTDIR/environment.json"

FAILED=()

run_tests() {
    local xml="$OUTDIR/tests.xml" status=0 left
    left="$(seconds_left)"
    if [ "$left" -lt 30 ]; then  # after a speedrun stage, say: the call's time is the seeds'
        echo "the tests: not started, ${left} s left before VIT_GPU_DEADLINE"
        return 0
    fi
    # stopped at the deadline as Ctrl-C stops pytest: the cases done are in the XML
    # shellcheck disable=SC2086  # VIT_GPU_TESTS: pytest flags, split on spaces
    timeout -s INT -k 20 "$left" "$PYTHON" -m pytest -m gpu tests/test_gpu.py -q \
        -p no:cacheprovider -rs ${VIT_GPU_TESTS--k cuda} --junitxml "$xml" || status=$?
    "$PYTHON" - "$xml" "$status" "$OUTDIR/tests.json" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
try:
    suite = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):  # pytest stopped before writing it
    suite = ET.Element("testsuite")
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
keys = ("tests", "failures", "errors", "skipped", "time")
counts = {k: float(suite.get(k, 0)) if k == "time" else int(suite.get(k, 0)) for k in keys}
failed = [
    f"{case.get('classname')}::{case.get('name')}"
    for case in suite.iter("testcase")
    if case.find("failure") is not None or case.find("error") is not None
]
open(sys.argv[3], "w").write(json.dumps({**counts, "status": int(sys.argv[2]), "failed": failed}))
EOF
    record tests "$OUTDIR/tests.json"
    [ "$status" -eq 0 ] || FAILED+=(tests)
}

unpack_data() {  # the CIFAR-10 JPEGs into $DATA, from the carried pack (or an earlier call's)
    if [ -f "$PACKED" ]; then
        # --overwrite: images a warm machine unpacked from an earlier pack are replaced (those of
        # this pack are kept as they are; a folder the packer did not write is still refused)
        "$PYTHON" scripts/pack_cifar10.py --unpack "$PACKED" "$DATA" --overwrite
    elif [ ! -f "$DATA/.unpacked" ]; then  # (a warm machine keeps an earlier call's images)
        say "no $PACKED: run 'bash scripts/gpu_check.sh --pack' where the data is, carry $BUILD"
        return 1
    fi
}

run_train() {
    local run="$OUTDIR/run" seconds="${VIT_GPU_TRAIN_SECONDS:-240}" status=0 args
    local cores workers
    cores="$(nproc)"
    workers="${VIT_GPU_WORKERS:-$(( cores > 14 ? 12 : (cores > 2 ? cores - 2 : 0) ))}"
    unpack_data || { FAILED+=(train); return 0; }
    if [ ! -f "$run/training_state.pt" ] && ls "$RESUME"/run-state.tgz.part-* >/dev/null 2>&1; then
        echo "restoring the run from $RESUME (a fresh machine)"
        mkdir -p "$run"
        cat "$RESUME"/run-state.tgz.part-* | tar xz -C "$run"
    fi
    if [ -f "$run/training_state.pt" ] && "$PYTHON" - "$run" <<'EOF'; then
import sys
from pathlib import Path
import torch, yaml
run = Path(sys.argv[1])
state = torch.load(run / "training_state.pt", map_location="cpu", weights_only=True, mmap=True)
epochs = yaml.safe_load((run / "config.yaml").read_text())["epochs"]
print(f"the run in {run} has done {state['epoch']} of its {epochs} epochs")
sys.exit(0 if state["epoch"] >= epochs else 1)
EOF
        echo "nothing to train (VIT_GPU_EPOCHS=N and a new OUTDIR start another run)"
        return 0
    fi
    if [ -f "$run/training_state.pt" ]; then
        args=(--resume "$run" --workers "$workers" --device "$DEVICE")
    else
        # shellcheck disable=SC2206  # VIT_GPU_TRAIN_ARGS: flags, split on spaces
        args=(--config configs/cifar10.yaml --amp --data "$DATA" --output-dir "$run" --overwrite
              --workers "$workers" --device "$DEVICE" ${VIT_GPU_EPOCHS:+--epochs "$VIT_GPU_EPOCHS"}
              ${VIT_GPU_TRAIN_ARGS:-})
    fi
    echo "train.py ${args[*]}   (time box ${seconds} s)"
    # SIGINT at the time box: train.py stops as on Ctrl-C (status 130), its last complete
    # epoch's checkpoint kept; the wrapper records the peak GPU memory of the process.
    timeout --preserve-status -s INT -k 60 "$seconds" "$PYTHON" - "$OUTDIR/chunk.json" "${args[@]}" <<'EOF' || status=$?
import importlib.util, json, sys, time
import torch
out, argv = sys.argv[1], sys.argv[2:]
sys.argv = ["train.py", *argv]
spec = importlib.util.spec_from_file_location("train_script", "train.py")
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
started, status = time.time(), 1
try:
    status = train.main(argv)
finally:
    chunk = {
        "status": status,
        "seconds": round(time.time() - started, 1),
        "peak_memory_bytes": (
            torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        ),
        "argv": argv,
    }
    open(out, "w").write(json.dumps(chunk))
sys.exit(status)
EOF
    record train_chunks "$OUTDIR/chunk.json" append
    if [ -f "$run/training_state.pt" ]; then
        "$PYTHON" - "$run" "$OUTDIR/epochs.json" <<'EOF'
import json, sys
from pathlib import Path
import torch
# The epochs of the last complete checkpoint (metrics.csv may hold one more, stopped mid-save)
state = torch.load(Path(sys.argv[1]) / "training_state.pt", weights_only=True, mmap=True)
keys = ("epoch", "epoch_seconds", "train_images_per_s", "data_seconds", "train_loss", "test_top1",
        "ema_top1", "lr")
rows = [{k: row.get(k) for k in keys} for row in state["history"]]
open(sys.argv[2], "w").write(json.dumps(rows))
best = max((r["ema_top1"] or r["test_top1"] or 0 for r in rows), default=0)
print(f"{len(rows)} epochs done; best top-1 {100 * best:.2f}%")
EOF
        record epochs "$OUTDIR/epochs.json"
    fi
    # 0: the run ended; 130: the time box stopped it (resume with the next train stage)
    if [ "$status" -ne 0 ] && [ "$status" -ne 130 ]; then FAILED+=(train); fi
    if [ -n "${OUT:-}" ] && [ -f "$run/training_state.pt" ]; then
        tar cf - -C "$run" config.yaml training_state.pt metrics.csv | gzip -1 \
            | split -b 15M - "$OUT/run-state.tgz.part-"
    fi
}

run_bench() {
    local status=0 defaults="--batch-size 256 --rounds 5 --iters 10 --dtypes float32 bfloat16
        --models vit_small_patch16_224 vit_base_patch16_224 vit_cifar_patch4_32"
    # shellcheck disable=SC2086  # flags, split on spaces
    "$PYTHON" benchmarks/inference_throughput.py --device "$DEVICE" ${VIT_GPU_BENCH_ARGS:-$defaults} \
        --json "$OUTDIR/bench.json" || status=$?
    if [ -f "$OUTDIR/bench.json" ]; then record throughput "$OUTDIR/bench.json"; fi
    [ "$status" -eq 0 ] || FAILED+=(bench)
}

seconds_left() {  # what is left of VIT_GPU_DEADLINE (seconds after this script began)
    echo $(( ${VIT_GPU_DEADLINE:-560} - ($(date +%s) - STARTED_AT) ))
}

run_speedrun() {
    unpack_data || { FAILED+=(speedrun); return 0; }
    local status=0 seed chosen=0 flags="${VIT_GPU_SPEEDRUN_ARGS:-}"
    if [ "${flags%% *}" = auto ]; then  # "auto", or "auto FLAGS"
        choose_speedrun_flags || status=1
        chosen=1
    fi
    if [ "${VIT_GPU_SEEDS_TOGETHER:-0}" = 1 ] || [ -n "${VIT_GPU_VARIANTS:-}" ]; then
        speedrun_side_by_side || status=1
    else
        for seed in ${VIT_GPU_SEEDS:-0}; do
            speedrun_seed "$seed" || status=1
            copy_out  # what is measured comes back even if what follows runs past the call
        done
    fi
    if [ "$chosen" = 0 ] && [ "${VIT_GPU_PIPELINE:-1}" != 0 ]; then
        pipeline_benchmark || status=$?
    fi
    [ "$status" -eq 0 ] || FAILED+=(speedrun)
}

choose_speedrun_flags() {  # VIT_GPU_SPEEDRUN_ARGS="auto [FLAGS]": the pipeline's rows first,
    # then the flags and the seeds' way from them (scripts/choose_speedrun_flags.py), FLAGS
    # after the chosen ones (the last word is theirs); rows an earlier call on this warm machine
    # measured into OUTDIR are not measured again
    local choice status=0 extra="" words=() limit
    if [ "$VIT_GPU_SPEEDRUN_ARGS" != auto ]; then extra="${VIT_GPU_SPEEDRUN_ARGS#auto }"; fi
    # the rows first, stopped in time for a seed's shortest box and its TTA (a hung row must not
    # take the call's seeds with it)
    if [ ! -f "$OUTDIR/pipeline.json" ]; then
        limit=$(( $(seconds_left) - ${VIT_GPU_SPEEDRUN_MIN_SECONDS:-60} - TTA_SECONDS ))
        pipeline_benchmark "$limit" || true
    fi
    # the seeds' budget: a box shorter than the recipe's gives them one inside it
    choice="$("$PYTHON" scripts/choose_speedrun_flags.py "$OUTDIR/pipeline.json" \
        --time-budget $(( ${VIT_GPU_SPEEDRUN_SECONDS:-330} - BUDGET_INSIDE_BOX )) \
        --json "$OUTDIR/choice.json")" || status=$?
    if [ -f "$OUTDIR/choice.json" ]; then record speedrun_choice "$OUTDIR/choice.json"; fi
    # the chosen flags (none: the recipe as it is), then FLAGS, one space between words
    read -r -a words <<< "$(sed -n 2p <<< "$choice") $extra"
    VIT_GPU_SPEEDRUN_ARGS="${words[*]}"
    if [ -z "${VIT_GPU_SEEDS_TOGETHER:-}" ] && [ "$status" -eq 0 ]; then
        VIT_GPU_SEEDS_TOGETHER="$(sed -n 1p <<< "$choice")"
    fi
    echo "the speedrun's flags: ${VIT_GPU_SPEEDRUN_ARGS:-(the recipe as it is)}; seeds" \
        "$([ "${VIT_GPU_SEEDS_TOGETHER:-0}" = 1 ] && echo side by side || echo one after the other)"
    return "$status"
}

run_pipeline() {  # the pipeline benchmark alone (VIT_GPU_PIPELINE_ARGS, e.g. one config's row)
    unpack_data || { FAILED+=(pipeline); return 0; }
    pipeline_benchmark || FAILED+=(pipeline)
}

pipeline_benchmark() {  # [SECONDS]: benchmarks/training_pipeline.py until VIT_GPU_DEADLINE, or
    # for SECONDS at most where that ends sooner
    local status=0 left
    left="$(seconds_left)"
    if [ -n "${1:-}" ] && [ "$1" -lt "$left" ]; then left="$1"; fi
    if [ "$left" -lt 60 ]; then
        echo "the pipeline benchmark: not started, ${left} s left before VIT_GPU_DEADLINE"
        return 0
    fi
    # its rows reach the JSON one by one: at the deadline, those done are kept
    # shellcheck disable=SC2086  # flags, split on spaces
    timeout -s INT -k 20 "$left" "$PYTHON" benchmarks/training_pipeline.py --data "$DATA" \
        --device "$DEVICE" --images 10240 ${VIT_GPU_PIPELINE_ARGS:-} \
        --json "$OUTDIR/pipeline.json" || status=$?
    if [ -f "$OUTDIR/pipeline.json" ]; then record pipeline "$OUTDIR/pipeline.json"; fi
    return "$status"
}

speedrun_side_by_side() {  # every seed (x every variant) at once, side by side on the GPU
    # One after the other, two whole commands take two calls and leave a session's device time
    # no room for the benchmark; side by side they may fit one call, each timed as it shares
    # the GPU (a pessimistic time: alone it can only be faster). VIT_GPU_VARIANTS (flag sets,
    # ';' between them) screens levers the same way: each seed once per variant, all at once.
    # CUDA MPS, where the machine has it, lets their kernels run at the same time instead of
    # taking turns.
    local seed index status=0 variants=() names=() seeds=() flags=() pids=()
    IFS=';' read -r -a variants <<< "${VIT_GPU_VARIANTS:-}"
    [ ${#variants[@]} -gt 0 ] || variants=("")
    for seed in ${VIT_GPU_SEEDS:-0}; do
        for index in "${!variants[@]}"; do
            # a run's name: its seed, and its variant's number where there are variants
            names+=("$seed${VIT_GPU_VARIANTS:+-v$((index + 1))}")
            seeds+=("$seed")
            flags+=("${VIT_GPU_SPEEDRUN_ARGS:-} ${variants[index]}")
        done
    done
    if [ "$DEVICE" = cuda ] && command -v nvidia-cuda-mps-control >/dev/null \
        && nvidia-cuda-mps-control -d; then
        MPS_STARTED=1
    fi
    echo "runs ${names[*]} side by side (CUDA MPS $([ "$MPS_STARTED" = 1 ] && echo on || echo off))"
    for index in "${!names[@]}"; do
        VIT_GPU_AT_ONCE="${#names[@]}" VIT_GPU_SPEEDRUN_ARGS="${flags[index]}" \
            speedrun_seed "${seeds[index]}" "${names[index]}" \
            > "$OUTDIR/speedrun-${names[index]}.log" 2>&1 &
        pids+=("$!")
    done
    for index in "${!pids[@]}"; do
        wait "${pids[index]}" || status=1
        cat "$OUTDIR/speedrun-${names[index]}.log"  # each run's output whole, in turn
    done
    stop_mps  # the benchmark after it runs alone
    copy_out
    return "$status"
}

# a box shorter than the recipe's time_budget gives its run a budget this much inside it, for
# the final files and the forecast's misses
BUDGET_INSIDE_BOX=20
TTA_SECONDS=45  # what a seed's flip-TTA evaluation after its run is given (it takes ~17 s)

# the recipe without what was new in it last, one thing at a time: the step's or the update's
# graph (back to the fifth run's way: reduce-overhead's graphs, the update eager), then CUDA
# graphs, then compilation; last the fifth run's way without the teacher (one that fails to
# train fails every attempt above)
DEFAULT_FALLBACKS="--no-graph-step --compile-mode reduce-overhead --no-graph-update"
DEFAULT_FALLBACKS+=";--no-graph-step --compile-mode default --no-graph-update"
DEFAULT_FALLBACKS+=";--no-graph-step --no-compile --no-graph-update"
DEFAULT_FALLBACKS+=";--no-graph-step --compile-mode reduce-overhead --no-graph-update"
DEFAULT_FALLBACKS+=" --distillation-type none"

speedrun_seed() {  # speedrun_seed SEED [NAME]: the recipe's whole command, timed; TTA beside it
    # A run that fails (not one its time box stops) is tried again with each of
    # VIT_GPU_FALLBACKS in turn (';' between them), while time is left: one GPU call is too
    # scarce to end at a compiler's error with nothing measured.
    local seed="$1" name="${2:-$1}" fallbacks extra status
    IFS=';' read -r -a fallbacks <<< "${VIT_GPU_FALLBACKS-$DEFAULT_FALLBACKS}"
    for extra in "" "${fallbacks[@]}"; do  # the recipe as it is, then each fallback
        status=0
        speedrun_attempt "$seed" "$extra" "$name" || status=$?
        record speedrun "$OUTDIR/speedrun-$name.json" append
        # 0: the run ended; 130: its time box stopped it (a result all the same, recorded as
        # such); 75: not started, too little time left
        case "$status" in 0 | 130) return 0 ;; 75) return 1 ;; esac
    done
    return 1
}

recipe_time_budget() {  # the speedrun recipe's time_budget in whole seconds (none: a large number)
    "$PYTHON" -c 'import sys, yaml
budget = yaml.safe_load(open(sys.argv[1])).get("time_budget")
print(int(budget) if budget else 10**9)' configs/cifar10_gpu_speedrun.yaml
}

speedrun_attempt() {  # speedrun_attempt SEED EXTRA_FLAGS NAME: one timed train.py command
    local seed="$1" extra="$2" name="$3"
    local run="$OUTDIR/speedrun-$name" caches="$OUTDIR/caches-$name"
    local status=0 started ended left box recipe_box="${VIT_GPU_SPEEDRUN_SECONDS:-330}"
    left="$(seconds_left)"
    # the time box: the recipe's, or what the deadline leaves once the TTA evaluation
    box=$(( left - TTA_SECONDS < recipe_box ? left - TTA_SECONDS : recipe_box ))
    rm -rf "$caches"  # a first run on a bare machine: decoding and compilation included
    started="$(date +%s.%N)"
    if [ "$box" -lt "${VIT_GPU_SPEEDRUN_MIN_SECONDS:-60}" ]; then
        echo "seed $seed: not started, ${left} s left before VIT_GPU_DEADLINE"
        status=75
    else
        # A box too short for the recipe's --time-budget: the run sets its epochs to end
        # inside the box (BUDGET_INSIDE_BOX short of it). A --time-budget of the caller's own
        # (none, with a fixed --epochs) is theirs: the box stops a run that runs past it.
        if [[ " ${VIT_GPU_SPEEDRUN_ARGS:-} " != *" --time-budget "* ]] &&
            [ "$((box - BUDGET_INSIDE_BOX))" -lt "$(recipe_time_budget)" ]; then
            extra="$extra --time-budget $((box - BUDGET_INSIDE_BOX))"
        fi
        echo "seed $seed: train.py ... ${VIT_GPU_SPEEDRUN_ARGS:-} $extra   (time box ${box} s)"
        # shellcheck disable=SC2086  # flags, split on spaces
        TORCHINDUCTOR_CACHE_DIR="$caches/inductor" TRITON_CACHE_DIR="$caches/triton" \
            timeout --preserve-status -s INT -k 60 "$box" \
            "$PYTHON" train.py --config configs/cifar10_gpu_speedrun.yaml --data "$DATA" \
            --seed "$seed" --output-dir "$run" --overwrite --device "$DEVICE" \
            --cache-dir "$caches/decoded" ${VIT_GPU_SPEEDRUN_ARGS:-} $extra || status=$?
    fi
    ended="$(date +%s.%N)"
    if [ "$status" -ne 75 ] && [ -f "$run/model.safetensors" ]; then  # the kept (EMA) weights
        "$PYTHON" evaluate.py --checkpoint "$run" --data "$DATA" --device "$DEVICE" --tta flip \
            --json "$run/tta.json" --overwrite || true
    fi
    "$PYTHON" - "$run" "$seed" "$status" "$started" "$ended" "$box" \
        "${VIT_GPU_SPEEDRUN_ARGS:-} $extra" "$OUTDIR/speedrun-$name.json" <<'PY'
import csv, json, os, sys
from pathlib import Path
run, seed, status, started, ended, box, flags, out = sys.argv[1:]
run, started, status = Path(run), float(started), int(status)
rows = []
if status != 75 and (run / "metrics.csv").is_file():
    rows = list(csv.DictReader(open(run / "metrics.csv")))
def number(value):
    return float(value) if value not in ("", None) else None
epochs = []
for row in rows:
    kept = number(row["ema_top1"]) if row["ema_top1"] else number(row["test_top1"])
    epochs.append({
        "epoch": int(row["epoch"]),
        # milliseconds: a tiny epoch on a fast host ends within a tenth of a second
        "since_start_s": round(float(row["finished_at"]) - started, 3),
        "epoch_seconds": number(row["epoch_seconds"]),
        "train_images_per_s": number(row["train_images_per_s"]),
        "train_loss": number(row["train_loss"]),
        "test_top1": number(row["test_top1"]),
        "ema_top1": number(row["ema_top1"]),
        "kept_top1": kept,  # the weights the run keeps: the EMA's where there is one
    })
evaluated = [e for e in epochs if e["kept_top1"] is not None]
reached = {
    str(goal): next((e["since_start_s"] for e in evaluated if e["kept_top1"] >= goal / 100), None)
    for goal in (90, 93, 94)
}
tta = json.loads((run / "tta.json").read_text()) if (run / "tta.json").is_file() else {}
result = {
    "seed": int(seed),
    "status": status,
    "flags": flags.split(),  # added to the recipe's: VIT_GPU_SPEEDRUN_ARGS, then a fallback's
    "time_box_s": int(box),
    "started_at": round(started, 1),  # the clock's seconds: runs side by side overlap
    "wall_seconds": round(float(ended) - started, 3),  # as precise as the epochs' times
    "epochs": epochs,
    "first_reached_s": reached,
    "top1": evaluated[-1]["kept_top1"] if evaluated else None,
    "tta_top1": tta.get("tta", {}).get("top1"),
    "tta_views": "flip",
    "at_once": int(os.environ.get("VIT_GPU_AT_ONCE", "1")),  # runs sharing the GPU (together)
}
Path(out).write_text(json.dumps(result))
print(f"seed {seed} {' '.join(result['flags'])}: status {status}, {result['wall_seconds']} s "
      f"(box {box}), top-1 {result['top1']}, with TTA {result['tta_top1']}; first reached "
      f"90/93/94% at {reached} s")
PY
    return "$status"
}

run_finetune() {  # issue 40 on a GPU: the backbone on all of CIFAR-10, its probe beside
    unpack_data || { FAILED+=(finetune); return 0; }
    local backbone="${VIT_GPU_BACKBONE:-$BACKBONE/dinov2-small}" status=0 cores
    if [ ! -e "$backbone" ]; then
        say "no backbone at $backbone: run 'bash scripts/gpu_check.sh --pack-backbone FOLDER'" \
            "here, carry $BACKBONE"
        FAILED+=(finetune)
        return 0
    fi
    cores="$(nproc)"
    # --overwrite: OUTDIR/finetune is this script's own folder, run again by a later call
    # shellcheck disable=SC2086  # VIT_GPU_FINETUNE_ARGS: flags, split on spaces
    "$PYTHON" benchmarks/finetune_table.py --backbone "$backbone" \
        --model "${VIT_GPU_BACKBONE_MODEL:-vit_small_patch14_dinov2}" --data "$DATA" \
        --out "$OUTDIR/finetune" --overwrite --device "$DEVICE" \
        --workers "${VIT_GPU_WORKERS:-$(( cores > 14 ? 12 : (cores > 2 ? cores - 2 : 0) ))}" \
        --img-size 224 --train-images 50000 --test-images 10000 --epochs 3 --batch-size 128 \
        --rows "probe, then full with layer decay 0.65" "head only (--trainable-blocks 0)" \
        "full, layer decay 0.65" ${VIT_GPU_FINETUNE_ARGS:-} --json "$OUTDIR/finetune.json" \
        || status=$?
    if [ -f "$OUTDIR/finetune.json" ]; then record finetune "$OUTDIR/finetune.json"; fi
    [ "$status" -eq 0 ] || FAILED+=(finetune)
}

for STAGE in "${STAGES[@]}"; do
    echo "== stage $STAGE ($(date -u +%T))"
    "run_$STAGE"
done

# last, since the device tool's reply carries the end of the output: the speedrun's records
# as tables
if [ -f "$JSON" ]; then "$PYTHON" scripts/gpu_report.py "$JSON" || true; fi
echo "== done ($(date -u +%T)); ${FAILED[*]:-no} failed stage(s); $JSON"
[ ${#FAILED[@]} -eq 0 ]
