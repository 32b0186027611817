"""train.py through each entrance: `python train.py`, torchrun (as `scripts/train.sh` starts it,
through `python -m vit.distributed`) and `scripts/train.sh` itself. A mistake is one line and
exit status 2, leaving nothing behind; `--resume RUN` continues the run as it was started, its
number of processes included; Ctrl-C is one line naming the command that continues the run,
exit status 130 (issue 23)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torchvision
import yaml
from conftest import CONSOLE_SCRIPT, OfflineCifar

from vit.inference.precision import FAST_BF16_SPEEDUP

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SH = ROOT / "scripts" / "train.sh"
# A tiny run under the CPU recipe's flags (scripts/train.sh adds configs/cifar10_cpu.yaml).
TINY = (
    "--model-kwargs", "depth=2", "embed_dim=32", "num_heads=2", "--batch-size", "4",
    "--warmup-epochs", "1", "--eval-interval", "1", "--workers", "0", "--cache-dir", "none",
)  # fmt: skip


def venv_env() -> dict[str, str]:
    """The environment scripts/train.sh runs in here: this test's virtual environment (as
    scripts/test.sh, which CI runs, made it), the CPU recipe even on a GPU machine."""
    stamp = Path(sys.prefix, ".vit-installed")
    pyproject = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    installed = stamp.read_text().strip() if stamp.is_file() else None
    if sys.prefix == sys.base_prefix or installed != pyproject:  # else env.sh would install
        pytest.skip("scripts/train.sh needs the tests run in the venv scripts/env.sh installed")
    return {
        **os.environ,
        "VIT_VENV": sys.prefix,
        "PYTHONPATH": str(ROOT),
        "CUDA_VISIBLE_DEVICES": "",
    }


def train_sh(*args: str, data: Path | None = None, timeout: float = 300, cwd: Path | None = None):
    """`DATA=data bash scripts/train.sh ARGS` (no DATA if None), run to its end in `cwd`."""
    return subprocess.run(
        ["bash", str(TRAIN_SH), *args],
        cwd=cwd,
        env={**venv_env(), **({"DATA": str(data)} if data else {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def interrupt_after_first_checkpoint(command: list[str], run: Path, env: dict) -> tuple[int, str]:
    """Start `command` in its own process group, and Ctrl-C it (SIGINT to the group, as a
    terminal does) once the run's first checkpoint is written: (exit status, stderr)."""
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not (run / "training_state.pt").exists() and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=120)
    return process.returncode, err


def not_logged(err: str) -> list[str]:
    """stderr's lines other than rank 0's training log."""
    return [line for line in err.strip().splitlines() if " INFO " not in line]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--epochs", "0"), "train.py: error: --epochs 0: training epochs; accepted:"),
        (("--data", "missing"), "train.py: error: --data 'missing' is neither one of cifar10"),
    ],
    ids=["bad-flag", "missing-data"],
)
def test_a_mistake_under_two_processes_is_one_line_and_leaves_nothing(
    image_folder, tmp_path, flags, message
):
    """scripts/train.sh starts 2 processes: the flag is refused by both while reading the
    flags, the missing folder by rank 0 while loading, the other process following it."""
    run = tmp_path / "run"
    done = train_sh(*TINY, "--output-dir", str(run), *flags, data=image_folder)
    assert done.returncode == 2
    assert done.stderr.strip().startswith(message) and len(done.stderr.splitlines()) == 1, (
        done.stderr
    )
    assert done.stdout.startswith("[vit] no GPU") and "Traceback" not in done.stdout
    assert not run.exists()


def test_train_sh_reads_the_users_paths_where_it_is_run(image_folder, tmp_path):
    """DATA, --output-dir and --resume are read from the user's directory, not the repository's
    (env.sh changed into it); the recipe's config is found all the same."""
    data = os.path.relpath(image_folder, tmp_path)
    done = train_sh(*TINY, "--epochs", "2", "--output-dir", "run", data=Path(data), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "model.safetensors").is_file()
    again = train_sh("--resume", "run", cwd=tmp_path)  # its processes read from run/config.yaml
    assert "2 process(es)" in again.stdout and again.returncode == 2
    [said] = not_logged(again.stderr)
    assert said.startswith("train.py: error: --resume run: the run has done 2 epochs")


