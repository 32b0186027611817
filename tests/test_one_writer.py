"""One writer per run folder and per output file (vit.utils.locks): a second train.py on a
folder another process trains into (plain, --resume, --overwrite), a second evaluate.py on the
same report, a second `vit.predict --features` on the same file (or --explain folder), a second
`vit.export` of the same file, are each refused in one line
naming the folder or file and the process holding it, and the first finishes with its own files;
a killed run leaves no lock that stops its --resume.

The first process is paused (SIGSTOP) once it holds its lock, so that the second always meets
it at work, however fast or slow the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CLASSES
from safetensors.torch import load_file

import vit
from vit.inference.embed import read_features
from vit.utils import locks

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(locks.fcntl is None, reason="no flock on this system")


def start(*command: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def paused_once_it_holds(process: subprocess.Popen, lock: Path, timeout: float = 120) -> None:
    """Wait until `process` has written its PID into `lock`, then stop it there (SIGSTOP)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock.is_file() and lock.read_text().split("\n")[0] == str(process.pid):
            process.send_signal(signal.SIGSTOP)
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"{lock} never named process {process.pid}")


def resumed(process: subprocess.Popen) -> tuple[int, str]:
    process.send_signal(signal.SIGCONT)
    _, err = process.communicate(timeout=600)
    return process.returncode, err


def refusal(err: str, place: Path, pid: int) -> bool:
    line = err.strip().splitlines()[-1]
    return f"{place}: in use by process {pid}" in line


def test_a_second_train_py_on_a_run_folder_is_refused_and_the_first_keeps_its_run(
    image_folder, tmp_path, train_script, tiny_args, capsys
):
    run = tmp_path / "run"
    first = start("train.py", *tiny_args(image_folder, run, 3))
    paused_once_it_holds(first, run / locks.LOCK_NAME)
    try:
        for argv in (
            tiny_args(image_folder, run, 2),  # plain: the folder may hold no run yet
            tiny_args(image_folder, run, 2, "--overwrite"),
            ["--resume", str(run), "--epochs", "5"],
        ):
            listing = sorted(p.name for p in run.iterdir())
            with pytest.raises(SystemExit) as refused:
                train_script.main(argv)
            assert refused.value.code == 2
            assert refusal(capsys.readouterr().err, run, first.pid), argv
            assert sorted(p.name for p in run.iterdir()) == listing  # it wrote nothing
    finally:
        code, err = resumed(first)
    assert code == 0, err
    assert not (run / locks.LOCK_NAME).exists()  # released with the run
    reference = tmp_path / "reference"
    assert train_script.main(tiny_args(image_folder, reference, 3)) == 0
    ours, theirs = load_file(run / "model.safetensors"), load_file(reference / "model.safetensors")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert len((run / "metrics.csv").read_text().strip().splitlines()) == 1 + 3


def test_a_killed_run_leaves_no_lock_that_stops_its_resume(
    image_folder, tmp_path, train_script, tiny_args
):
    run = tmp_path / "run"
    first = start("train.py", *tiny_args(image_folder, run, 3))
    deadline = time.monotonic() + 120
    while not (run / "training_state.pt").is_file() and time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (run / locks.LOCK_NAME).is_file()  # the file stays; the OS dropped the lock itself
    assert locks.holder(run, folder=True) is None
    assert train_script.main(["--resume", str(run)]) == 0
    assert not (run / locks.LOCK_NAME).exists()


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    model = vit.create_model("vit_cifar_patch4_32", depth=1, embed_dim=32, num_heads=2)
    model.reset_classifier(len(CLASSES))
    return vit.save_weights(model, tmp_path / "tiny.safetensors", class_names=list(CLASSES))


