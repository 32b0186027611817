"""The CPU recipe's levers, one change at a time, at the recipe's full budget on real CIFAR-10.

    python benchmarks/cpu_ablation.py --data ../shared/data/cifar10-jpg            # every row
    python benchmarks/cpu_ablation.py --data ... --rows recipe mimetic --seeds 0 1

Each row is a whole `train.py` command (printed, so it can be run alone): the recipe of
`configs/cifar10_cpu.yaml` (all 50,000 training images, 20 epochs, 2 DDP processes x 1 thread)
as it was before its whitened start (the row `whiten` is the config as it is), with one
change, scored by `evaluate.py` on all 10,000 test images, plain and with shift test-time
augmentation. The wall time is the whole training command's (start-up, data,
training, evaluations, saving); the decoded-image cache is warmed once before the first row.
Rows run one after another; accuracy does not depend on the machine's load (the runs are
deterministic for a seed), wall time does: time rows on an idle machine only. --data and --out
are relative to the current folder; each row's train.py output is in OUT/ROW-seedN.log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import _cli
import yaml

from vit.data.datasets import load_split
from vit.training.settings import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
# Every row but `whiten` and `amp-34ep-wd0.2-whiten` was measured before the recipe started its
# patch embedding whitened (since 2026-12-06): the rows start it at random, as measured, and
# those two ask for the whitening themselves (the later flag wins)
BASE = ["--config", "configs/cifar10_cpu.yaml", "--patch-embed-init", "default"]
PROCESSES = 2


def shape(**overrides) -> list[str]:
    """--model-kwargs items for the recipe's model with other width/depth/heads (the flag
    replaces BASE's whole model_kwargs, so the rest of them, e.g. its pooling, are repeated)."""
    recipe = yaml.safe_load((ROOT / BASE[1]).read_text())["model_kwargs"]
    return [f"{key}={value}" for key, value in {**recipe, **overrides}.items()]


CUTMIX_ON_HALF = ["--cutmix", "1.0", "--mixup-prob", "0.5"]


def fast_recipe(epochs: int, weight_decay: float = 0.2) -> list[str]:
    """configs/cifar10_cpu_bf16_avx512_fast.yaml's flags on top of BASE, at `epochs` and
    `weight_decay` (the config's: 0.2) (bf16 autocast, bf16 Newton-Schulz, CutMix on half the
    batches)."""
    flags = ["--amp", "--epochs", str(epochs), "--weight-decay", str(weight_decay)]
    return [*flags, "--muon-ns-dtype", "bfloat16", *CUTMIX_ON_HALF]


def six_blocks(epochs: int, *flags: str) -> list[str]:
    """fast_recipe(epochs) with 6 blocks (0.81M parameters) at 128 images a step per process,
    `flags` between (--model-kwargs takes every item after it, so it comes last)."""
    return [*fast_recipe(epochs), "--batch-size", "128", *flags, "--model-kwargs", *shape(depth=6)]


# configs/cifar10_cpu_bf16.yaml as flags on top of BASE (the row amp-6L-30ep)
AMX_RECIPE = [
    "--amp",
    "--epochs",
    "30",
    "--model-kwargs",
    *shape(embed_dim=128, depth=6, num_heads=4),
]

# configs/cifar10_cpu_bf16_avx512.yaml as it was first measured, as flags on top of BASE (the
# row amp-30ep; the config has since taken 34 epochs and weight decay 0.2: the row amp-34ep-wd0.2)
AVX512_RECIPE = ["--amp", "--epochs", "30"]