@pytest.mark.parametrize("nproc", ["abc", "0", "-1", "3", "512", "9" * 20])
def test_an_nproc_train_sh_cannot_use_is_one_line_before_any_work(tmp_path, nproc):
    """It was bash's own error ("abc: unbound variable", "division by 0") after the GPU probe
    and the bfloat16 timing (7-9 s), and 3 (no recipe's divisor) was refused only after them;
    nothing is printed on stdout before the line now."""
    command = ["bash", str(TRAIN_SH), "--epochs", "1"]
    env = {**venv_env(), "NPROC": nproc}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        f"[vit] NPROC={nproc}: processes on a CPU; accepted: an integer >= 1 that divides the "
        f"recipe's images per step (128; 256 for bfloat16-avx512-fast)\n",
    )


def test_train_sh_resuming_in_another_nproc_than_the_runs_is_one_line(tmp_path):
    """train.py refused it advising `bash scripts/train.sh --resume RUN`, which NPROC, still
    set, made fail again."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("processes: 2\n")
    command = ["bash", str(TRAIN_SH), "--resume", "run"]
    env = {**venv_env(), "NPROC": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (
        2,
        "[vit] NPROC=1: run trains in 2 process(es); leave NPROC out (a resumed run takes its "
        "own number) or set NPROC=2\n",
    )


def test_train_sh_help_is_its_settings_then_train_py_help_once(tmp_path):
    done = train_sh("--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: [DATA=...] [NPROC=N]") and "CPU_RECIPE" in done.stdout
    assert done.stdout.count("usage: train.py") == 1


def test_cpu_recipe_follows_the_machine_unless_named(image_folder, tmp_path):
    """scripts/train.sh picks the bfloat16 recipe where the CPU has AMX; where it has
    AVX512-BF16 alone, the fast form if bfloat16 products measure FAST_BF16_SPEEDUP x float32's
    (the figure it prints), else the plain one; float32 elsewhere. CPU_RECIPE names one, and
    anything else is one line."""
    flags = (
        set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    )
    done = train_sh(*TINY, "--epochs", "0", data=image_folder)  # refused after the choice
    speedup = re.search(r"bfloat16 matrix products ([0-9.]+)x float32's here", done.stdout)
    if "amx_tile" in flags:  # the kernel's names, read apart from torch's probes
        machine, config = "bfloat16", "configs/cifar10_cpu_bf16.yaml"
    elif "avx512_bf16" in flags:
        assert speedup, done.stdout  # measured, and said
        fast = float(speedup.group(1)) >= FAST_BF16_SPEEDUP
        machine = "bfloat16-avx512-fast" if fast else "bfloat16-avx512"
        config = f"configs/cifar10_cpu_bf16_avx512{'_fast' if fast else ''}.yaml"
    else:
        machine, config = "float32", "configs/cifar10_cpu.yaml"
        assert speedup is None  # nothing to measure
    chosen = f"[vit] no GPU: the {machine} CPU recipe, {config}"
    assert any(line.startswith(chosen) for line in done.stdout.splitlines()), done.stdout

    run = tmp_path / "run"
    env = {**venv_env(), "DATA": str(image_folder), "CPU_RECIPE": "bfloat16"}
    command = ["bash", str(TRAIN_SH), *TINY, "--epochs", "2", "--output-dir", str(run)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "configs/cifar10_cpu_bf16.yaml" in done.stdout
    assert yaml.safe_load((run / "config.yaml").read_text())["amp"] is True

    env["CPU_RECIPE"] = "fp32"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == (
        "[vit] CPU_RECIPE=fp32: accepted: auto (the default), float32, bfloat16, bfloat16-avx512, "
        "bfloat16-avx512-fast"
    )


@pytest.mark.parametrize(
    ("name", "may_change"),
    [
        ("cifar10_cpu_bf16", {"model_kwargs"}),
        ("cifar10_cpu_bf16_avx512", {"weight_decay"}),
        (
            "cifar10_cpu_bf16_avx512_fast",
            {"weight_decay", "muon_ns_dtype", "cutmix", "mixup_prob", "mixup_off_epoch"}
            | {"model_kwargs", "batch_size", "progressive_size", "eval_interval"},
        ),
    ],
)
def test_the_bfloat16_cpu_recipes_are_the_float32_one_with_autocast_and_more_epochs(
    name, may_change
):
    """The bfloat16 recipes differ from configs/cifar10_cpu.yaml only where the measurement
    says they should (docs/cpu-recipe.md): precision, epochs, (with AMX) the model's depth and
    (with AVX512-BF16 alone) the weight decay; where bf16 products run fastest, also CutMix, the
    depth, the batch and progressive resizing. The float32 recipe's whitened patch embedding is
    its own: measured level on the Zen 4 recipe, not measured on the other two."""
    float32 = yaml.safe_load((ROOT / "configs" / "cifar10_cpu.yaml").read_text())
    bfloat16 = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    changed = {
        key for key in float32.keys() | bfloat16.keys() if float32.get(key) != bfloat16.get(key)
    }
    every_recipe = {"amp", "epochs", "patch_embed_init"}  # where any of them may differ
    assert changed <= every_recipe | may_change and bfloat16["amp"] is True
    assert bfloat16["epochs"] > float32["epochs"]


def test_two_process_run_stops_on_ctrl_c_and_resumes_as_started(image_folder, tmp_path):
    run = tmp_path / "run"
    command = ["bash", str(TRAIN_SH), *TINY, "--epochs", "5", "--output-dir", str(run)]
    status, err = interrupt_after_first_checkpoint(
        command, run, {**venv_env(), "DATA": str(image_folder)}
    )
    epoch = torch.load(run / "training_state.pt", weights_only=True)["epoch"]
    assert status == 130 and 1 <= epoch < 5
    assert not_logged(err) == [
        f"train.py: interrupted; {run} stopped after epoch {epoch} of 5 (its last checkpoint): "
        f"continue it with bash {TRAIN_SH} --resume {run}"
    ]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["processes"], config["batch_size"], config["opt"]) == (2, 4, "muon")

    # plain python would continue it in one process, with half the images a step: refused
    alone = subprocess.run(
        [sys.executable, "train.py", "--resume", str(run)],
        cwd=ROOT,
        env=venv_env(),
        capture_output=True,
        text=True,
    )
    assert alone.returncode == 2 and alone.stderr.strip() == (
        f"train.py: error: --resume {run}: the run trains in 2 process(es) of 4 images (8 a "
        f"step), this start has 1; continue it with torchrun --standalone --nproc_per_node 2 "
        f"train.py --resume {run}"
    )

    # scripts/train.sh with nothing else given: the run's own settings and 2 processes,
    # none of the recipe's flags (its --batch-size 64, --data cifar10 would be refused)
    done = train_sh("--resume", str(run))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming" in done.stdout and "2 process(es)" in done.stdout
    state = torch.load(run / "training_state.pt", weights_only=True)
    assert state["epoch"] == 5 and len(state["rng"]) == 2  # every epoch, both processes
    assert yaml.safe_load((run / "config.yaml").read_text()) == config  # no `resume` key in it


def test_single_process_ctrl_c_is_one_line_and_resumable(image_folder, tmp_path, tiny_args):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "train.py", *tiny_args(image_folder, run, 5)]
    status, err = interrupt_after_first_checkpoint(command, run, env)
    epoch = torch.load(run / "training_state.pt", weights_only=True)["epoch"]
    assert status == 130 and "Traceback" not in err
    assert not_logged(err) == [
        f"train.py: interrupted; {run} stopped after epoch {epoch} of 5 (its last checkpoint): "
        f"continue it with python train.py --resume {run}"
    ]
    again = subprocess.run(
        [sys.executable, "train.py", "--resume", str(run)], cwd=ROOT, env=env, capture_output=True
    )
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert torch.load(run / "training_state.pt", weights_only=True)["epoch"] == 5


def test_a_two_process_run_without_a_checkpoint_is_started_again_as_said(
    image_folder, tmp_path, train_script, tiny_args, capsys
):
    """A run of two processes stopped in its first epoch (its config.yaml written, no
    checkpoint): --resume names the command that starts it again, its launcher and number of
    processes included (it named only the flags, which python train.py refuses: --processes 2),
    and that command, run as printed, trains it."""
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1)) == 0
    (run / "training_state.pt").unlink()
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "processes": 2}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        train_script.main(["--resume", str(run)])
    assert refused.value.code == 2
    command = (
        f"torchrun --standalone --nproc_per_node 2 train.py --config {run}/config.yaml "
        f"--output-dir {run} --overwrite"
    )
    assert capsys.readouterr().err.strip() == (
        f"train.py: error: --resume {run}: no checkpoint there (the run stopped before its "
        f"first: training_state.pt is written every --checkpoint-interval epochs, each by "
        f"default); start that run again with {command}, or resume another folder"
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # this environment's torchrun
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    again = subprocess.run(
        torchrun + command.split()[1:], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert torch.load(run / "training_state.pt", weights_only=True)["epoch"] == 1


@pytest.mark.parametrize("entrance", ["python train.py", "python -m vit.train", "vit-train"])
def test_the_commands_advised_to_go_on_with_a_run_are_the_entrance_used(entrance, tmp_path):
    """The command that starts a run again or continues it is spelt as the user started this
    one: train.py's, which a pip install does not have, only for `python train.py`;
    `python -m vit.train` and `vit-train` name themselves, and torchrun runs the module (-m)."""
    (tmp_path / "vit-train").write_text(CONSOLE_SCRIPT.format(module="vit.train"))
    command, name, program = {
        "python train.py": ([sys.executable, "train.py"], "train.py", "train.py"),
        "python -m vit.train": ([sys.executable, "-m", "vit.train"], entrance, "-m vit.train"),
        "vit-train": ([sys.executable, str(tmp_path / "vit-train")], entrance, "-m vit.train"),
    }[entrance]
    alone = "python train.py" if entrance == "python train.py" else entrance
    unstarted, two = tmp_path / "unstarted", tmp_path / "two"
    for run, processes in ((unstarted, 1), (two, 2)):
        run.mkdir()
        (run / "config.yaml").write_text(f"processes: {processes}\nbatch_size: 4\n")
    (two / "training_state.pt").touch()  # a checkpoint to resume, as far as the start checks
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    said = [
        subprocess.run(
            [*command, "--resume", str(run)], cwd=ROOT, env=env, capture_output=True, text=True
        )
        for run in (unstarted, two)
    ]
    assert [done.returncode for done in said] == [2, 2]
    again = f"{alone} --config {unstarted}/config.yaml --output-dir {unstarted} --overwrite"
    assert said[0].stderr.startswith(f"{name}: error: --resume {unstarted}: no checkpoint there")
    assert (
        said[0]
        .stderr.strip()
        .endswith(f"start that run again with {again}, or resume another folder")
    )
    resume = f"torchrun --standalone --nproc_per_node 2 {program} --resume {two}"
    assert said[1].stderr.strip() == (
        f"{name}: error: --resume {two}: the run trains in 2 process(es) of 4 images (8 a step), "
        f"this start has 1; continue it with {resume}"
    )
    if entrance == "python -m vit.train":  # torchrun runs the module as printed
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
        help = subprocess.run(
            [*torchrun, *resume.split()[1:-2], "--help"], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert help.returncode == 0, help.stderr[-3000:]
        assert help.stdout.count("usage: python -m vit.train ") == 1  # rank 0's


def test_resuming_a_finished_run_asks_for_more_epochs(
    image_folder, tmp_path, train_script, tiny_args, capsys
):
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1)) == 0
    capsys.readouterr()
    assert train_script.main(["--resume", str(run)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"train.py: error: --resume {run}: the run has done 1 epochs, all of the 1 asked for; "
        f"give --epochs N (more than 1) to extend it"
    )
    assert train_script.main(["--resume", str(run), "--epochs", "2"]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["epochs"] == 2


def test_a_number_of_processes_given_must_be_the_number_started(
    image_folder, tmp_path, train_script, tiny_args, capsys
):
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1, "--processes", "2")) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .startswith(
            "train.py: error: --processes 2: this start has 1 process(es); start 2 (torchrun "
            "--nproc_per_node 2)"
        )
    )
    assert not run.exists()


def test_a_failed_download_leaves_no_data_folder(
    tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """Without internet, CIFAR's download fails after torchvision made its folder."""

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", OfflineCifar)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    args = tiny_args("cifar10", run, 1) + ["--data-root", "downloads/cifar"]
    assert train_script.main(args) == 2
    assert "could not be downloaded" in capsys.readouterr().err
    assert not (tmp_path / "downloads").exists() and not run.exists()
    kept = tmp_path / "mine"  # a folder the user had is never removed
    kept.mkdir()
    assert train_script.main(tiny_args("cifar10", run, 1) + ["--data-root", str(kept)]) == 2
    assert kept.is_dir()


def test_cifar_missing_under_no_download_says_so(tmp_path, train_script, tiny_args, capsys):
    """Not "could not be downloaded (... use download=True ...)": no download was tried."""
    empty = tmp_path / "empty"
    empty.mkdir()
    args = tiny_args("cifar10", tmp_path / "run", 1) + ["--no-download", "--data-root", str(empty)]
    assert train_script.main(args) == 2
    assert capsys.readouterr().err == (
        f"train.py: error: --data cifar10 is not in {empty} (no complete copy there), and "
        f"downloading it is off (--no-download): drop --no-download to download it there, or "
        f"point --data-root at a copy\n"
    )
    assert not (tmp_path / "run").exists()
