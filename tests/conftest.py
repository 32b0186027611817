"""Shared fixtures and helpers: a tiny, learnable image folder made on the fly (no downloads),
and the relative error every equivalence test bounds (`from conftest import relative_error`)."""

from __future__ import annotations

import contextlib
import csv
import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

# onnxruntime.transformers appends its own folder to sys.path when first imported (its modules
# import each other by bare name). Imported first inside a test whose monkeypatch restores
# sys.path (a benchmark importing onnxruntime.quantization), that entry went with the restore,
# and every later --optimize export failed: "No module named 'fusion_options'". Imported here,
# before any test, the entry stays.
with contextlib.suppress(ImportError):
    import onnxruntime.transformers  # noqa: F401

CLASSES = ("blue", "green", "red")

RTOL = 1e-5  # the bound on relative_error for outputs that are "numerically identical" (float32)


def relative_error(output, reference) -> float:
    """max |output - reference| / max |reference|: how far `output` (ours, or an export's) is
    from `reference` (the library compared with, or the model exported), relative to the
    reference's largest value. Tensors or numpy arrays of the same shape."""
    output, reference = torch.as_tensor(output), torch.as_tensor(reference)
    assert output.shape == reference.shape, (
        f"output {tuple(output.shape)} and reference {tuple(reference.shape)} differ in shape"
    )
    assert reference.abs().max() > 0, "the reference is all zeros: the comparison proves nothing"
    return ((output - reference).abs().max() / reference.abs().max()).item()


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV file (a run's metrics.csv, a benchmark's table) as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_close_weights(a: Path, b: Path, atol: float = 0.0) -> None:
    """Every tensor of two weight files within `atol` (0: identical bits)."""
    from safetensors.torch import load_file

    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        if atol == 0:
            assert torch.equal(wa[key], wb[key]), key
        else:
            difference = (wa[key] - wb[key]).abs().max().item()
            assert torch.allclose(wa[key], wb[key], rtol=0, atol=atol), f"{key}: {difference}"


def one_line_error(capsys, exit_info) -> str:
    """The single stderr line of a command that exited with status 2, after its "error: "."""
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err.split(": error: ", 1)[1]


def make_image_folder(
    root: Path,
    classes: tuple[str, ...] = CLASSES,
    train_per_class: int = 16,
    test_per_class: int = 6,
    size: int = 32,
    test_name: str = "test",
    seed: int = 0,
) -> Path:
    """root/{train,test}/<class>/<i>.jpg: noisy 32x32 JPEGs whose class sets the strongest
    colour channel (the first class blue, then green, red), so a tiny model can learn them."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), (test_name, test_per_class)):
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            channel = 2 - label % 3  # blue, green, red
            for i in range(count):
                image = rng.integers(0, 110, size=(size, size, 3), dtype=np.uint8)
                image[..., channel] += np.uint8(120)
                Image.fromarray(image).save(folder / f"{i:04d}.jpg", quality=95)
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """A read-only tiny dataset (3 classes, 16 train and 6 test images each); copy to modify."""
    return make_image_folder(tmp_path_factory.mktemp("images"))


@pytest.fixture
def make_images():
    """The folder builder itself, for tests that need their own (e.g. to corrupt a file)."""
    return make_image_folder


@pytest.fixture(scope="session")
def train_script():
    """vit.train, the module `python train.py` runs: what a test patches is what main() uses."""
    return importlib.import_module("vit.train")


@pytest.fixture(scope="session")
def evaluate_script():
    """vit.evaluate, the module `python evaluate.py` runs."""
    return importlib.import_module("vit.evaluate")


# What pip writes as bin/vit-predict for [project.scripts] `vit-predict = "vit.predict:main"`
CONSOLE_SCRIPT = """import re, sys
from {module} import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def tiny_train_args(data: Path, out: Path, epochs: int = 2, *extra: str) -> list[str]:
    """train.py flags for a seconds-long CPU run of a 2-block, 32-wide ViT (warmup: one epoch,
    or half of a one-epoch run, since warmup must end before the run does)."""
    warmup = "1" if epochs > 1 else "0.5"
    return [
        "--data", str(data), "--output-dir", str(out), "--epochs", str(epochs),
        "--model-kwargs", "depth=2", "embed_dim=32", "num_heads=2",
        "--batch-size", "8", "--lr", "3e-3", "--warmup-epochs", warmup,
        "--workers", "0", "--device", "cpu", "--cache-dir", "none", *extra,
    ]  # fmt: skip