# name -> (flags after BASE, what the row is). The rows measured before a lever joined the recipe
# turn it off, so each row's command reproduces what was measured (--eval-interval 2 included).
EARLIER = ["--no-hflip-alternate", "--patch-drop-anneal", "0"]  # the last round's recipe
ROWS = {
    "adamw": (
        ["--opt", "adamw", *EARLIER, "--eval-interval", "2"],
        "AdamW for every parameter, random flips (the first round's recipe)",
    ),
    "muon": ([*EARLIER, "--eval-interval", "2"], "Muon, random flips (the last round's recipe)"),
    "muon-lr4e-3": ([*EARLIER, "--muon-lr", "4e-3"], "Muon at lr 4e-3, random flips"),
    "mimetic": (
        [*EARLIER, "--eval-interval", "2", "--mimetic-init"],
        "Muon, random flips, mimetic initialisation of attention",
    ),
    "alt-flip": (["--patch-drop-anneal", "0"], "Muon, alternating flips"),
    "recipe": (
        [],
        "configs/cifar10_cpu.yaml before its whitened start: + patch dropout annealed over the "
        "last 2 epochs",
    ),
    "sincos": (["--pos-embed", "sincos"], "the recipe + fixed 2-D sin-cos position embeddings"),
    "amp": (["--amp"], "the recipe in bfloat16 autocast (explicit attention; for AMX CPUs)"),
    "amp-40ep": (["--amp", "--epochs", "40"], "the recipe in bfloat16 autocast, 40 epochs"),
    # for AVX512-BF16 CPUs without AMX: a bf16 step ~1.5x float32's there, as with AMX, but
    # slower in absolute terms, so 30 epochs of the 4-block model instead of 6 blocks
    "amp-30ep": (AVX512_RECIPE, "the recipe in bfloat16 autocast, 30 epochs"),
    # Muon's Newton-Schulz iteration in bfloat16 too: ~6 ms less per step on that kind of CPU
    "amp-30ep-nsbf16": (
        [*AVX512_RECIPE, "--muon-ns-dtype", "bfloat16"],
        "bfloat16 autocast, 30 epochs, Muon's Newton-Schulz in bfloat16",
    ),
    # the patch-dropout anneal over the last 6 epochs instead of 2 (+0.46 on two seeds at 2)
    "amp-30ep-anneal6": (
        [*AVX512_RECIPE, "--patch-drop-anneal", "6"],
        "bfloat16 autocast, 30 epochs, patch dropout annealed over the last 6",
    ),
    "amp-30ep-dp0.1": (
        [*AVX512_RECIPE, "--drop-path", "0.1"],
        "bfloat16 autocast, 30 epochs, stochastic depth 0.1",
    ),
    # half the batch: twice the steps, so 24 epochs (estimated ~1.2x the time per image; ran 1.4x)
    "amp-bs32-24ep": (
        ["--amp", "--epochs", "24", "--batch-size", "32"],
        "bfloat16 autocast, 32 images a step per process, 24 epochs",
    ),
    # twice the batch: 1.2x the images/s in training_throughput.py (batch 64 -> 128, bf16, one
    # process; the optimizer step costs the same per step), so 35 epochs instead of 30
    "amp-bs128-35ep": (
        ["--amp", "--epochs", "35", "--batch-size", "128"],
        "bfloat16 autocast, 128 images a step per process, 35 epochs",
    ),
    # The recipe's model fits what crops and flips teach by ~epoch 24 (amp-bs128-35ep: 5 more
    # epochs, +0.0): CutMix on half the batches changes what there is to learn, at no step cost
    "amp-30ep-cutmix0.5": (
        [*AVX512_RECIPE, *CUTMIX_ON_HALF],
        "bfloat16 autocast, 30 epochs, CutMix (alpha 1) on half the batches",
    ),
    # twice the weight decay (Muon's and AdamW's, decoupled): the regulariser that costs no fit
    "amp-30ep-wd0.1": (
        [*AVX512_RECIPE, "--weight-decay", "0.1"],
        "bfloat16 autocast, 30 epochs, weight decay 0.1",
    ),
    # 0.1 gained +0.42 on two seeds and lowered the test loss without raising the train loss:
    # does twice as much again keep that trend?
    "amp-30ep-wd0.2": (
        [*AVX512_RECIPE, "--weight-decay", "0.2"],
        "bfloat16 autocast, 30 epochs, weight decay 0.2",
    ),
    # 0.2 gained again (82.10% against 0.1's 81.55%, seed 0, in a run since lost; its seed 1
    # then gave 81.76%, level with 0.1's): where does the trend stop?
    "amp-30ep-wd0.4": (
        [*AVX512_RECIPE, "--weight-decay", "0.4"],
        "bfloat16 autocast, 30 epochs, weight decay 0.4",
    ),
    # 0.4 fit less (train loss 0.38 against 0.29 at the end) and was still climbing fast at the
    # end (EMA +1.56 points over the last 6 epochs, against +0.41 at 0.05): heavier decay may
    # pay with more epochs. 34 epochs take ~25 min on the slower AVX512-BF16 host (22 for 30)
    "amp-34ep-wd0.2": (
        ["--amp", "--epochs", "34", "--weight-decay", "0.2"],
        "bfloat16 autocast, 34 epochs, weight decay 0.2",
    ),
    # The GPU speedrun's whitened patch embedding (airbench's first layer, for a ViT: +0.6-1.1
    # points on its CPU proxy at 100 epochs, +1.6 at epoch 10, docs/speedrun-proxy.md), asked of the
    # CPU recipes, whose short runs are where a better start should show most. On a Zen 4: ahead by
    # 0.16-0.89 to epoch 24, then 82.13% / 82.42% (83.79% / 84.28% shift TTA) against the recipe's
    # 82.60% / 82.11% (83.64% / 83.69%): level, -0.08 on the mean, the seeds disagreeing
    "amp-34ep-wd0.2-whiten": (
        ["--amp", "--epochs", "34", "--weight-decay", "0.2", "--patch-embed-init", "whiten"],
        "bfloat16 autocast, 34 epochs, weight decay 0.2, the patch embedding started whitened",
    ),
    # The same start on the float32 recipe's 20 epochs (Zen 4): 80.83% / 80.24% (82.36% / 82.21%
    # shift TTA) against the recipe's 80.24% / 79.74% (81.71% / 81.76%): +0.55 on the mean, both
    # seeds ahead at every evaluation
    "whiten": (
        ["--patch-embed-init", "whiten"],
        "the float32 recipe, the patch embedding started whitened (configs/cifar10_cpu.yaml)",
    ),
    "amp-34ep-wd0.4": (
        ["--amp", "--epochs", "34", "--weight-decay", "0.4"],
        "bfloat16 autocast, 34 epochs, weight decay 0.4",
    ),
    # On a Zen 5 host the bf16 Newton-Schulz iteration is 2.65x the float32 one (8.5 against
    # 22.6 ms, muon_step.py) and the bf16 step 1.29x faster with it (training_throughput.py):
    # the time it frees spent on what paid in amp-34ep-wd0.2, epochs (~the same wall time there)
    "amp-44ep-wd0.2-nsbf16": (
        ["--amp", "--epochs", "44", "--weight-decay", "0.2", "--muon-ns-dtype", "bfloat16"],
        "bfloat16 autocast, 44 epochs, weight decay 0.2, bf16 Newton-Schulz",
    ),
    # Two seeds of amp-44ep-wd0.2-nsbf16 ended 0.92 apart (83.50% / 82.58%), with train loss
    # 0.23 against test 0.51 at the end: the regulariser that cost no step, still climbing at 30
    # epochs (amp-30ep-cutmix0.5), given the 44. 83.65% / 83.43% (85.07% / 84.89% shift TTA):
    # configs/cifar10_cpu_bf16_avx512_fast.yaml until amp-60ep-wd0.2-nsbf16-cutmix0.5
    "amp-44ep-wd0.2-nsbf16-cutmix0.5": (
        fast_recipe(44),
        "bfloat16 autocast, 44 epochs, weight decay 0.2, bf16 Newton-Schulz, CutMix on half",
    ),
    # The CutMix row still climbed 1.3-1.4 points over its last 8 epochs; a GPU screen of this
    # recipe at fixed epochs (docs/cpu-experiments.md) put 60 epochs 1.4 points above 44, and CutMix
    # on every batch 1.7-2.0 below half: the rest of the 30 minutes spent on epochs. 84.53% /
    # 84.22% (85.85% / 85.60% shift TTA): configs/cifar10_cpu_bf16_avx512_fast.yaml
    "amp-60ep-wd0.2-nsbf16-cutmix0.5": (
        fast_recipe(60),
        "bfloat16 autocast, 60 epochs, weight decay 0.2, bf16 Newton-Schulz, CutMix on half",
    ),
    # Past the 30 minutes, to ask whether epochs keep paying (whether a faster step is worth
    # building): the 60-epoch row at 80. 84.57% (86.13% shift TTA) in 32.8 min: +0.04
    "amp-80ep-wd0.2-nsbf16-cutmix0.5": (
        fast_recipe(80),
        "bfloat16 autocast, 80 epochs, weight decay 0.2, bf16 Newton-Schulz, CutMix on half",
    ),
    # Capacity where CutMix leaves the model short of fitting (train loss 0.78 on mixed batches
    # after 60 epochs): the MLP twice as wide learned more per epoch in amp-r4-23ep, at 0.77x
    # the images/s, so 46 epochs for about the 60-epoch row's wall time: 83.96% (85.21% shift
    # TTA) in 23.7 min, 0.57 below the 60-epoch row's seed 0
    "amp-r4-46ep-nsbf16-cutmix0.5": (
        [*fast_recipe(46), "--model-kwargs", *shape(mlp_ratio=4.0)],
        "the 60-epoch row with the MLP twice as wide (0.81M parameters), 46 epochs",
    ),
    # What the last epochs teach: CutMix leaves the model short of fitting (train loss 0.78 on
    # mixed batches after 60 epochs) and 80 epochs bought nothing, so the last 8 of the 60
    # train on whole images and their own labels (timm's --mixup-off-epoch); no step time:
    # 84.63% (86.01% shift TTA) in 26.1 min, +0.10 over the same seed (EMA 84.6% after 56
    # epochs against 84.1%, the runs bit-identical to epoch 52); seed 1 84.47% (85.72%), +0.25
    "amp-60ep-wd0.2-nsbf16-cutmix0.5-off52": (
        [*fast_recipe(60), "--mixup-off-epoch", "52"],
        "the 60-epoch row with CutMix off for the last 8 epochs (--mixup-off-epoch 52)",
    ),
    # The two small gains stacked: CutMix off for the last 8 epochs (+0.17 on the mean of two
    # seeds) and label smoothing 0.1 (+0.17 on the mean of two seeds on the AMX recipe, amx-ls0.1):
    # 84.39% (85.76% shift TTA) in 26.0 min, 0.24 below CutMix off alone: smoothing costs here
    "amp-60ep-wd0.2-nsbf16-cutmix0.5-off52-ls0.1": (
        [*fast_recipe(60), "--mixup-off-epoch", "52", "--label-smoothing", "0.1"],
        "the 60-epoch row with CutMix off for the last 8 epochs and label smoothing 0.1",
    ),
    # CutMix off for longer: 16 clean epochs, where 44 epochs without CutMix at all overfit
    # (train loss 0.23 against test loss 0.51) but 8 clean ones moved EMA top-1 within 4 epochs:
    # 84.50% (86.03% shift TTA), level with 8 clean epochs and with none
    "amp-60ep-wd0.2-nsbf16-cutmix0.5-off44": (
        [*fast_recipe(60), "--mixup-off-epoch", "44"],
        "the 60-epoch row with CutMix off for the last 16 epochs (--mixup-off-epoch 44)",
    ),
    # The two regularisers rebalanced: weight decay 0.2 was chosen at 34 epochs without CutMix;
    # with CutMix on half the batches the model is short of fitting, so half the decay: 83.85%
    "amp-60ep-wd0.1-nsbf16-cutmix0.5": (
        fast_recipe(60, weight_decay=0.1),
        "the 60-epoch row with weight decay 0.1 instead of 0.2",
    ),
    # 0.1 ended 0.68 below 0.2 (83.85%, 85.71% shift TTA, 25.1 min; ahead to epoch 48, then
    # flat): the other side, the longer schedule given more decay: 83.97% (85.40% shift TTA),
    # 0.56 below the same seed, behind all the way: 0.2 stays
    "amp-60ep-wd0.3-nsbf16-cutmix0.5": (
        fast_recipe(60, weight_decay=0.3),
        "the 60-epoch row with weight decay 0.3 instead of 0.2",
    ),
    # Capacity at the 60-epoch row's wall time, paid for with a faster step: 6 blocks (0.81M
    # parameters) at 128 images a step per process ran 1,113 img/s against the recipe's 1,322 at
    # 64 (training_throughput.py, one process, bf16 Newton-Schulz, Zen 5), so 50 epochs: 84.30%
    # (85.59% shift TTA) in 25.2 min, level with the 60-epoch row (84.53% / 84.22%)
    "amp-6L-bs128-50ep-nsbf16-cutmix0.5": (
        six_blocks(50),
        "the 60-epoch row with 6 blocks (0.81M parameters), batch 128 a process, 50 epochs",
    ),
    # Capacity and epochs together: the 6-block row learned the most per epoch of any shape
    # (EMA 78.7% after 20 epochs against 76.0%) and ended level at 50; 60 epochs of it cost
    # ~30 minutes at today's step, so this row asks whether a faster step for it is worth building:
    # 84.75% (86.04% shift TTA) in 30.6 min, +0.22 over the 4-block row's seed 0, 5 minutes more
    "amp-6L-bs128-60ep-nsbf16-cutmix0.5": (
        six_blocks(60),
        "the 60-epoch row with 6 blocks (0.81M parameters), batch 128 a process",
    ),
    # The 6-block row's first half made cheaper: progressive resizing from 16 px (16, 20, 24, 28
    # px over the first 30 epochs: 16-49 tokens before patch dropout, not 64; the position
    # embeddings resampled on the fly), to bring its 30.6 minutes back inside the budget: 84.84%
    # (86.57% shift TTA) in 25.3 min, the epochs 22.6 minutes in all against 28.1; EMA top-1
    # behind until epoch 30 (70.8% against 77.0% after 16), ahead from epoch 36 on
    "amp-6L-bs128-60ep-nsbf16-cutmix0.5-prog16": (
        six_blocks(60, "--progressive-size", "16"),
        "the 6-block 60-epoch row, the first 30 epochs growing from 16 to 32 px",
    ),
    # CutMix off for the last 8 epochs (+0.17 on the 4-block row, mean of two seeds) on top:
    # 84.94% (86.45% shift TTA) in 25.5 min, +0.10 (bit-identical to the row above to epoch 52);
    # seed 1 84.88% (86.01%): mean 84.91% against the recipe's 84.38%, both seeds above both of its
    "amp-6L-bs128-60ep-nsbf16-cutmix0.5-prog16-off52": (
        six_blocks(60, "--progressive-size", "16", "--mixup-off-epoch", "52"),
        "the progressive 6-block row with CutMix off for the last 8 epochs",
    ),
    # The ~4.5 minutes left of the 30 spent on 8 more epochs (the ramp stays half the run: 34
    # epochs at 16-28 px) and evaluations every 12th epoch instead of every 4th (~1.5 min):
    # 85.52% / 84.59% / 85.05% on seeds 0-2 (86.67 / 85.99 / 86.20% shift TTA), 27.7 min idle;
    # configs/cifar10_cpu_bf16_avx512_fast.yaml since
    "amp-6L-bs128-68ep-nsbf16-cutmix0.5-prog16-off60-ei12": (
        six_blocks(
            68, "--progressive-size", "16", "--mixup-off-epoch", "60", "--eval-interval", "12"
        ),
        "the progressive 6-block row at 68 epochs, CutMix off for the last 8, evaluated every 12th",
    ),
    # The 30 minutes, not 22, spent on what the plateau asks for: CutMix (still climbing
    # at 30 epochs in amp-30ep-cutmix0.5) given 40 epochs, on top of weight decay 0.1
    "amp-40ep-wd0.1-cutmix0.5": (
        ["--amp", "--epochs", "40", "--weight-decay", "0.1", *CUTMIX_ON_HALF],
        "bfloat16 autocast, 40 epochs, weight decay 0.1, CutMix on half the batches",
    ),
    # the MLP twice as wide (ratio 4, 0.81M parameters) at the recipe's wall time: the bf16 step
    # ran 510 against 665 img/s (training_throughput.py, batch 64, one process), so 23 epochs
    "amp-r4-23ep": (
        ["--amp", "--epochs", "23", "--model-kwargs", *shape(mlp_ratio=4.0)],
        "bfloat16 autocast, MLP ratio 4 (0.81M parameters), 23 epochs",
    ),
    # Width and depth at about amp-40ep's wall time on an AMX host (training_throughput.py's
    # bf16 images/s of each shape set the epochs); head width stays 32 channels.
    "amp-192d-24ep": (
        ["--amp", "--epochs", "24", "--model-kwargs", *shape(embed_dim=192, depth=4, num_heads=6)],
        "bfloat16, 192 wide (1.2M parameters), 24 epochs",
    ),
    "amp-6L-30ep": (AMX_RECIPE, "bfloat16, 6 blocks deep (0.81M parameters), 30 epochs"),
    # regularisation on top of it: at 30 epochs its test loss rises while the train loss falls
    "amx-ls0.1": ([*AMX_RECIPE, "--label-smoothing", "0.1"], "the AMX recipe, label smoothing 0.1"),
    "amx-erase": ([*AMX_RECIPE, "--reprob", "0.25"], "the AMX recipe, random erasing 0.25"),
    # Repeated augmentation (DeiT's; Lee et al.'s 93.58% plain ViT trained with 3 repeats): each
    # image of an epoch's shuffle twice, one copy in each of the two processes (the other way
    # flipped), the same steps over half the distinct images an epoch; a lever for the GPU
    # speedrun's longer schedule, asked first at the CPU recipe's 20 epochs
    "aug-repeats2": (["--aug-repeats", "2"], "the recipe with each image twice an epoch"),
}


