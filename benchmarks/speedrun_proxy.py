"""The GPU speedrun's levers (regularisation, batch size, passes, capacity, heads, learning rate,
tokens, initialisation, optimizer), screened on a CPU at a fifth of the scale: a lead for which
of them a GPU run should measure first, not a GPU result.

    python benchmarks/speedrun_proxy.py --data ../shared/data/cifar10-jpg
    python benchmarks/speedrun_proxy.py --data ... --rows recipe reprob --seeds 0 1

The speedrun recipe (configs/cifar10_gpu_speedrun.yaml: 4.25M parameters, 50,000 images,
100-134 epochs of 98 steps) fits its training images by the second half of its run (the fourth
GPU run's training loss reached label smoothing's floor), and a CPU trains its model at ~240
images/s, so the whole recipe takes ~8 hours here. The proxy keeps what sets that regime, the
parameters per training image (~80) and the passes over them (100), at a fifth of the work:
the CPU recipes' 0.81M model (128 wide, 6 blocks) on 10,000 training images (stratified), 100
epochs of 78 steps of 128 images, every other setting the recipe's (bfloat16 autocast, Muon,
RandAugment on whole batches, CutMix on half the batches until the last 10 epochs, label
smoothing, stochastic depth, EMA; timm's patch embedding, where the recipe has since taken the
whitened one, row `whiten`), evaluated on all 10,000 test images. The first two rows
calibrate it: on an H200, RandAugment was behind until epoch ~35 of 100 and ahead from epoch 40
on (docs/gpu.md); a proxy that does not show that says nothing about the other rows.

Each row is a whole `train.py` command (printed, so it can be run alone), run in the current
folder (--data, --output and paths in --train-args as typed), one thread each (--threads),
--parallel of them at a time (one per core); a row that fails makes the exit status 1.
Accuracy does not depend on the machine's load (a seed's CPU run is deterministic); wall time
does. Prints the EMA's test top-1 every 10 epochs per row and seed, as a table, with each
row's mean over the seeds where it ran more than one. Run again, a row's run stopped part-way
(a session's end: a 300-epoch row takes ~1.6 hours with two threads) continues from its last
checkpoint, and a finished one is kept.
Every row measured so far, its curves, host and command: docs/speedrun-proxy.md.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _cli
import yaml

from vit.cli.flags import number_in
from vit.training.checkpoint import CONFIG_FILE, STATE_FILE
from vit.utils.ranges import AT_LEAST_1

ROOT = Path(__file__).resolve().parents[1]
# train.py and the recipe by their paths in this repository, so that a row's command runs in the
# user's folder: --data, --output and paths in --train-args mean what they meant as typed
TRAIN = ROOT / "train.py"
BASE = [
    "--config",
    str(ROOT / "configs" / "cifar10_gpu_speedrun.yaml"),
    "--device",
    "cpu",
    "--no-compile",  # inductor's CPU code trains this model no faster than eager (508 vs 542/s)
    "--no-graph-update",
    "--time-budget",
    "none",
    "--train-subset",
    "10000",
    "--epochs",
    "100",
    "--batch-size",
    "128",
    # the rows before `whiten` were measured before the recipe took the whitened patch
    # embedding: they keep timm's, and a row that wants it says so (the recipe is now `whiten`)
    "--patch-embed-init",
    "default",
    # ... and every row before `whiten-distill-soft` without the teacher the recipe has since
    "--distillation-type",
    "none",
    # ... and the teachers of the rows before `...-teacher-aa` trained without RandAugment
    "--teacher-aa",
    "none",
]
# the CPU recipes' 0.81M model: 128 wide, 6 blocks of 4 heads of 32, 64 patch tokens averaged
PROXY_MODEL = dict(embed_dim=128, depth=6, num_heads=4, global_pool="avg", class_token="false")


def planned_epochs(epochs: int) -> list[str]:
    """Flags for a run of `epochs` as --time-budget plans one from the recipe's first guess of
    100: its 5 warmup epochs kept, the last 10 epochs unmixed."""
    return ["--epochs", str(epochs), "--warmup-epochs", "5", "--mixup-off-epoch", str(epochs - 10)]


# AdamW for every weight instead of Muon: DeiT's weight decay, and the rate that ViTs trained on
# CIFAR commonly take at batches of 128
ADAMW = ["--opt", "adamw", "--lr", "1e-3", "--weight-decay", "0.05"]
# twice the proxy's batch with the learning rate x sqrt(2): the GPU screen's --batch-size 1024
# --lr 2.8e-3 at the proxy's scale
LARGER_BATCH = ["--batch-size", "256", "--lr", "2.8e-3"]
# the CPU recipe's patch dropout: a random half of the 64 patch tokens per training image, the
# last two epochs dropping a quarter, then none (three static shapes: three compilations on a GPU)
PATCH_DROP = ["--patch-drop", "0.5", "--patch-drop-anneal", "2"]
# the two augmentation leads of 100 epochs together: RandAugment with 3 ops, random erasing 0.25
MORE_AUGMENTATION = ["--aa-n", "3", "--reprob", "0.25"]
# what scripts/choose_speedrun_flags.py adds to the recipe's flags for a long run, spelt out here
# so that a measured row does not change when the chooser does (a test holds the two together)
CHOOSERS_SWITCH = ["--mimetic-init", "--patch-embed-init", "default", *MORE_AUGMENTATION]
# the proxy's CNN teacher for the distillation rows: half the width (64) of the GPU recipe's
# first teacher, whose conv stem, stages (w, 2w, 4w) and recipe they pin (the recipe's may change)
FIRST_TEACHER = [
    *("--teacher-stem", "conv", "--teacher-channel-mult", "1", "2", "4"),
    *("--teacher-recipe", "dawnbench"),
]
TEACHER = ["--teacher-width", "32", "--teacher-epochs", "20", *FIRST_TEACHER]


# the whitened patch embedding and airbench's network as the proxy's teacher (a whitening stem,
# stages 32, 128, 128 at the proxy's width), 20 epochs: the airbench-teacher rows, which differ
# in its recipe (and one in its width)
def airbench_net_teacher(width: int = 32) -> list[str]:
    return [
        *("--patch-embed-init", "whiten", "--teacher-width", str(width), "--teacher-epochs", "20"),
        *("--teacher-stem", "whiten", "--teacher-channel-mult", "1", "4", "4"),
    ]


# that teacher by airbench's recipe, trained under the student's RandAugment, soft distillation:
# the `...-teacher-aa` rows, which differ in its width and in the flags after it
def randaug_teacher(*flags: str, width: int = 32) -> list[str]:
    return [
        *airbench_net_teacher(width=width),
        *("--teacher-recipe", "airbench", "--teacher-aa", "randaug", "--distillation-type", "soft"),
        *flags,
    ]


# name -> (flags added to BASE, what the row is)
ROWS = {
    "no-randaug": (["--aa", "none"], "the fourth GPU run's recipe: no RandAugment"),
    "recipe": ([], "configs/cifar10_gpu_speedrun.yaml as it is (RandAugment, 2 ops)"),
    "reprob": (["--reprob", "0.25"], "+ random erasing on a quarter of the images"),
    "mixup": (["--mixup", "0.8"], "+ MixUp (alpha 0.8): mixed batches take MixUp or CutMix"),
    "repeats3": (["--aug-repeats", "3"], "+ repeated augmentation, 3 copies (DeiT)"),
    "drop-path0.2": (["--drop-path", "0.2"], "stochastic depth 0.2 instead of 0.1"),
    "drop-path0": (["--drop-path", "0"], "no stochastic depth (RandAugment may regularise enough)"),
    "randaug3": (["--aa-n", "3"], "RandAugment with 3 ops an image instead of 2"),
    "randaug3-reprob": (MORE_AUGMENTATION, "the two leads of seed 0 together"),
    # half the steps at the same epochs: what a GPU's larger batch (1,024) costs per epoch, where
    # a host-bound step of twice the images takes less than twice the time
    "batch256": (["--batch-size", "256"], "batches of 256, the learning rate as it is"),
    "batch256-lr": (LARGER_BATCH, "batches of 256, lr x sqrt(2)"),
    # more passes, as --time-budget plans them: the first guess's 5 warmup epochs kept, the last
    # 10 epochs unmixed (a faster GPU step gives the five minutes more epochs, not more images)
    "epochs200": (planned_epochs(200), "200 epochs instead of 100, as the time budget plans them"),
    # more capacity at the same passes: 2.25x the parameters, as the recipe's 256 wide with 4
    # heads of 64 would become 384 wide with 6 (on a host-bound GPU step a wider model costs
    # less than its arithmetic; the pipeline benchmark prices it there)
    "width192": ([], "192 wide with 6 heads of 32 (1.8M parameters) instead of 128 with 4"),
    # the one learning rate (Muon's and AdamW's) halved and doubled, and the weight decay halved:
    # free on a GPU, and tuned only at the CPU recipe's 20 epochs of light augmentation, never at
    # 100 (lr 4e-3 was behind there)
    "lr1e-3": (["--lr", "1e-3"], "the learning rate halved (1e-3)"),
    "lr4e-3": (["--lr", "4e-3"], "the learning rate doubled (4e-3)"),
    "wd0.05": (["--weight-decay", "0.05"], "weight decay 0.05 (DeiT's) instead of 0.1"),
    # more tokens: patches of 2 pixels instead of 4, 256 tokens instead of 64, at half the passes
    # (on this CPU a step costs ~6x; on a GPU whose step the host sets, far less: the pipeline
    # benchmark's shape "256d-8L-4h-r2-p2" prices it there), beside patch 4 at the same 50 epochs
    "epochs50": (planned_epochs(50), "50 epochs instead of 100, as the time budget plans them"),
    "patch2-epochs50": (planned_epochs(50), "patches of 2 pixels (256 tokens), 50 epochs"),
    # the attention layers started as a trained ViT's look (each head's W_q W_k^T near +I, W_v
    # W_proj near -I; Trockman & Kolter 2023: +5 points on CIFAR-10 with AdamW): free on any
    # device; behind early with Muon in the CPU recipe's 4 epochs, so run here to the end
    "mimetic": (["--mimetic-init"], "mimetic initialisation of attention"),
    "mimetic-epochs200": ([*planned_epochs(200), "--mimetic-init"], "mimetic, 200 epochs"),
    # the passes a step the GPU sets may give the speedrun (~3-5x the fifth run's ~90 epochs,
    # docs/speedrun-proxy.md): the initialisation gained with passes (level at 100 and 134, +1.45 at
    # 200), and choose_speedrun_flags.py then added it from 180. Does it gain at 300, or does the
    # model need capacity or regularisation there?
    "mimetic-epochs300": ([*planned_epochs(300), "--mimetic-init"], "mimetic, 300 epochs"),
    # the same arithmetic spent on capacity instead: 192 wide does ~2.2x the arithmetic a step of
    # 128 (the linear layers' width squared), so where the GPU sets the step's pace 150 epochs of
    # it take about what 300 of the proxy's model take. Does width buy more than the passes past
    # 150? (and the proxy's model at 150 epochs, to tell the width from the passes)
    "mimetic-epochs150": ([*planned_epochs(150), "--mimetic-init"], "mimetic, 150 epochs"),
    "width192-mimetic-epochs150": (
        [*planned_epochs(150), "--mimetic-init"],
        "192 wide, 6 heads of 32, mimetic, 150 epochs",
    ),
    # past 150 epochs the proxy's model gained little (78.01 -> 79.96 at 300, its training loss
    # 0.60 near label smoothing's floor) and width little more at 150: is it short of
    # regularisation there? The model's (stochastic depth 0.2, where 0 was level at 100 epochs)
    # against the images' (the two augmentation leads of 100 epochs: RandAugment 3 ops, erasing)
    "mimetic-epochs300-drop-path0.2": (
        [*planned_epochs(300), "--mimetic-init", "--drop-path", "0.2"],
        "mimetic, 300 epochs, stochastic depth 0.2",
    ),
    "mimetic-epochs300-randaug3-reprob": (
        [*planned_epochs(300), "--mimetic-init", *MORE_AUGMENTATION],
        "mimetic, 300 epochs, RandAugment 3 ops and erasing 0.25",
    ),
    # the images' regularisation led at 300 epochs (+0.99, ahead from epoch 110;
    # docs/speedrun-proxy.md), and the chooser added it with mimetic from 180 then: does it pay
    # there? beside mimetic-epochs200
    "mimetic-epochs200-randaug3-reprob": (
        [*planned_epochs(200), "--mimetic-init", *MORE_AUGMENTATION],
        "mimetic, 200 epochs, RandAugment 3 ops and erasing 0.25",
    ),
    # the passes the speedrun plans at the fourth GPU run's pace (~134 epochs, docs/gpu.md), with
    # and without it: level at 100 and ahead at 200, so which is it where the recipe runs?
    "epochs134": (planned_epochs(134), "134 epochs, as the time budget plans them"),
    "mimetic-epochs134": ([*planned_epochs(134), "--mimetic-init"], "mimetic, 134 epochs"),
    # what the GPU screen's first variant buys in the same five minutes: where the host sets the
    # step's pace, batches of twice the images take about as long as the recipe's, so ~1.5x the
    # epochs (200 against the recipe's ~134) at twice the batch and the learning rate x sqrt(2)
    "batch256-lr-epochs200": (
        [*planned_epochs(200), *LARGER_BATCH],
        "batches of 256, lr x sqrt(2), 200 epochs",
    ),
    # the screen's second step (--mimetic-init on the better of the two) where the first one won
    # on the proxy: mimetic was ahead at 200 epochs of 128 (+1.45) but level at 134, so does it
    # still pay at half the steps of twice the images?
    "mimetic-batch256-lr-epochs200": (
        [*planned_epochs(200), *LARGER_BATCH, "--mimetic-init"],
        "mimetic, batches of 256, lr x sqrt(2), 200 epochs",
    ),
    # the CPU recipe's patch dropout (1.96x its images/s on a CPU; the anneal +0.46 points at 20
    # epochs): where the GPU sets the step's pace, about half the arithmetic a step buys more
    # epochs in the same five minutes. What it costs at the same epochs (134), and what it
    # reaches at 1.5x of them (200)
    "patch-drop-epochs134": (
        [*planned_epochs(134), *PATCH_DROP],
        "half the tokens dropped in training, 134 epochs",
    ),
    "patch-drop-epochs200": (
        [*planned_epochs(200), *PATCH_DROP],
        "half the tokens dropped in training, 200 epochs",
    ),
    # more, narrower heads at the same width and passes: 8 heads of 16 where the recipe's 256 wide
    # would take 8 of 32 (Lee et al. 2021's CIFAR ViT has 12 heads of 16, the speedrun 4 of 64).
    # The same parameters and nearly the same arithmetic (attention over 64 tokens is a small share
    # of the step), so free on a GPU if it pays
    "heads8-epochs134": (planned_epochs(134), "8 heads of 16 instead of 4 of 32, 134 epochs"),
    # the two levers ahead at the recipe's passes (heads +0.66, mimetic +0.28): do they add up, so
    # that the GPU screen should run them together rather than one on the better of the other?
    "heads8-mimetic-epochs134": (
        [*planned_epochs(134), "--mimetic-init"],
        "8 heads of 16 and mimetic initialisation, 134 epochs",
    ),
    # the trend past 8: 16 heads of 8 at the same width and passes. Does narrowing the heads keep
    # paying, or does 8 sit at the top, so that the GPU screen tries 8 (of 32 at 256 wide) and
    # not more?
    "heads16-epochs134": (planned_epochs(134), "16 heads of 8 instead of 4 of 32, 134 epochs"),
    # 8 heads where the screen's first variant wins: the heads paid at 134 epochs of 128 (+0.66),
    # so do they still pay at 200 epochs of 256 (half the steps), the pace a host-bound GPU gives
    # twice the batch? If so the screen tries 8 heads on the larger batch, not only on the recipe
    "heads8-batch256-lr-epochs200": (
        [*planned_epochs(200), *LARGER_BATCH],
        "8 heads of 16, batches of 256, lr x sqrt(2), 200 epochs",
    ),
    # four times the proxy's batch, the learning rate x 2 (sqrt(4)): the GPU's --batch-size 2048
    # --lr 4e-3. On the fifth GPU run the GPU ran a kernel 22% of a host-bound step of 512, so a
    # step of 4x the images may cost little more than the recipe's: what does a quarter of the
    # steps cost at the same 100 epochs, beside batch256-lr's half of them?
    "batch512-lr": (["--batch-size", "512", "--lr", "4e-3"], "batches of 512, lr x 2"),
    # --augment-batches 16 (the GPU's host pays for the augmentation once every 16 steps): other
    # draws from the same distributions, so it should end within the seeds' spread of the recipe
    "augment16": (["--augment-batches", "16"], "the batches augmented 16 at a time"),
    # the patch embedding started as a whitening of the training images' patches (airbench's first
    # layer: in its ablations 94% in 22 epochs instead of 35): free on any device, and the fewer
    # epochs a lever needs, the sooner the speedrun's first minute gets somewhere
    "whiten": (["--patch-embed-init", "whiten"], "the patch embedding started whitened"),
    # the chooser then added mimetic init from 180 epochs, and initialisations have clashed
    # (8 heads and mimetic: each ahead alone, together 0.59 behind): do these two add up at 200?
    "whiten-mimetic-epochs200": (
        [*planned_epochs(200), "--mimetic-init", "--patch-embed-init", "whiten"],
        "the patch embedding whitened and mimetic initialisation, 200 epochs",
    ),
    # and where a run is short: a minute on a GPU whose step the host no longer sets may hold ~50
    # epochs (the goal's "90% in 60 s" row), where a head start counts most (beside epochs50)
    "whiten-epochs50": (
        [*planned_epochs(50), "--patch-embed-init", "whiten"],
        "the patch embedding started whitened, 50 epochs",
    ),
    # whitening alone at 200 epochs: beside mimetic its head start was gone by epoch 10 and the
    # two ended level with mimetic alone (78.40 against 78.64). Without mimetic, does the head
    # start last to 200, against mimetic's +1.45 over epochs200 (the chooser's choice there)?
    "whiten-epochs200": (
        [*planned_epochs(200), "--patch-embed-init", "whiten"],
        "the patch embedding started whitened, 200 epochs",
    ),
    # below 180 epochs the chooser then kept the recipe's whitened embedding and 2 RandAugment ops,
    # the long run's augmentation (3 ops, erasing 0.25) level at 100 epochs (+0.19) and ahead at
    # 200 (+0.78) and 300 (+0.99) with mimetic: does it pay with whitening at the ~134 epochs a
    # GPU step between the fifth run's and one the GPU sets would give the five minutes?
    "whiten-epochs134": (
        [*planned_epochs(134), "--patch-embed-init", "whiten"],
        "the patch embedding started whitened, 134 epochs",
    ),
    "whiten-epochs134-randaug3-reprob": (
        [*planned_epochs(134), "--patch-embed-init", "whiten", *MORE_AUGMENTATION],
        "whitened, 134 epochs, RandAugment 3 ops and erasing 0.25",
    ),
    # a teacher (docs/speedrun-proxy.md): none of the levers above is near the 4.4 points between
    # the fifth GPU run and 94%, and each plays with how the ViT learns a prior of locality from
    # 50,000 images. A small CNN has that prior and learns the task in a few epochs: trained first,
    # in the same command, it teaches the ViT each augmented image's class (DeiT's distillation, its
    # students passed their CNN teachers). The proxy's teacher, 32 wide (0.30M parameters, ~0.5 of
    # the proxy ViT's arithmetic a forward pass, as the GPU's 64 wide is ~0.4 of the recipe's), 20
    # epochs over the proxy's 10,000 images; beside `whiten` (the recipe)
    "whiten-distill-hard": (
        ["--patch-embed-init", "whiten", *TEACHER, "--distillation-type", "hard"],
        "the patch embedding whitened, hard distillation from a CNN trained first",
    ),
    "whiten-distill-soft": (
        ["--patch-embed-init", "whiten", *TEACHER, "--distillation-type", "soft"],
        "the patch embedding whitened, soft distillation from a CNN trained first",
    ),
    # and where a run is short (the goal's "90% in 60 s" row: ~50 epochs), beside whiten-epochs50
    "whiten-distill-soft-epochs50": (
        [
            *planned_epochs(50),
            "--patch-embed-init",
            "whiten",
            *TEACHER,
            "--distillation-type",
            "soft",
        ],
        "the patch embedding whitened, soft distillation, 50 epochs",
    ),
    # the students of 100 epochs ended level with their teacher (79.13%): is the teacher the
    # ceiling? The same teacher trained twice as long, at the same cost a step
    "whiten-distill-soft-epochs50-teacher40": (
        [
            *planned_epochs(50),
            "--patch-embed-init",
            "whiten",
            "--teacher-width",
            "32",
            "--teacher-epochs",
            "40",
            *FIRST_TEACHER,
            "--distillation-type",
            "soft",
        ],
        "the patch embedding whitened, soft distillation from a teacher of 40 epochs, 50 epochs",
    ),
    # is the teacher the student's ceiling? `whiten-distill-soft` with airbench's network as the
    # teacher at the proxy's width (a whitening stem, stages 32, 128, 128: 0.50M parameters),
    # which alone beat the first teacher by 2.6 points over 10,000 images (64 wide, batches of
    # 512; docs/speedrun-proxy.md)
    "whiten-distill-soft-airbench-teacher": (
        [*airbench_net_teacher(), "--teacher-recipe", "dawnbench", "--distillation-type", "soft"],
        "the patch embedding whitened, soft distillation from airbench's network as the teacher",
    ),
    # ... and that teacher trained by airbench's recipe (`--teacher-recipe airbench`, the GPU
    # recipe's teacher since): the strongest teacher at the proxy's width
    "whiten-distill-soft-airbench-recipe": (
        [*airbench_net_teacher(), "--teacher-recipe", "airbench", "--distillation-type", "soft"],
        "the patch embedding whitened, soft distillation from airbench's network and recipe",
    ),
    # ... that teacher trained under the student's RandAugment (`--teacher-aa randaug`): the
    # teachers above were right about the student's batches far less often than about the test
    # images, this one more often than any (benchmarks/teacher_targets.py; docs/speedrun-proxy.md)
    "whiten-distill-soft-airbench-recipe-teacher-aa": (
        randaug_teacher(),
        "... airbench's network and recipe as the teacher, trained under RandAugment",
    ),
    # ... and asked about each image and its mirror image (`--teacher-tta flip`): that teacher's
    # flip-averaged answers were 1.3-1.6 points more often right about the student's batches of
    # epoch 50 (seed 0; docs/speedrun-proxy.md)
    "whiten-distill-soft-airbench-recipe-teacher-aa-tta": (
        randaug_teacher("--teacher-tta", "flip"),
        "... that teacher's answers the mean of each image's and its mirror image's",
    ),
    # ... and twice as wide (stages 64, 256, 256: the GPU recipe's teacher, 4x the arithmetic):
    # the student followed the teacher that was right about its images (+1.16, two seeds);
    # does it follow one that is stronger everywhere? If it does, a wider teacher is the GPU's
    # next lever (its forward pass is inside every student step)
    "whiten-distill-soft-airbench-recipe-teacher-aa-width64": (
        randaug_teacher(width=64),
        "... that teacher 64 wide instead of 32 (the GPU recipe's width)",
    ),
    # ... the students of both teachers level (79.90% and 79.83%), each half listening to labels
    # that CutMix and RandAugment make wrong where the teacher is right (benchmarks/
    # teacher_targets.py): the student taught by the teacher alone (`--distillation-alpha 1`,
    # function matching, Beyer et al. 2022), by each width. If the labels held the student
    # back, the wider teacher's lead shows here
    "whiten-distill-soft-airbench-recipe-teacher-aa-alpha1": (
        randaug_teacher("--distillation-alpha", "1"),
        "... the student taught by that teacher alone, not by the labels",
    ),
    "whiten-distill-soft-airbench-recipe-teacher-aa-width64-alpha1": (
        randaug_teacher("--distillation-alpha", "1", width=64),
        "... by the 64-wide teacher alone, not by the labels",
    ),
    # the distilled student over 200 epochs, the passes a GPU step the host no longer sets may
    # give the five minutes: as the recipe ran below 180 epochs then (whitened, 2 RandAugment ops),
    # and as scripts/choose_speedrun_flags.py ran it from 180 (mimetic initialisation with
    # timm's embedding, 3 ops, erasing 0.25: the chooser's flags after the row's, as the chooser
    # puts them after the recipe's). Both were measured without a teacher only: does the switch
    # still pay with one, whose RandAugment follows the student's ops?
    "whiten-distill-soft-airbench-recipe-teacher-aa-epochs200": (
        randaug_teacher(*planned_epochs(200)),
        "... that teacher, 200 epochs (the recipe below the chooser's switch)",
    ),
    "mimetic-distill-soft-airbench-recipe-teacher-aa-epochs200-randaug3-reprob": (
        randaug_teacher(*planned_epochs(200), *CHOOSERS_SWITCH),
        "... that teacher, 200 epochs, mimetic, 3 ops, erasing 0.25 (the chooser's switch)",
    ),
    # ... and over the ~134 epochs of the fourth GPU run's pace, below the chooser's switch: with
    # the teacher the switched row led from epoch 85 of 200 on (+1.73 at 200), where without one
    # mimetic alone was level at 134. Does the teacher bring the switch below 180 epochs?
    "whiten-distill-soft-airbench-recipe-teacher-aa-epochs134": (
        randaug_teacher(*planned_epochs(134)),
        "... that teacher, 134 epochs (the recipe as it runs there)",
    ),
    "mimetic-distill-soft-airbench-recipe-teacher-aa-epochs134-randaug3-reprob": (
        randaug_teacher(*planned_epochs(134), *CHOOSERS_SWITCH),
        "... that teacher, 134 epochs, with the chooser's switch (mimetic, 3 ops, erasing 0.25)",
    ),
    # ... and over the recipe's 100 epochs, about the fifth GPU run's 88-92: from 80 of 134 epochs
    # the switched row led (+1.46 at 134, two seeds), where without a teacher mimetic alone was
    # level at 100. Does the switch pay with the teacher at the recipe's length too?
    "mimetic-distill-soft-airbench-recipe-teacher-aa-randaug3-reprob": (
        randaug_teacher(*CHOOSERS_SWITCH),
        "... that teacher, 100 epochs, with the chooser's switch (mimetic, 3 ops, erasing 0.25)",
    ),
    # ... and with a wider student (192 wide, 6 heads of 32: 2.2 times the arithmetic): without a
    # teacher it was 0.45 above at the same 100 epochs (two seeds). Where the host sets a GPU
    # step's pace (the fifth run: a kernel running 22% of it) the wider model's step costs about
    # what the recipe's does, so what width buys at the same epochs is what the GPU may take
    "width192-distill-soft-airbench-recipe-teacher-aa": (
        randaug_teacher(),
        "... that teacher, a student 192 wide with 6 heads of 32 (1.81M parameters)",
    ),
    # ... and that teacher's answers read at DeiT's temperature (`--distillation-tau 3`, its soft
    # distillation's) instead of 1: the student learns more of what the teacher ranks second and
    # third. The teacher, trained with label smoothing 0.2 by airbench's recipe, already answers
    # softly; is its ranking of the wrong classes worth more weight?
    "whiten-distill-soft-airbench-recipe-teacher-aa-tau3": (
        randaug_teacher("--distillation-tau", "3"),
        "... that teacher's answers softened at temperature 3 (DeiT's) instead of 1",
    ),
    # ... and both students over a planned 50 epochs, about what a minute of a GPU step the host
    # no longer sets holds (the goal's "90% in 60 s" row) and about the three minutes the fifth
    # run's pace gives (its "93% in 3 min" row): inside the 100-epoch schedule the wider student
    # led by 1.41 at epoch 50 (two seeds). Does the lead hold where the schedule ends there?
    "whiten-distill-soft-airbench-recipe-teacher-aa-epochs50": (
        randaug_teacher(*planned_epochs(50)),
        "... that teacher, 50 epochs (the recipe as it runs there)",
    ),
    "width192-distill-soft-airbench-recipe-teacher-aa-epochs50": (
        randaug_teacher(*planned_epochs(50)),
        "... that teacher, 50 epochs, a student 192 wide with 6 heads of 32",
    ),
    # ... and CutMix on every batch instead of half (`--mixup-prob 1`): without a teacher every
    # batch cost 2 points on the GPU at 44 and 60 epochs, CutMix's pasted label areas a wrong
    # answer where the pasted object is cut away. The teacher answers for the mixed image as it
    # is (Beyer et al. 2022's consistent teaching, whose function matching mixed every batch):
    # does mixing every batch pay once the targets follow the images? With the labels' half of
    # the loss, and without it (`--distillation-alpha 1`: the teacher alone, as in the paper)
    "whiten-distill-soft-airbench-recipe-teacher-aa-cutmix1": (
        randaug_teacher("--mixup-prob", "1"),
        "... that teacher, CutMix on every batch instead of half",
    ),
    "whiten-distill-soft-airbench-recipe-teacher-aa-alpha1-cutmix1": (
        randaug_teacher("--distillation-alpha", "1", "--mixup-prob", "1"),
        "... by that teacher alone, CutMix on every batch instead of half",
    ),
    # the paper's optimizer, with and without it: tells the initialisation from its clash with Muon
    "adamw": (ADAMW, "AdamW for every weight (lr 1e-3, weight decay 0.05) instead of Muon"),
    "adamw-mimetic": ([*ADAMW, "--mimetic-init"], "AdamW and mimetic initialisation"),
}
# 192 wide with 6 heads of 32 (1.81M parameters): the proxy's heads kept 32 wide
WIDTH192 = dict(embed_dim=192, num_heads=6)
# row -> PROXY_MODEL's changes
MODEL_CHANGES = {
    "width192": WIDTH192,
    "width192-mimetic-epochs150": WIDTH192,
    "width192-distill-soft-airbench-recipe-teacher-aa": WIDTH192,
    "width192-distill-soft-airbench-recipe-teacher-aa-epochs50": WIDTH192,
    "patch2-epochs50": dict(patch_size=2),
    "heads8-epochs134": dict(num_heads=8),
    "heads8-mimetic-epochs134": dict(num_heads=8),
    "heads16-epochs134": dict(num_heads=16),
    "heads8-batch256-lr-epochs200": dict(num_heads=8),
}
REPORT_EPOCHS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 150, 200, 250, 300)


def run_dir(out: Path, name: str, seed: int) -> Path:
    """A row's run folder for one seed (its log beside it: the same name and .log)."""
    return out / f"{name}-seed{seed}"


