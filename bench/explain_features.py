"""One explaining job over many demo-SAE features: its wall time, how long reading the corpus took,
and how many corpus texts it read.

A demo server (SmolLM2-135M-Instruct, the demo SAE at layer 12 with its shipped calibration on
the demo corpus of 285 texts). --count features are drawn (seed 0) among those that fired at
least --min-count times in the calibration; one job explains them with the served model as
explainer and scorer: 20 top windows, --held-out activating windows in --quantiles bins and as
many quiet ones, detection and fuzzing (the defaults are bench/labels_demo.py's, the run in
docs/labels.md; the API's own are 20 and 10). The job is polled every --poll seconds: the read
ends when the job's `texts_read` reaches its `texts` (a job that does not report them: when its
first feature is done), so the split of the wall time is known to a poll.

    .venv/bin/python bench/explain_features.py [--count 64] [--min-count 60] [--held-out 10]
        [--quantiles 5] [--out explain_features.json]

Prints one line of figures and writes the job and its timings as JSON.

With --paired-reads N it runs no server: the demo model and SAE in this process read the first N
corpus texts as the job does (one scoring pass per text, the SAE's read), alternately through
every layer and stopped at the SAE's (ScoringJob.reads_only), and prints both medians and their
ratio: pairs a second apart, so a machine whose load drifts moves both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
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


def fired(client: httpx.Client, sae: str, min_count: int) -> list[int]:
    """The features that fired at least `min_count` times in the SAE's calibration."""
    width = client.get(f"/api/saes/{sae}").json()["d_sae"]
    return [
        figure["index"]
        for start in range(0, width, 1000)  # the route shows 1000 features at a time
        for figure in client.get(
            f"/api/saes/{sae}/calibration",
            params={"features": ",".join(map(str, range(start, min(width, start + 1000))))},
        ).json()["features"]
        if figure["count"] >= min_count
    ]


def run_job(client: httpx.Client, sae: str, body: dict, poll: float) -> dict:
    """Start the job and follow it to its end; the job and its timings."""
    started = time.monotonic()
    response = client.post(f"/api/saes/{sae}/labels/explain", json=body)
    response.raise_for_status()
    job = response.json()
    read_s = None
    while job["state"] == "running":
        time.sleep(poll)
        job = client.get(f"/api/jobs/{job['id']}").json()
        result = job.get("result") or {}
        read = "texts" in result and result["texts_read"] == result["texts"]
        if read_s is None and (read or job["progress"]["done"] >= 1):
            read_s = time.monotonic() - started
    return {"job": job, "wall_s": time.monotonic() - started, "read_s": read_s}


def paired_reads(count: int) -> None:
    """Median seconds of one text's read through every layer, and stopped at the SAE's."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from steering_speed import demo_model_and_sae

    from millm.engine.jobs import ResidualRead, ScoringJob
    from millm.engine.scoring import run_scoring
    from millm.lab.calibration.protocol import CalibrateRequest, corpus_ids

    lm, info, sae = demo_model_and_sae("auto")
    texts = corpus_ids(lm.tokenizer, CalibrateRequest(corpus="demo"), info, lm.context_length)
    read = ResidualRead(info.layer, True, "prompt", "discovery", encode=sae.encode)
    times: dict[bool, list[float]] = {False: [], True: []}
    for ids in texts.texts[:count]:
        for reads_only in (False, True):
            job = ScoringJob(prompts=[ids.tolist()], emit=lambda _: None, reads=(read,),
                             reads_only=reads_only)  # fmt: skip
            began = time.perf_counter()
            with torch.inference_mode():
                run_scoring(lm, job)
            times[reads_only].append(time.perf_counter() - began)
    whole, cut = statistics.median(times[False]), statistics.median(times[True])
    tokens = sum(len(ids) for ids in texts.texts[:count])
    print(
        f"{count} texts ({tokens} tokens), one read each way, alternately: every layer "
        f"{whole:.3f} s a text (median), stopped at layer {info.layer} {cut:.3f} s: "
        f"{whole / cut:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--min-count", type=int, default=60)
    parser.add_argument("--held-out", type=int, default=10)
    parser.add_argument("--quantiles", type=int, default=5)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("explain_features.json"))
    parser.add_argument("--paired-reads", type=int, default=0, metavar="N")
    args = parser.parse_args()
    if args.paired_reads:
        paired_reads(args.paired_reads)
        return
    load_before = os.getloadavg()[0]
    server = ServerProcess(
        Path(tempfile.mkdtemp(prefix="millm-bench-")), ["--log-level", "warning"]
    ).wait_ready(timeout=600)
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            sae = next(s["id"] for s in client.get("/api/saes").json()["data"] if s["attached"])
            features = sorted(
                random.Random(0).sample(fired(client, sae, args.min_count), args.count)
            )
            body = {"features": features, "explainer": "served", "held_out": args.held_out,
                    "quantiles": args.quantiles}  # fmt: skip
            run = run_job(client, sae, body, args.poll)
    finally:
        server.stop()
    args.out.write_text(json.dumps(run, indent=1))
    job, result = run["job"], run["job"].get("result") or {}
    read_s = run["read_s"] or 0.0
    print(
        f"{len(features)} features: {job['state']} in {run['wall_s']:.0f} s wall "
        f"(job's duration_s {result.get('duration_s')}); corpus read ~{read_s:.0f} s, then "
        f"{(run['wall_s'] - read_s) / len(features):.1f} s per feature; "
        f"progress {job['progress']['done']}/{job['progress']['total']} {job['progress']['unit']}; "
        f"texts read {result.get('texts_read', '—')} of {result.get('texts', '—')}; "
        f"explained {result.get('explained')}, skipped {len(result.get('skipped', []))}; "
        f"load avg {load_before:.1f} -> {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
