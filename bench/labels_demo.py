"""Labels for the demo SAE written by the demo model, against the labels it ships: delphi's
detection and fuzzing scores of both, on the same held-out windows, scored by the same model.

One demo server (SmolLM2-135M-Instruct, the demo SAE at layer 12 with its shipped calibration on
the demo corpus). --count features are drawn (seed 0) among those that fired at least
--min-count times in the calibration; one job explains them with the served model as explainer
and scorer, a second scores their shipped labels the same way (`score_labels`). Both jobs use
the same seed, so each feature's held-out windows are the same for its two texts.

    .venv/bin/python bench/labels_demo.py [--count 32] [--held-out 10] [--out labels_demo.json]
        [--explainer-model gemma3-270m]

With --explainer-model, that registered (or packaged) model is loaded beside the served one for
both jobs instead: it writes the explanations and scores them and the shipped labels.

Prints a markdown table (the one in docs/labels.md) and writes both jobs' results as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402


def run_job(client: httpx.Client, sae: str, body: dict) -> tuple[dict, float]:
    """Start an explaining job, wait for its end; (the job, seconds)."""
    started = time.monotonic()
    response = client.post(f"/api/saes/{sae}/labels/explain", json=body)
    response.raise_for_status()
    job = response.json()
    while job["state"] == "running":
        time.sleep(2)
        job = client.get(f"/api/jobs/{job['id']}").json()
    if job["state"] != "succeeded":
        raise SystemExit(f"the job ended {job['state']}: {job.get('error')}")
    return job, time.monotonic() - started


def accuracy(entry: dict | None, score: str) -> float | None:
    found = (entry or {}).get(score)
    return None if found is None else found["balanced_accuracy"]


def cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--min-count", type=int, default=60)
    parser.add_argument("--held-out", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("labels_demo.json"))
    parser.add_argument(
        "--explainer-model",
        help="a model source to register and load beside the served one as explainer and scorer",
    )
    args = parser.parse_args()
    server = ServerProcess(
        Path(tempfile.mkdtemp(prefix="millm-bench-")), ["--log-level", "warning"]
    ).wait_ready(timeout=600)
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            sae = next(s["id"] for s in client.get("/api/saes").json()["data"] if s["attached"])
            width = client.get(f"/api/saes/{sae}").json()["d_sae"]
            figures = [
                figure
                for start in range(0, width, 1000)  # the route shows 1000 features at a time
                for figure in client.get(
                    f"/api/saes/{sae}/calibration",
                    params={"features": ",".join(map(str, range(start, min(width, start + 1000))))},
                ).json()["features"]
            ]
            pool = [f["index"] for f in figures if f["count"] >= args.min_count]
            features = sorted(random.Random(0).sample(pool, args.count))
            common = {"features": features, "held_out": args.held_out, "quantiles": 5}
            who: dict = {"explainer": "served"}
            if args.explainer_model:
                registered = client.post("/api/models", json={"source": args.explainer_model})
                registered.raise_for_status()
                who = {"explainer": "model", "explainer_model": registered.json()["id"]}
            written, written_s = run_job(client, sae, {**common, **who})
            shipped, shipped_s = run_job(client, sae, {**common, **who, "score_labels": True})
    finally:
        server.stop()
    args.out.write_text(json.dumps({"written": written, "shipped": shipped}, indent=1))
    mine = {e["feature"]: e for e in written["result"]["explanations"]}
    writer = args.explainer_model or "the demo model"
    theirs = {e["feature"]: e for e in shipped["result"]["explanations"]}
    print(
        f"{len(features)} features of the demo SAE (fired >= {args.min_count} times in its "
        f"calibration), {args.held_out} held-out activating windows + as many quiet ones each; "
        f"explaining took {written_s:.0f} s, scoring the shipped labels {shipped_s:.0f} s\n"
    )
    print(
        f"| feature | shipped label | detection | fuzzing | {writer}'s explanation | detection | "
        "fuzzing |"
    )
    print("|---|---|---|---|---|---|---|")
    for feature in features:
        a, b = theirs.get(feature), mine.get(feature)
        print(
            f"| {feature} | {(a or {}).get('explanation', '—')} | "
            f"{cell(accuracy(a, 'detection'))} | {cell(accuracy(a, 'fuzzing'))} | "
            f"{(b or {}).get('explanation', '(none written)')[:80]} | "
            f"{cell(accuracy(b, 'detection'))} | {cell(accuracy(b, 'fuzzing'))} |"
        )
    for name, table in (("shipped labels", theirs), (f"{writer}'s", mine)):
        for score in ("detection", "fuzzing"):
            values = [v for e in table.values() if (v := accuracy(e, score)) is not None]
            mean = statistics.mean(values) if values else float("nan")
            print(f"mean {score} balanced accuracy, {name}: {mean:.3f} over {len(values)} features")
    print(
        f"explanations written: {len(mine)} of {len(features)}; skipped: "
        f"{written['result']['skipped'][:3]}"
    )


if __name__ == "__main__":
    main()