def command(flags: list[str], data: str, seed: int, out: Path) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += [f"--nproc_per_node={PROCESSES}"]
    run = ["train.py", *BASE, "--data", data, "--seed", str(seed), *flags]
    # --overwrite: a rerun of the benchmark replaces the rows it runs again
    return launcher + run + ["--output-dir", str(out), "--overwrite"]


def evaluate(run: Path, data: str) -> dict:
    """evaluate.py's report on all test images, with shift test-time augmentation beside it
    (rows measured before 2026-11-25 were reported with flip TTA)."""
    report = run / "eval-report.json"
    cmd = [sys.executable, "evaluate.py", "--checkpoint", str(run), "--data", data]
    cmd += ["--tta", "shift", "--json", str(report), "--overwrite"]  # the run's own report
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(f"evaluate.py failed: {lines[-1] if lines else done.returncode}")
    return json.loads(report.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--data", required=True, help="CIFAR-10 image folder (train/, test/)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/ablation"),
        help="the rows' runs and logs (relative to the current folder)",
    )
    args = parser.parse_args(argv)
    _cli.check_data(parser, args.data)
    # train.py and evaluate.py run in the repository (configs/ is found there): the paths they
    # are given mean what they meant as typed, here
    if Path(args.data).is_dir():  # not cifar10 or cifar100, which are names
        args.data = str(Path(args.data).absolute())
    args.out = args.out.absolute()

    for split in ("train", "test"):  # decode once into the cache every row reads
        load_split(args.data, split, cache_dir=Path(TrainConfig.cache_dir).expanduser())
    results = []
    for name in args.rows:
        for seed in args.seeds:
            flags, change = ROWS[name]
            out = args.out / f"{name}-seed{seed}"
            cmd = command(flags, args.data, seed, out)
            print("$", " ".join(cmd), flush=True)
            started = time.perf_counter()
            args.out.mkdir(parents=True, exist_ok=True)
            log_path = args.out / f"{name}-seed{seed}.log"
            with open(log_path, "w") as log:
                done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            if done.returncode != 0:  # its own words are in the log, not a traceback of ours
                sys.exit(f"{parser.prog}: row {name} seed {seed}: train.py failed (exit status "
                         f"{done.returncode}); see {log_path}")  # fmt: skip
            minutes = (time.perf_counter() - started) / 60
            try:
                report = evaluate(out, args.data)
            except RuntimeError as e:
                sys.exit(f"{parser.prog}: row {name} seed {seed}: {e}")
            results.append((name, seed, change, report, minutes))
            print(
                f"{name} seed {seed}: top-1 {100 * report['top1']:.2f}% "
                f"(shift TTA {100 * report['tta']['top1']:.2f}%) in {minutes:.1f} min",
                flush=True,
            )
    print(
        "\n| row | seed | change | test top-1 | with shift TTA | wall time |\n"
        "|---|---:|---|---:|---:|---:|"
    )
    for name, seed, change, report, minutes in results:
        print(
            f"| {name} | {seed} | {change} | {100 * report['top1']:.2f}% | "
            f"{100 * report['tta']['top1']:.2f}% | {minutes:.1f} min |"
        )


if __name__ == "__main__":
    _cli.run(main)
