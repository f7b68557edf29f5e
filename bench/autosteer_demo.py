"""AutoSteer on the demo model and SAE, for the four demo profiles' concepts: does it find the
feature the demo profile uses, or one at least as good by its own judge?

One demo server (SmolLM2-135M-Instruct, the demo SAE at layer 12). Per concept, two runs: the
goal alone (candidates from the label search), and the goal with six example sentences
(candidates from the label search and from contrasting the examples with neutral text). Each
run also tries the demo profile's first feature (`include`), so the profile's feature and
AutoSteer's own picks are judged by the same judge on the same probes and sweep. Defaults
otherwise: 4 candidates, strengths at 0.1 / 0.2 / 0.35 / 0.5 of the residual norm, two probe
prompts, 40 tokens, greedy.

    .venv/bin/python bench/autosteer_demo.py [--base-url URL] [--out results.json]

Prints a markdown table (the one in docs/discovery.md) and writes every job's result as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

CONCEPTS = {
    "pirate": ("talk like a pirate", 1403, [
        "Arr, the pirate ship sailed the seven seas.", "Ahoy matey, hoist the Jolly Roger!",
        "The captain buried his treasure on the island.", "Shiver me timbers, the crew wants rum.",
        "Walk the plank, ye scurvy dog!", "The pirates raided the merchant galleon at dawn.",
    ]),
    "italian-food": ("talk about Italian food", 1496, [
        "A plate of spaghetti with fresh tomato sauce and basil.", "The pizza came out of the wood oven bubbling.",
        "She made lasagna with layers of ricotta and mozzarella.", "Risotto needs patience and a good parmesan.",
        "Tiramisu is soaked in espresso and dusted with cocoa.", "We ordered gnocchi and a glass of Chianti.",
    ]),
    "france": ("talk about France", 619, [
        "We walked along the Seine to the Eiffel Tower.", "The French bakery sold croissants and baguettes.",
        "Paris in spring is full of cafes and flowers.", "They drove through Provence to the Riviera.",
        "The Louvre holds the Mona Lisa.", "Bordeaux is famous for its French wine.",
    ]),
    "music": ("talk about music", 1822, [
        "The orchestra played a symphony by Beethoven.", "She sang a beautiful melody on the guitar.",
        "The band released a new album of songs.", "He practises the piano every evening.",
        "The concert ended with a drum solo.", "Jazz musicians improvise over the chords.",
    ]),
}


def run_job(client: httpx.Client, body: dict) -> tuple[dict, float]:
    """Start an AutoSteer job and wait for its result; returns it and the wall time."""
    started = time.monotonic()
    response = client.post("/api/autosteer", json=body)
    response.raise_for_status()
    job_id = response.json()["id"]
    while True:
        job = client.get(f"/api/jobs/{job_id}").json()
        if job["state"] != "running":
            break
        time.sleep(1.0)
    if job["state"] != "succeeded":
        raise SystemExit(f"{body['goal']!r}: job {job['state']}: {job.get('error')}")
    return job["result"], time.monotonic() - started


def summary(concept: str, mode: str, profile_feature: int, result: dict, seconds: float) -> dict:
    """One table row: what was found, the best found setting, the profile feature's best."""
    found = [c for c in result["candidates"] if c["source"] != "given"]
    found_indices = [c["index"] for c in found]
    ours = [s for s in result["settings"] if s["index"] in found_indices]
    profile = [s for s in result["settings"] if s["index"] == profile_feature]
    best_ours = next(iter(ours), None)
    best_profile = next(iter(profile), None)
    verdict = "found" if profile_feature in found_indices else (
        "as good" if best_ours and best_profile and (best_ours["fluent"], best_ours["concept"]) >= (best_profile["fluent"], best_profile["concept"]) else "worse"
    )
    return {
        "concept": concept, "mode": mode, "seconds": round(seconds), "found": [(c["index"], c["label"], c["source"]) for c in found],
        "baseline": result["baseline"]["concept"], "best_ours": best_ours, "best_profile": best_profile, "verdict": verdict,
        "best": result["best"],
    }


def show(setting: dict | None) -> str:
    if setting is None:
        return "–"
    return f"#{setting['index']} × {setting['strength']:g}: {setting['concept']:.2f}{'' if setting['fluent'] else ' (not fluent)'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url")
    parser.add_argument("--out", type=Path, default=Path("autosteer_demo.json"))
    args = parser.parse_args()
    server = None
    base_url = args.base_url
    if base_url is None:
        server = ServerProcess(Path(tempfile.mkdtemp(prefix="millm-bench-")), ["--log-level", "warning"]).wait_ready(timeout=600)
        base_url = server.base_url
    rows, results = [], {}
    try:
        with httpx.Client(base_url=base_url, timeout=600) as client:
            for concept, (goal, feature, examples) in CONCEPTS.items():
                for mode in ("goal", "goal + examples"):
                    body = {"goal": goal, "include": [feature]}
                    if mode != "goal":
                        body["examples"] = examples
                    result, seconds = run_job(client, body)
                    results[f"{concept} / {mode}"] = result
                    rows.append(summary(concept, mode, feature, result, seconds))
                    print(f"{concept} / {mode}: {rows[-1]['verdict']} in {seconds:.0f} s", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
    args.out.write_text(json.dumps({"rows": rows, "results": results}, indent=1))
    print("| concept | candidates from | found (index: label) | unsteered P(yes) | best found setting | demo profile's feature, best | verdict | time |")
    print("|---|---|---|---:|---|---|---|---:|")
    for row in rows:
        found = ", ".join(f"#{i} {label or ''}".strip() + ("" if source == "labels" else f" ({source})") for i, label, source in row["found"])
        print(f"| {row['concept']} | {row['mode']} | {found} | {row['baseline']:.2f} | {show(row['best_ours'])} | {show(row['best_profile'])} | {row['verdict']} | {row['seconds']} s |")


if __name__ == "__main__":
    main()
