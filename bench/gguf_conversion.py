"""What converting a GGUF file to the transformers engine's dequantised checkpoint costs (once per
file; what a first `--engine transformers` start, or a first attribution graph on llama.cpp, waits
for), with the file's header parsed once and shared (as millm does), and parsed by each reader
of it (as transformers alone does: the config, the weights and the tokenizer each open it, then
millm's facts).

Each conversion runs in a fresh process on a fresh cache directory; the rows alternate.

    .venv/bin/python bench/gguf_conversion.py [--model gemma3-270m] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE = """
import contextlib, sys, tempfile, time
from pathlib import Path
import millm.engine.loader as loader
from millm.engine.sources import resolve_source
from millm.settings import default_home
if sys.argv[2] == "unshared":
    loader.readers_shared = contextlib.nullcontext
    import millm.engine.gguf_head as head, millm.engine.gguf_meta as meta
    import gguf
    meta.reader = lambda path: gguf.GGUFReader(str(path))
    head.reader = meta.reader
source = resolve_source(sys.argv[1], default_home() / "hub")
start = time.perf_counter()
loader.gguf_checkpoint(source, Path(sys.argv[3]))
print(time.perf_counter() - start)
"""


def convert(model: str, mode: str) -> float:
    """Seconds one conversion takes in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="millm-bench-") as cache:
        done = subprocess.run(
            [sys.executable, "-c", ONE, model, mode, cache],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"shared": [], "unshared": []}
    for _ in range(args.repeats):
        for mode in times:
            times[mode].append(convert(args.model, mode))
            print(f"  {mode}: {times[mode][-1]:.1f} s", file=sys.stderr)
    shared, unshared = (statistics.median(times[m]) for m in ("shared", "unshared"))
    print(f"| {args.model}: header | conversion (median of {args.repeats}) |")
    print("|---|---|")
    print(f"| parsed by each reader | {unshared:.1f} s |")
    print(f"| parsed once, shared | {shared:.1f} s ({unshared / shared:.2f}× faster) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
