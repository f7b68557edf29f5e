"""What an attribution graph costs on a model served by llama.cpp, where it is traced on a
transformers copy of the same file loaded for the request, beside the same graph on a server
running that file on transformers.

One data directory for both servers, started in turn on the demo model (SmolLM2-135M-Instruct,
its SAE after block 12 attached as `./scripts/serve` attaches it): first the default engine
(llama.cpp), on a fresh directory, so its first graph includes converting the file to the cached
transformers checkpoint (once per file); then `--engine transformers`, whose start loads that
checkpoint. Each server answers --repeats graphs of the same request after the first; reported:
the first graph, and the median of the rest, from request to parsed answer.

    .venv/bin/python bench/attribution_copy.py [--repeats 5] [--nodes 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

TEXT = "The capital of France is"


def graphs(home: Path, engine: list[str], body: dict, repeats: int) -> tuple[float, list[float]]:
    """A server on the demo with `engine`'s arguments: the first graph's seconds, then the
    rest's."""
    server = ServerProcess(home, ["--log-level", "warning", *engine]).wait_ready(timeout=900)
    try:
        with httpx.Client(base_url=server.base_url, timeout=900) as client:
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                response = client.post("/api/attribution", json=body)
                response.json()
                times.append(time.perf_counter() - start)
                if response.status_code != 200:
                    raise RuntimeError(f"{response.status_code} {response.text[:400]}")
            engine_said = client.get("/api/health/inference").json().get("engine")
    finally:
        server.stop()
    print(f"  {engine or ['(default)']}: engine {engine_said}", file=sys.stderr)
    return times[0], times[1:]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=64)
    args = parser.parse_args()
    body = {"text": TEXT, "max_feature_nodes": args.nodes, "verify": 8}
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    cpp_first, cpp = graphs(home, [], body, args.repeats)
    tf_first, tf = graphs(home, ["--engine", "transformers"], body, args.repeats)
    print(f"| served on | first graph | median of the next {args.repeats} | against transformers |")
    print("|---|---|---|---|")
    ratio = statistics.median(cpp) / statistics.median(tf)
    print(
        f"| llama.cpp (graph on a copy loaded per request) | {cpp_first:.1f} s (converts the "
        f"file) | {statistics.median(cpp):.2f} s | {ratio:.2f}× |"
    )
    print(f"| transformers | {tf_first:.1f} s | {statistics.median(tf):.2f} s | 1.00× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
