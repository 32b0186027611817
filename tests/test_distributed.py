"""DistributedDataParallel: two CPU processes (gloo) equal one process on the same global batch."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import read_rows
from safetensors.torch import load_file

from vit.utils import locks
from vit.utils.process_group import DistInfo, from_env, peer_gone, resolve_device

ROOT = Path(__file__).resolve().parents[1]
# No MixUp/CutMix or stochastic depth: their random draws differ per process by design.
# Augmentation stays on: it is seeded per sample, so both runs see the same images.
DETERMINISTIC = ("--mixup", "0", "--cutmix", "0", "--drop-path", "0", "--reprob", "0.5")


def test_from_env_reads_torchrun_variables():
    assert from_env({}) == DistInfo()
    info = from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (3, 4, 1, False)
    assert info.enabled and not DistInfo().enabled


@pytest.mark.parametrize(
    ("name", "info", "expected"),
    [
        ("cuda", DistInfo(), "cuda:0"),  # one process: the current GPU
        ("auto", DistInfo(), "cuda:0"),
        ("cuda", DistInfo(rank=1, world_size=2, local_rank=1), "cuda:1"),  # each its own GPU
        ("cuda:1", DistInfo(), "cuda:1"),
    ],
)
def test_resolve_device_gives_cuda_an_index_as_set_device_requires(
    monkeypatch, name, info, expected
):
    """torch.cuda.set_device refuses a bare "cuda" (seen on an H200, torch 2.11: every command
    with --device cuda stopped with "Expected a torch.device with a specified index")."""
    chosen = []

    def set_device(device):
        if torch.device(device).index is None:
            raise ValueError(f"Expected a torch.device with a specified index, but got:{device}")
        chosen.append(str(device))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    assert str(resolve_device(name, info)) == expected
    assert chosen == [expected]


def test_two_processes_equal_one_on_the_same_global_batch(image_folder, tmp_path, tiny_args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    # one process, batch 8 == two processes, batch 4 each
    one = tiny_args(image_folder, single, 2, *DETERMINISTIC) + ["--batch-size", "8"]
    two = tiny_args(image_folder, ddp, 2, *DETERMINISTIC) + ["--batch-size", "4"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    for command in (
        torchrun + ["--nproc_per_node", "1", str(ROOT / "train.py"), *one],
        torchrun + ["--nproc_per_node", "2", str(ROOT / "train.py"), *two],
    ):
        done = subprocess.run(command, env=env, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-3000:]

    a, b = load_file(single / "model.safetensors"), load_file(ddp / "model.safetensors")
    for key in a:
        # The gradient all-reduce sums in another order, so weights agree up to rounding, about
        # 1e-7 here. One exception sets the tolerance: the key part of the qkv bias has a zero
        # true gradient (softmax ignores a shift shared by all keys), so its gradient is pure
        # rounding noise, which Adam rescales into real steps (~1e-5 after 12 steps of lr 3e-3).
        assert torch.allclose(a[key], b[key], rtol=0, atol=5e-5), key
        if not key.endswith("qkv.bias"):
            assert torch.allclose(a[key], b[key], rtol=0, atol=2e-6), key
    moved = load_file(single / "model.safetensors")["head.weight"].abs().sum()
    assert moved > 0  # the zero-initialised head trained: the comparison is not vacuous
    rows_a, rows_b = read_rows(single / "metrics.csv"), read_rows(ddp / "metrics.csv")
    for row_a, row_b in zip(rows_a, rows_b, strict=True):
        assert float(row_a["train_loss"]) == pytest.approx(float(row_b["train_loss"]), rel=1e-4)
        # evaluation is sharded across processes and the counts summed: same images, once each
        assert row_a["test_top1"] == row_b["test_top1"]
    # rank 0 alone writes the run folder: one TensorBoard event file, one metrics row per epoch
    assert len(list((ddp / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert len(rows_b) == 2


def test_a_head_fitted_by_the_probe_under_two_processes_is_one_processs(
    image_folder, tmp_path, tiny_args
):
    """--head-init probe under two processes: the features extracted by both, in one file both
    read (each looked in a temporary folder of its own: one failed on a file never written
    there, the other waited in an all-reduce for ever); the head is the one process's fit."""
    import vit

    torch.manual_seed(0)
    weights = tmp_path / "pretrained.safetensors"
    model = vit.create_model("vit_cifar_patch4_32", depth=2, embed_dim=32, num_heads=2)
    vit.save_weights(model, weights)
    probe = ("--pretrained", str(weights), "--head-init", "probe", "--trainable-blocks", "1")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "vit.distributed", "--standalone"]
    said = []
    for processes, batch in (("1", "8"), ("2", "4")):
        run = tmp_path / f"run{processes}"
        args = tiny_args(image_folder, run, 1, *DETERMINISTIC, *probe) + ["--batch-size", batch]
        command = [*torchrun, "--nproc_per_node", processes, str(ROOT / "train.py"), *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        said += re.findall(r"epoch 0/1 \(--head-init probe.*", done.stderr)
        # the features' folder beside the run folder is gone
        assert sorted(p.name for p in tmp_path.glob(f".{run.name}.*")) == []
    assert len(said) == 2 and said[0] == said[1], said


def train_py_after(prelude: str, folder: Path) -> Path:
    """A script that runs `prelude` and then train.py with its own arguments, in one process
    of torchrun's."""
    script = folder / "job.py"
    script.write_text(
        f"{prelude}\nimport runpy, sys\n"
        f"sys.argv = [{str(ROOT / 'train.py')!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')\n"
    )
    return script


def torchrun_two(
    script: Path, args: list[str], timeout: float = 300
) -> subprocess.CompletedProcess:
    """`python -m vit.distributed` running `script` with `args` in two CPU processes."""
    command = [sys.executable, "-m", "vit.distributed", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        command + [str(script), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    ("ending", "status", "said"),
    [
        ("sys.exit(3 * rank)", 3, ""),  # rank 1 said why itself (train.py's rank 0 would)
        (
            "rank and os.kill(os.getpid(), signal.SIGKILL)",
            137,  # 128 + 9, as a shell says
            "torchrun: the process of rank 1 was ended by SIGKILL",
        ),
    ],
    ids=["exit-status", "signal"],
)
def test_torchrun_answers_with_its_processes_status(tmp_path, ending, status, said):
    """`python -m vit.distributed` is torchrun returning the first failed process's exit status,
    without torchrun's own report (traceback, ChildFailedError, log lines)."""
    script = tmp_path / "job.py"
    script.write_text(f"import os, signal, sys\nrank = int(os.environ['RANK'])\n{ending}\n")
    done = torchrun_two(script, [])
    assert (done.returncode, done.stderr.strip()) == (status, said)


def test_a_run_started_by_vit_distributed_is_continued_by_it(tmp_path, monkeypatch):
    """The command a process names to continue its run (after Ctrl-C, or for another process
    count) is the launcher that started it: `python -m vit.distributed`, not plain torchrun,
    whose own report the package's launcher leaves out."""
    from vit.train import train_command

    script = tmp_path / "job.py"
    script.write_text("import os\nprint(os.environ.get('VIT_LAUNCHER'))\n")
    done = torchrun_two(script, [])
    assert done.stdout.split() == ["python", "-m", "vit.distributed"] * 2, done.stderr
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # a process torchrun started
    monkeypatch.delenv("VIT_LAUNCHER", raising=False)
    assert train_command("--resume r", 2).startswith("torchrun --standalone --nproc_per_node 2")
    monkeypatch.setenv("VIT_LAUNCHER", "python -m vit.distributed")
    said = train_command("--resume r", 2)
    assert said.startswith("python -m vit.distributed --standalone --nproc_per_node 2 ")


def test_a_loss_gone_nan_in_one_process_stops_both(image_folder, tmp_path, tiny_args):
    """Rank 1's loss turns NaN at its 3rd step; the check runs every HOST_SYNC_EVERY steps and
    at the epoch's end, so both processes stop together there (none waits forever in an
    all-reduce) and no checkpoint is written. Each names the first NaN loss it saw itself:
    rank 1 step 3, rank 0 step 4 (once rank 1's NaN gradients reached its weights); which
    one's line comes out first is a race between the two processes' exits."""
    script = train_py_after(
        "import os\n"
        "from vit.models.vision_transformer import VisionTransformer\n"
        "calls, forward_head = [0], VisionTransformer.forward_head\n"
        "def maybe_nan(self, x, pre_logits=False):\n"
        "    out = forward_head(self, x, pre_logits)\n"
        "    calls[0] += self.training\n"
        "    return out * float('nan') if self.training and calls[0] >= 3 else out\n"
        "if os.environ['RANK'] == '1':\n"
        "    VisionTransformer.forward_head = maybe_nan",
        tmp_path,
    )
    run = tmp_path / "run"
    args = tiny_args(image_folder, run, 1, *DETERMINISTIC) + ["--batch-size", "4"]
    done = torchrun_two(script, args)
    assert done.returncode == 1, done.stderr[-3000:]
    assert re.search(r"training loss became nan at epoch 1, step [34]/6; stopped\.", done.stderr)
    assert "No checkpoint was written" in done.stderr
    assert not (run / "training_state.pt").exists()


def test_a_run_folder_taken_after_its_probe_is_one_line_from_both_processes(
    image_folder, tmp_path, tiny_args
):
    """Two starts into one folder a second apart: the second's probe (train.py's folder_in_use)
    may find the folder free, and its rank 0 then refused the lock. Rank 0 went on to tell the
    others while rank 1 had entered start()'s first collective: each waited for the other, for
    ever. Here the probe never finds the lock, which this test holds."""
    script = train_py_after(
        "from vit.utils import locks\nlocks.holder = lambda path, folder: None", tmp_path
    )
    run = tmp_path / "run"
    with locks.hold(run, folder=True):
        done = torchrun_two(script, tiny_args(image_folder, run, 1), timeout=120)
        assert sorted(p.name for p in run.iterdir()) == [locks.LOCK_NAME]  # nothing written
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"train.py: error: --output-dir {run}: in use by process {os.getpid()}")


@pytest.mark.parametrize("rank", [0, 1])
def test_a_process_killed_while_training_is_named_by_torchrun_alone(
    image_folder, tmp_path, tiny_args, rank
):
    """The process killed at its 3rd step breaks the other's collective (gloo: "Connection
    closed by peer"), whose traceback came before torchrun's line; the survivor leaves quietly."""
    script = train_py_after(
        "import os, signal\n"
        "from vit.training import engine\n"
        "steps, train_step = [0], engine.train_step\n"
        "def killed_at_the_third(*args, **kwargs):\n"
        "    steps[0] += 1\n"
        "    if steps[0] == 3:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return train_step(*args, **kwargs)\n"
        f"if os.environ['RANK'] == '{rank}':\n"
        "    engine.train_step = killed_at_the_third",
        tmp_path,
    )
    args = tiny_args(image_folder, tmp_path / "run", 1, *DETERMINISTIC) + ["--batch-size", "4"]
    done = torchrun_two(script, args)
    said = [line for line in done.stderr.strip().splitlines() if " INFO " not in line]
    assert (done.returncode, said) == (
        137,
        [f"torchrun: the process of rank {rank} was ended by SIGKILL"],
    ), done.stderr[-3000:]


@pytest.mark.parametrize(
    ("message", "gone"),
    [
        ("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:34967.", True),
        ("[gloo/transport/tcp/pair.cc:534] Read error [::1]:5: Connection reset by peer.", True),
        ("mat1 and mat2 shapes cannot be multiplied (4x3 and 2x2)", False),
    ],
)
def test_only_a_collective_broken_by_a_process_that_ended_is_left_unsaid(message, gone):
    """A survivor's own error, while the others live, is still shown."""
    assert peer_gone(RuntimeError(message)) is gone
    assert not peer_gone(ValueError(message))


def test_no_process_leaves_its_ddp_model_to_the_interpreters_teardown(
    image_folder, tmp_path, tiny_args
):
    """DistributedDataParallel sits in reference cycles. Left to the interpreter's teardown,
    freeing it aborted a process now and then (SIGABRT: "terminate called without an active
    exception"), so joining the process group registers a collection at exit. With the cycle
    collector off, as when it happens not to run before the end, the check registered first
    (atexit runs handlers last in, first out) finds none left in either process."""
    script = train_py_after(
        "import atexit, gc, os, sys, torch\n"
        "gc.disable()\n"
        "def left():\n"
        "    ddp = torch.nn.parallel.DistributedDataParallel\n"
        "    n = sum(isinstance(o, ddp) for o in gc.get_objects())\n"
        "    print(f\"rank {os.environ['RANK']}: {n} DDP left\", file=sys.stderr)\n"
        "atexit.register(left)",
        tmp_path,
    )
    args = tiny_args(image_folder, tmp_path / "run", 1, *DETERMINISTIC) + ["--batch-size", "4"]
    done = torchrun_two(script, args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(re.findall(r"rank \d: \d+ DDP left", done.stderr)) == [
        "rank 0: 0 DDP left",
        "rank 1: 0 DDP left",
    ]


def test_help_under_torchrun_is_printed_once():
    """Every process reads the flags; help goes to stdout, which the other ranks keep: rank 0
    alone prints it (each printed it before)."""
    done = torchrun_two(ROOT / "train.py", ["--help"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("usage: train.py") == 1


def test_ctrl_c_before_the_processes_start_is_one_line(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while the launcher loads
    torch or waits at the rendezvous, which here waits for a second machine that never comes:
    the processes never start. It was KeyboardInterrupt's 30-40 line traceback."""
    script = tmp_path / "job.py"
    script.write_text("")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    command = [sys.executable, "-m", "vit.distributed", "--nnodes", "2", "--nproc_per_node", "1"]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", str(script)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen(
        command,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as in a terminal: a suite started in the background (nohup, CI) ignores SIGINT, and
        # its children inherit that, so the launcher would never hear the Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(3)
    os.killpg(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert (launcher.returncode, err) == (
        130,
        "python -m vit.distributed: interrupted before the processes started; nothing was "
        "written\n",
    )


@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_a_number_of_processes_torchrun_cannot_start_is_one_line(tmp_path, value):
    """torchrun answers these with a traceback (ValueError, AssertionError)."""
    script = tmp_path / "job.py"
    script.write_text("")
    command = [sys.executable, "-m", "vit.distributed", "--standalone", "--nproc_per_node", value]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command + [str(script)], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr.strip()) == (
        2,
        f"python -m vit.distributed: error: --nproc_per_node {value}: processes to start; "
        f"accepted: an integer >= 1, auto, cpu, or gpu where CUDA is available",
    )