def test_a_second_predict_on_one_features_file_is_refused(image_folder, checkpoint, tmp_path):
    features = tmp_path / "features.npz"
    command = ["-m", "vit.predict", str(image_folder), "--checkpoint", str(checkpoint)]
    command += ["--features", str(features), "--batch-size", "4", "--workers", "0"]
    first = start(*command)
    paused_once_it_holds(first, locks.lock_file(features, folder=False))
    try:
        second = start(*command, "--overwrite")
        _, err = second.communicate(timeout=600)
        assert second.returncode == 2
        assert refusal(err, features, first.pid) and err.strip().startswith("error: --features")
    finally:
        code, err = resumed(first)
    assert code == 0, err
    paths, rows = read_features(features)
    assert len(paths) == len(rows) == 3 * 22  # every image of the folder, once
    assert not locks.lock_file(features, folder=False).exists()


def test_a_second_evaluate_on_one_report_is_refused(
    image_folder, checkpoint, tmp_path, evaluate_script, capsys
):
    out = tmp_path / "eval"
    command = ["--checkpoint", str(checkpoint), "--data", str(image_folder), "--output-dir"]
    first = start("evaluate.py", *command, str(out), "--workers", "0")
    paused_once_it_holds(first, out / locks.LOCK_NAME)
    try:
        assert evaluate_script.main([*command, str(out), "--workers", "0"]) == 2
        assert refusal(capsys.readouterr().err, out, first.pid)
    finally:
        code, err = resumed(first)
    assert code == 0, err
    assert (out / "report.json").is_file() and not (out / locks.LOCK_NAME).exists()


def test_a_second_export_of_one_file_is_refused_and_writes_nothing(checkpoint, tmp_path):
    """vit.export held no lock: two exports of one file each wrote it, the last rename won."""
    out = tmp_path / "model.pth"
    command = ["-m", "vit.export", str(checkpoint), "--torchvision", str(out)]
    first = start(*command)
    paused_once_it_holds(first, locks.lock_file(out, folder=False))
    try:
        second = start(*command, "--hf", str(tmp_path / "hf"), "--overwrite")
        _, err = second.communicate(timeout=600)
        assert second.returncode == 2 and err.count("\n") == 1
        assert refusal(err, out, first.pid) and err.startswith(f"error: --torchvision {out}")
        assert not (tmp_path / "hf").exists()
    finally:
        code, err = resumed(first)
    assert code == 0, err
    assert out.is_file() and not locks.lock_file(out, folder=False).exists()


def test_the_lock_holder_removes_what_a_killed_writer_left_beside_its_output(tmp_path):
    """A SIGKILLed writer leaves its temporary file or folder (`.NAME.XXXXXXXX.tmp`, `.old`):
    nobody removed them, as another writer might have owned them. The lock's holder is the
    only writer of NAME: it removes them, and nothing else beside NAME."""
    out = tmp_path / "model.onnx"
    dead = [tmp_path / ".model.onnx.k2_9abcd.tmp", tmp_path / ".model.onnx.q8zz0_1x.old"]
    dead[0].write_bytes(b"half an export")
    (dead[1] / "model.onnx").mkdir(parents=True)
    kept = [
        tmp_path / ".model.onnx.parts",  # predict's resumable shards
        tmp_path / ".model.onnx.data.k2_9abcd.tmp",  # another file's
        tmp_path / ".model.onnx.short.tmp",
        tmp_path / "model.onnx.k2_9abcd.tmp",
    ]
    for path in kept:
        path.write_bytes(b"")
    with locks.hold(out, folder=False):
        assert not any(path.exists() for path in dead)
    assert all(path.exists() for path in kept)


def test_a_lock_file_that_cannot_be_made_is_one_line_from_the_commands(checkpoint, capsys):
    """/proc passes os.access for root but takes no file: making the lock file there was
    export's traceback (FileNotFoundError) and predict's line named the lock file."""
    from vit import export

    target = Path("/proc/vit-lock-test.onnx")
    with pytest.raises(locks.CannotLockError, match=f"^{target}: cannot write there \\("):
        with locks.hold(target, folder=False):
            pass
    try:
        status = export.main([str(checkpoint), "--onnx", str(target)])
    except SystemExit as refused:  # a user's os.access already says no: argparse's line
        status = refused.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and f"--onnx {target}: cannot write there" in err


