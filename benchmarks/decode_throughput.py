"""Images/s of decoding an image folder into memory (what `--cache` does before the first
step of a run, every time on a bare machine): in threads, as before
(`vit.data.images.load_images_in_threads`), against processes (`load_images`), on the same
files, in alternating rounds, the arrays checked equal.

    python benchmarks/decode_throughput.py --data ../shared/data/cifar10-jpg
    python benchmarks/decode_throughput.py --data ../shared/data/cifar10-jpg --workers 16

Decoding a 32x32 JPEG is mostly PIL's Python, which holds the GIL: threads add little beyond
one core, processes scale with the cores.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import _cli

from vit.cli.flags import number_in
from vit.data.datasets import find_split_dir, scan_folder
from vit.data.images import load_images, load_images_in_threads
from vit.data.workers import usable_cores
from vit.utils.ranges import AT_LEAST_1


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument(
        "--data", required=True, help="a folder with train/ and test/ class folders"
    )
    count = number_in(AT_LEAST_1)  # no worker or round: nothing decoded, no median
    parser.add_argument("--workers", type=count, default=min(32, usable_cores()))
    parser.add_argument("--rounds", type=count, default=2)
    args = parser.parse_args(argv)
    _cli.check_data(parser, args.data, names=False)
    paths = []
    for split in ("train", "test"):
        paths += scan_folder(find_split_dir(Path(args.data), split))[0]
    ways = {"threads": load_images_in_threads, "processes": load_images}
    seconds = {name: [] for name in ways}
    for _ in range(args.rounds):
        decoded = {}
        for name, decode in ways.items():
            start = time.perf_counter()
            decoded[name] = decode(paths, args.workers)
            seconds[name].append(time.perf_counter() - start)
        if not all((a == b).all() for a, b in zip(*decoded.values(), strict=True)):
            raise SystemExit("decode_throughput.py: threads and processes decoded different arrays")
    print(
        f"{len(paths)} files of {args.data}, {args.workers} workers, median of {args.rounds} "
        f"rounds; {_cli.machine()}"
    )
    print("| decoded in | seconds | images/s |\n|---|---:|---:|")
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"| {args.workers} {name} | {median:.1f} | {len(paths) / median:,.0f} |")


if __name__ == "__main__":
    _cli.run(main)
