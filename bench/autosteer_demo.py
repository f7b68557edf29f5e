"""AutoSteer on the demo model and SAE, for the four demo profiles' concepts: does it find the
feature the demo profile uses, or one at least as good by its own judge?

One demo server (SmolLM2-135M-Instruct, the demo SAE at layer 12). Per concept, one run with
the goal and six example sentences (candidates from the label search and from contrasting the
examples with neutral text). Each run also tries the demo profile's first feature (`include`),
so the profile's feature and AutoSteer's own picks are judged the same way on the same probes
and sweep. Defaults otherwise: 4 candidates, strengths at 0.1 / 0.2 / 0.35 / 0.5 of the residual
norm, two probe prompts, 40 tokens, greedy. Both rankings are reported: by the judge (the job's
own order) and by the affinity (re-ranked here from the same settings, as rank_by="affinity"
would).

    .venv/bin/python bench/autosteer_demo.py [--base-url URL] [--out results.json]

Prints a markdown table (the one in bench/README.md) and writes every job's result as JSON.
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
    "pirate": (
        "talk like a pirate",
        1403,
        [
            "Arr, the pirate ship sailed the seven seas.",
            "Ahoy matey, hoist the Jolly Roger!",
            "The captain buried his treasure on the island.",
            "Shiver me timbers, the crew wants rum.",
            "Walk the plank, ye scurvy dog!",
            "The pirates raided the merchant galleon at dawn.",
        ],
    ),
    "italian-food": (
        "talk about Italian food",
        1496,
        [
            "A plate of spaghetti with fresh tomato sauce and basil.",
            "The pizza came out of the wood oven bubbling.",
            "She made lasagna with layers of ricotta and mozzarella.",
            "Risotto needs patience and a good parmesan.",
            "Tiramisu is soaked in espresso and dusted with cocoa.",
            "We ordered gnocchi and a glass of Chianti.",
        ],
    ),
    "france": (
        "talk about France",
        6,
        [
            "We walked along the Seine to the Eiffel Tower.",
            "The French bakery sold croissants and baguettes.",
            "Paris in spring is full of cafes and flowers.",
            "They drove through Provence to the Riviera.",
            "The Louvre holds the Mona Lisa.",
            "Bordeaux is famous for its French wine.",
        ],
    ),
    "music": (
        "talk about music",
        1148,
        [
            "The orchestra played a symphony by Beethoven.",
            "She sang a beautiful melody on the guitar.",
            "The band released a new album of songs.",
            "He practises the piano every evening.",
            "The concert ended with a drum solo.",
            "Jazz musicians improvise over the chords.",
        ],
    ),
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


SIGNALS = {"judge": "lift", "affinity": "affinity_lift"}


def ranked(settings: list[dict], signal: str) -> list[dict]:
    """The settings as AutoSteer ranks them by `signal`: fluent first, then the signal's lift,
    then fluency."""
    return sorted(settings, key=lambda s: (not s["fluent"], -s[SIGNALS[signal]], -s["fluency"]))


def summary(concept: str, profile_feature: int, result: dict, seconds: float) -> dict:
    """One table row: what was found, and per signal the best found setting and the profile
    feature's best."""
    found = [c for c in result["candidates"] if c["source"] != "given"]
    found_indices = [c["index"] for c in found]
    row = {
        "concept": concept,
        "seconds": round(seconds),
        "found": [(c["index"], c["label"], c["source"]) for c in found],
        "profile_found": profile_feature in found_indices,
    }
    for signal, field in SIGNALS.items():
        order = ranked(result["settings"], signal)
        best = next((s for s in order if s["fluent"] and s[field] > 0), None)
        profile_best = next((s for s in order if s["index"] == profile_feature), None)
        picked_profile = best is not None and best["index"] == profile_feature
        as_good = (
            best is not None
            and profile_best is not None
            and (best["fluent"], best[field]) >= (profile_best["fluent"], profile_best[field])
        )
        row[signal] = {
            "best": best,
            "profile_best": profile_best,
            "verdict": "picks it"
            if picked_profile
            else (
                "another, as good by this signal"
                if as_good
                else ("none beats unsteered" if best is None else "another, worse")
            ),
        }
    return row


def show(setting: dict | None, field: str) -> str:
    if setting is None:
        return "none"
    return (
        f"#{setting['index']} × {setting['strength']:g} "
        f"({setting[field]:+.2f}{'' if setting['fluent'] else ', not fluent'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url")
    parser.add_argument("--out", type=Path, default=Path("autosteer_demo.json"))
    parser.add_argument(
        "--concepts",
        nargs="+",
        choices=sorted(CONCEPTS),
        default=list(CONCEPTS),
        help="run only these (each takes minutes)",
    )
    args = parser.parse_args()
    concepts = {name: CONCEPTS[name] for name in args.concepts}
    server = None
    base_url = args.base_url
    if base_url is None:
        server = ServerProcess(
            Path(tempfile.mkdtemp(prefix="millm-bench-")), ["--log-level", "warning"]
        ).wait_ready(timeout=600)
        base_url = server.base_url
    rows, results = [], {}
    try:
        with httpx.Client(base_url=base_url, timeout=600) as client:
            for concept, (goal, feature, examples) in concepts.items():
                result, seconds = run_job(
                    client, {"goal": goal, "examples": examples, "include": [feature]}
                )
                results[concept] = result
                rows.append(summary(concept, feature, result, seconds))
                print(
                    f"{concept}: {rows[-1]['judge']['verdict']} / "
                    f"{rows[-1]['affinity']['verdict']} in {seconds:.0f} s",
                    file=sys.stderr,
                )
                args.out.write_text(json.dumps({"rows": rows, "results": results}, indent=1))
    finally:
        if server is not None:
            server.stop()
    print(
        "| concept (profile's feature) | candidates found | by judge: best (P(yes) lift) | "
        "profile's feature, best | by affinity: best (lift, nats/token) | profile's feature, best "
        "| time |"
    )
    print("|---|---|---|---|---|---|---:|")
    for row, (concept, (_, feature, _)) in zip(
        rows, concepts.items(), strict=False
    ):  # a run stopped early has fewer rows
        found = ", ".join(
            f"#{i}" + ("*" if source == "contrast" else "") for i, _, source in row["found"]
        )
        cells = [
            f"{show(row[s]['best'], f)} – {row[s]['verdict']} | {show(row[s]['profile_best'], f)}"
            for s, f in SIGNALS.items()
        ]
        print(
            f"| {concept} (#{feature}) | "
            f"{found}{' (incl. #' + str(feature) + ')' if row['profile_found'] else ''} | "
            f"{cells[0]} | {cells[1]} | {row['seconds']} s |"
        )


if __name__ == "__main__":
    main()