def stop_after_first_save(patch: pytest.MonkeyPatch) -> None:
    """Within `patch` (a monkeypatch context), the next training state saved is written and
    then Ctrl-C arrives: a run stopped (status 130) once its first checkpoint is complete."""
    from vit.training import checkpoint

    original = checkpoint.save_training_state

    def save_then_stop(state: dict, path: Path) -> None:
        original(state, path)
        raise KeyboardInterrupt

    patch.setattr(checkpoint, "save_training_state", save_then_stop)


def assert_resumes_exactly(train_script, monkeypatch, tmp_path: Path, data: Path, *flags) -> Path:
    """A tiny two-epoch train.py run with `flags`, stopped once its first checkpoint is written
    and then resumed, ends with the weights of an uninterrupted one. Returns the uninterrupted
    run's folder."""
    from safetensors.torch import load_file

    reference = tmp_path / "reference"
    assert train_script.main(tiny_train_args(data, reference, 2, *flags)) == 0
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        stop_after_first_save(patch)
        assert train_script.main(tiny_train_args(data, run, 2, *flags)) == 130
    assert train_script.main(["--resume", str(run)]) == 0
    ours, theirs = load_file(run / "model.safetensors"), load_file(reference / "model.safetensors")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    return reference


class Dispatched(TorchDispatchMode):
    """The names of the operations dispatched inside it (on a GPU, each a kernel launch), and
    those with a tensor on the CPU among their operands."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.with_cpu_tensors: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.names.append(str(func.overloadpacket))
        operands = [*args, *kwargs.values()]
        operands += [
            item for operand in operands if isinstance(operand, list | tuple) for item in operand
        ]
        if any(isinstance(x, torch.Tensor) and x.device.type == "cpu" for x in operands):
            self.with_cpu_tensors.append(self.names[-1])
        return func(*args, **kwargs)


@pytest.fixture(scope="session")
def tiny_args():
    return tiny_train_args


@pytest.fixture(scope="session")
def onnx_exports(tmp_path_factory) -> Path:
    """A folder with a tiny classifier (classes blue, green, red: image_folder's) and a headless
    model, each as .safetensors and as its ONNX export, as `vit.export` writes it today."""
    import vit
    from vit.cli.model_argument import resolve_model
    from vit.interop.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("onnx")
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3
    )
    torch.nn.init.normal_(model.head.weight)
    vit.save_weights(model, root / "tiny.safetensors", class_names=["blue", "green", "red"])
    export_onnx(resolve_model(root / "tiny.safetensors"), root / "tiny.onnx")
    headless = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=0
    )
    vit.save_weights(headless, root / "headless.safetensors")
    export_onnx(resolve_model(root / "headless.safetensors"), root / "headless.onnx")
    return root


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on shared cores they lose a lot."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def fake_hub_cache(root, repo_id: str, filename: str, tensors: dict) -> None:
    """A Hugging Face cache holding one file of `repo_id`, laid out as huggingface_hub does."""
    from safetensors.torch import save_file

    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(snapshot / filename))


class OfflineCifar:
    """torchvision's CIFAR10 on a machine without internet: it makes its folder and a partial
    archive there before the download fails, as the real one does."""

    def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / "cifar-10-python.tar.gz").write_bytes(b"partial")
        raise RuntimeError("<urlopen error [Errno -3] Temporary failure in name resolution>")