def command(
    name: str, data: str, out: Path, seed: int, threads: int = 1, extra: Sequence[str] = ()
) -> list[str]:
    flags, _ = ROWS[name]
    model = PROXY_MODEL | MODEL_CHANGES.get(name, {})
    return [
        sys.executable,
        str(TRAIN),
        *BASE,
        "--data",
        data,
        "--seed",
        str(seed),
        "--threads",
        str(threads),
        "--output-dir",
        str(run_dir(out, name, seed)),
        *flags,
        *extra,
        # --model-kwargs takes every item after it, so it comes last
        "--model-kwargs",
        *(f"{key}={value}" for key, value in model.items()),
    ]


def read_metrics(folder: Path) -> tuple[dict[int, float], dict[int, float]]:
    """The EMA's test top-1 (%) at each evaluated epoch of a run's metrics.csv, and the training
    loss at each epoch (near label smoothing's floor, 0.50, the run has memorised its images)."""
    with open(folder / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    ema = {int(row["epoch"]): 100 * float(row["ema_top1"]) for row in rows if row["ema_top1"]}
    return ema, {int(row["epoch"]): float(row["train_loss"]) for row in rows}


def main() -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--data", help="CIFAR-10 image folder (cifar10-jpg)")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    count = number_in(AT_LEAST_1)  # no row at once or no thread: nothing would run
    parser.add_argument("--parallel", type=count, default=2, help="rows at once")
    parser.add_argument(
        "--threads", type=count, default=1, help="threads a row (one each by default)"
    )
    parser.add_argument(
        "--train-args",
        type=shlex.split,
        default=[],
        help="train.py flags added to every row's command, e.g. '--no-amp --muon-ns-dtype "
        "float32' where the CPU has no AVX512-BF16 or AMX (bfloat16 emulated there trains "
        "many times slower); a run records them, so its --resume keeps them",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "runs" / "speedrun_proxy",
        help="a folder for the rows' runs and logs (default: runs/speedrun_proxy in this "
        "repository; a relative one is relative to the current folder)",
    )
    parser.add_argument(
        "--table-only", action="store_true", help="print the table of the runs in --output"
    )
    args = parser.parse_args()
    if args.table_only:
        if not args.output.is_dir():
            parser.error(f"--output {args.output}: no such folder; no runs to table")
        print_table(args)
        return
    if args.data is None:
        parser.error("--data is required to run the rows (the CIFAR-10 image folder)")
    _cli.check_data(parser, args.data, names=False)
    args.output.mkdir(parents=True, exist_ok=True)
    failed = run_rows(args)
    print_table(args)
    if failed:
        raise SystemExit(f"speedrun_proxy.py: {len(failed)} run(s) failed: {', '.join(failed)}")


def run_rows(args: argparse.Namespace) -> list[str]:
    """Every (row, seed) run, --parallel at a time, the next one started as soon as any ends: rows
    of different lengths (134 and 200 epochs) leave no core idle while the longer one runs. The
    runs that failed ('recipe seed 0')."""
    runs = [(name, seed) for seed in args.seeds for name in args.rows]
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = [pool.submit(run_one, args, name, seed) for name, seed in runs]
        ok = [future.result() for future in futures]
    return [f"{name} seed {seed}" for (name, seed), fine in zip(runs, ok, strict=True) if not fine]


def run_one(args: argparse.Namespace, name: str, seed: int) -> bool:
    """One row's train.py command for one seed, its output in the log beside its run folder. A
    run stopped part-way (a session's end) continues from its last checkpoint (train.py --resume,
    the log appended to); a finished one is kept as it is. Whether it ended well."""
    folder = run_dir(args.output, name, seed)
    if (folder / STATE_FILE).is_file():
        done = max(read_metrics(folder)[1], default=0)
        # the epochs the run was started with, as it recorded them
        if done >= yaml.safe_load((folder / CONFIG_FILE).read_text())["epochs"]:
            print(f"{name} seed {seed}: done ({done} epochs), kept", flush=True)
            return True
        cmd = [sys.executable, str(TRAIN), "--resume", str(folder), "--threads", str(args.threads)]
        mode = "a"
    else:
        cmd = command(
            name, args.data, args.output, seed, threads=args.threads, extra=args.train_args
        )
        mode = "w"
    print("$", " ".join(cmd[1:]), flush=True)
    # not with_suffix: "drop-path0.2-seed0" would lose ".2-seed0"
    with open(f"{folder}.log", mode) as log:
        status = subprocess.run(cmd, stdout=log, stderr=log, check=False).returncode
    if status != 0:
        print(f"{name}: train.py exited with {status}; see {log.name}", flush=True)
    return status == 0


def print_table(args: argparse.Namespace) -> None:
    lines = []  # (row, seed or "mean", top-1 by epoch, training loss by epoch)
    for name in args.rows:
        finished = []  # (top-1 by epoch, training loss by epoch) of each seed that has run
        for seed in args.seeds:
            folder = run_dir(args.output, name, seed)
            if (folder / "metrics.csv").is_file():
                finished.append(read_metrics(folder))
                lines.append((name, str(seed), *finished[-1]))
        if len(finished) > 1:
            # only the epochs every seed reached, so a run still going is not averaged in
            epochs = set.intersection(*(set(ema) for ema, _ in finished))
            mean = {e: sum(ema[e] for ema, _ in finished) / len(finished) for e in epochs}
            last = min(max(losses) for _, losses in finished)
            loss = sum(losses[last] for _, losses in finished) / len(finished)
            lines.append((name, "mean", mean, {last: loss}))
    # the columns up to the longest run's (a 100-epoch table has no empty 150 and 200), and each
    # run's last evaluated epoch (a 134-epoch run's end is not one of REPORT_EPOCHS)
    longest = max((epoch for *_, losses in lines for epoch in losses), default=0)
    lasts = {max(ema) for _, _, ema, _ in lines if ema}
    columns = sorted({e for e in REPORT_EPOCHS if e <= longest} | lasts) or list(REPORT_EPOCHS[:1])
    print("\nEMA test top-1 (%) at epoch:")
    print(f"| row | seed | {' | '.join(map(str, columns))} | last train loss |")
    print("|---|---:|" + "---:|" * (len(columns) + 1))
    for name, seed, ema, losses in lines:
        cells = " | ".join(f"{ema[e]:.2f}" if e in ema else "" for e in columns)
        print(f"| {name} | {seed} | {cells} | {losses[max(losses)]:.3f} |")


if __name__ == "__main__":
    _cli.run(main)