def test_a_refused_or_failed_start_leaves_no_folder(tmp_path):
    folder = tmp_path / "new"
    with pytest.raises(ValueError, match="boom"), locks.hold(folder, folder=True):
        assert (folder / locks.LOCK_NAME).is_file()
        raise ValueError("boom")
    assert not folder.exists()
    output = tmp_path / "a" / "b" / "preds.csv"  # an output file's folders, made for its lock
    with pytest.raises(ValueError, match="boom"), locks.hold(output, folder=False):
        assert locks.lock_file(output, folder=False).is_file()
        raise ValueError("boom")
    assert not (tmp_path / "a").exists()


# -- --features on a classifier: one forward pass --------------------------------------------------
@pytest.fixture
def images_seen(monkeypatch) -> list[int]:
    """The batch sizes that went through the model's blocks (forward_features), as they go."""
    from vit.models.vision_transformer import VisionTransformer

    seen: list[int] = []
    original = VisionTransformer.forward_features

    def counting(self, x, *args, **kwargs):
        seen.append(x.shape[0])
        return original(self, x, *args, **kwargs)

    monkeypatch.setattr(VisionTransformer, "forward_features", counting)
    return seen


def test_features_on_a_classifier_is_one_pass_whose_classes_are_plain_predicts(
    image_folder, checkpoint, tmp_path, images_seen, capsys
):
    from vit.predict import main as predict

    common = [str(image_folder), "--checkpoint", str(checkpoint), "--workers", "0"]
    plain = tmp_path / "plain.csv"
    assert predict([*common, "--output", str(plain)]) == 0
    images = sum(images_seen)
    assert images == 3 * 22
    images_seen.clear()
    both = tmp_path / "both.csv"
    assert predict([*common, "--features", str(tmp_path / "f.npz"), "--output", str(both)]) == 0
    assert sum(images_seen) == images  # one pass: every image through the blocks once
    assert both.read_text() == plain.read_text()
    capsys.readouterr()

    images_seen.clear()
    assert predict([*common, "--features", str(tmp_path / "g.npz")]) == 0
    out, err = capsys.readouterr()
    assert sum(images_seen) == images and out == ""  # no line per image: one summary line
    assert f"classified {images} images; most frequent top-1 classes:" in err


def test_a_killed_features_job_continues_its_classes_too(
    image_folder, checkpoint, tmp_path, images_seen, monkeypatch
):
    from vit.inference import embed
    from vit.predict import main as predict

    common = [str(image_folder), "--checkpoint", str(checkpoint), "--workers", "0"]
    plain = tmp_path / "plain.csv"
    assert predict([*common, "--output", str(plain)]) == 0
    images_seen.clear()
    job = [*common, "--features", str(tmp_path / "f.npz"), "--output", str(tmp_path / "p.csv")]
    job += ["--shard-size", "16"]
    original = embed._write_shard

    def killed_after_the_first(path, data):
        original(path, data)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(embed, "_write_shard", killed_after_the_first)
        assert predict(job) == 130  # Ctrl-C: one line, the shards kept
    assert not (tmp_path / "p.csv").exists()
    images_seen.clear()
    assert predict(job) == 0
    assert sum(images_seen) == 3 * 22 - 16  # the first shard's images are not seen again
    assert (tmp_path / "p.csv").read_text() == plain.read_text()


def test_a_second_predict_on_one_explain_folder_is_refused(image_folder, checkpoint, tmp_path):
    """--explain DIR held no lock: two jobs each wrote maps there, the folder a mixture."""
    from vit.predict import main as predict_main

    maps = tmp_path / "maps"
    image = next((image_folder / "test" / CLASSES[0]).iterdir())
    argv = [str(image), "--checkpoint", str(checkpoint), "--explain", str(maps), "--overwrite"]
    with locks.hold(maps, folder=True):  # another job's hold, as a paused process would have it
        result = subprocess.run(
            [sys.executable, "-m", "vit.predict", *argv],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"error: --explain {maps}: in use by process {os.getpid()}")
        assert [p.name for p in maps.iterdir()] == [locks.LOCK_NAME]
    assert predict_main(argv) == 0 and not (maps / locks.LOCK_NAME).exists()
    assert [p.suffix for p in maps.iterdir()] == [".png"]
