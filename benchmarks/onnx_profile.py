"""Where an ONNX file's time goes in onnxruntime, operator by operator: what limits a path.

    python benchmarks/onnx_profile.py CHECKPOINT [--batch-size 32] [--threads 2] [--runs 5]
        [--calibration DATA]

Exports CHECKPOINT (any model argument `vit.export` takes) as float32, int8 (`--int8`) and,
with --calibration, static int8, runs each file `--runs` times on one random batch with
onnxruntime's profiler on (after one unprofiled warm-up run), and prints per file the time of
each operator type per batch and its share of all operators' time, largest first. The CPU's
instruction sets are printed first.
"""

from __future__ import annotations

import collections
import json
import tempfile
from pathlib import Path

import _cli
import onnxruntime
import torch

from vit.cli.flags import number_in
from vit.data.transforms import evaluation_images
from vit.interop.onnx_export import OnnxOptions, export_onnx, quantized_copy
from vit.utils.ranges import AT_LEAST_1


def operator_times(path: Path, batch, threads: int, runs: int) -> dict[str, float]:
    """Operator type -> milliseconds per run, from onnxruntime's profile of `runs` runs after
    a first run (kernels chosen, memory allocated) that is not counted."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(path.with_suffix(""))
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: batch}
    for _ in range(runs + 1):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    totals: dict[str, float] = collections.defaultdict(float)
    warm = False  # a run's node events are written before its own model_run event
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            warm = True
        elif warm and event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            totals[event["args"]["op_name"]] += event["dur"] / 1000 / runs
    return dict(totals)


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="any model argument vit.export takes"
    )
    count = number_in(AT_LEAST_1)  # 0 images, threads or runs: no time to give
    parser.add_argument("--batch-size", type=count, default=32)
    parser.add_argument("--threads", type=count, default=2)
    parser.add_argument("--runs", type=count, default=5)
    parser.add_argument(
        "--calibration",
        metavar="DATA",
        help="an image folder (or cifar10, cifar100 under ./data) whose train split calibrates "
        "static int8",
    )
    args = parser.parse_args(argv)
    if args.calibration:  # before the model is loaded: one line, not load_split's traceback
        _cli.check_data(parser, args.calibration, flag="--calibration")
    torch.set_num_threads(args.threads)
    model = _cli.checked_model(parser, "CHECKPOINT", args.checkpoint)
    print(f"{_cli.machine()}; onnxruntime {onnxruntime.__version__}")
    channels, (height, width) = model.config.in_chans, model.preprocess.input_size
    generator = torch.Generator().manual_seed(0)
    batch = torch.randn(args.batch_size, channels, height, width, generator=generator)
    kinds = {"int8": OnnxOptions(int8=True)}
    if args.calibration:
        try:
            images = evaluation_images(args.calibration, "train", 256, model.preprocess)
        except FileNotFoundError as e:  # cifar10 or cifar100 not under ./data: its one line
            parser.error(f"--calibration {e}")
        kinds["static int8"] = OnnxOptions(int8=True, calibration=images)
    with tempfile.TemporaryDirectory() as tmp:
        files = {"float32": Path(tmp) / "float32.onnx"}
        export_onnx(model, files["float32"])
        for kind, options in kinds.items():
            files[kind] = Path(tmp) / f"{kind.replace(' ', '_')}.onnx"
            quantized_copy(files["float32"], files[kind], model, options)
        for kind, path in files.items():
            times = operator_times(path, batch.numpy(), args.threads, args.runs)
            total = sum(times.values())
            print(f"\n{kind}: {total:.1f} ms of operators per batch of {args.batch_size}")
            print(f"  {'operator':28s} {'ms/batch':>9s} {'share':>6s}")
            for op, ms in sorted(times.items(), key=lambda item: -item[1]):
                if ms / total >= 0.005:
                    print(f"  {op:28s} {ms:9.1f} {100 * ms / total:5.1f}%")


if __name__ == "__main__":
    _cli.run(main)
