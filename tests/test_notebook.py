"""The notebooks run top to bottom, draw their figures and pass their own checks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
# The notebook reads VIT_WEIGHTS too (the kernel inherits the environment): another model.
WEIGHTS = Path(os.environ.get("VIT_WEIGHTS", ROOT / "weights" / "cifar10_vit_cpu.safetensors"))
TEST_DIR = ROOT.parent / "shared" / "data" / "cifar10-jpg" / "test"
DINOV2_FOLDER = ROOT.parent / "shared" / "data" / "dinov2-small"  # real DINOv2 ViT-S/14 weights


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch) -> str:
    """A kernelspec that runs ipykernel with the interpreter running the tests.

    A "python3" kernel found on the Jupyter path might belong to another environment without
    `vit` installed; a uniquely named spec in a JUPYTER_PATH folder (searched first) cannot.
    The kernel inherits the environment, HF_HUB_OFFLINE=1 included: the 224x224 sections use
    timm's pretrained weights only if they are already cached, and never download in a test."""
    name = "vit-tests-python"
    spec_dir = tmp_path / "kernels" / name
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "vit tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return name


def run_notebook(path: Path, kernel_name: str) -> tuple[int, str]:
    """Execute `path` from its own folder; return (figures drawn, printed text)."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=kernel_name,
        timeout=600,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    text = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    return len(images), text


def test_attention_notebook_runs(this_python_kernel):
    if not TEST_DIR.is_dir():
        pytest.skip(f"CIFAR-10 test images not found at {TEST_DIR} (the shared data copy)")
    assert WEIGHTS.exists(), f"the notebook needs the trained model {WEIGHTS}"
    images, text = run_notebook(NOTEBOOKS / "attention_maps.ipynb", this_python_kernel)
    # CIFAR: side-by-side maps, per-head grid, attention distance; then the 224x224 photo's
    # maps; then DINOv2: one map per head of the last block, rollout and similarity maps
    assert images == 6
    assert "of 10 shown images correct" in text and "uniform attention" in text
    assert "14x14 = 196 patch tokens + 1 class token; each map is (1, 14, 14)" in text
    assert "16x16 = 256 patches + 1 class token, 6 heads; each map is (16, 16)" in text
    assert "cosine similarity of the photograph to the face crop" in text
    # the weights are named: timm's from the cache, else the shared DINOv2 folder (as in CI),
    # else random ones, and never random while the folder is there
    (source,) = [line for line in text.splitlines() if line.startswith("weights: ")]
    sources = {
        "weights: timm vit_small_patch14_dinov2.lvd142m (Hugging Face hub)",
        "weights: ../shared/data/dinov2-small (DINOv2 ViT-S/14, see its README)",
        "weights: RANDOM weights (maps meaningless)",
    }
    assert source in sources
    assert not (DINOV2_FOLDER.is_dir() and "RANDOM" in source)


def test_walkthrough_notebook_runs_and_its_hand_computations_match_the_model(this_python_kernel):
    """Every step by hand is checked with assert_close inside the notebook: any mismatch is a
    cell error, which run_notebook raises. Offline (no cached weights) it uses random weights."""
    images, text = run_notebook(NOTEBOOKS / "vit_walkthrough.ipynb", this_python_kernel)
    # the patch grid, position-embedding similarity, the 12 heads' attention, the entropy plot
    assert images == 4
    for checked in (
        "equal to model.patch_embed(x)",
        "(1, 197, 768): equal to the input of model.blocks[0]",
        "equal to model.blocks[0].attn",
        "equal to model.blocks[0](tokens)",
        "equal to model(x)",
        "fused vs explicit",
    ):
        assert checked in text


def test_dinov2_section_falls_back_to_random_weights_and_says_so(tmp_path, monkeypatch, capsys):
    """No hub (HF_HUB_OFFLINE, nothing cached) and no local folder: random DINOv2-shaped
    weights, a loud note, and a label that every figure of the section carries."""
    import importlib.util

    import torch

    from vit.explain import last_block_attention

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    spec = importlib.util.spec_from_file_location("imagenet_setup", NOTEBOOKS / "imagenet_setup.py")
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    model, label = setup.self_supervised_vit(tmp_path)  # tmp_path/../shared/...: not there
    assert label == "RANDOM weights (maps meaningless)"
    assert "NOTE: RANDOM WEIGHTS" in capsys.readouterr().out
    assert model.num_classes == 0 and model.patch_embed.patch_size == (14, 14)
    assert model.preprocess.input_size == (224, 224)
    heads = last_block_attention(model, torch.zeros(1, 3, 224, 224))
    assert heads.shape == (1, 6, 16, 16)


def test_attention_notebook_without_the_test_images_names_their_folder(tmp_path):
    """A checkout without ../shared/data: the images' cell stops on a line naming the folder,
    not on a tensor error further down."""
    notebook = nbformat.read(NOTEBOOKS / "attention_maps.ipynb", as_version=4)
    (cell,) = [c for c in notebook.cells if c.cell_type == "code" and "candidates" in c.source]
    missing = tmp_path / "shared" / "data" / "cifar10-jpg" / "test"
    with pytest.raises(AssertionError, match=f"no CIFAR-10 test images at {missing}"):
        exec(cell.source, {"TEST_DIR": missing})
