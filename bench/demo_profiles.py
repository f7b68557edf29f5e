"""The demo profiles' operating points, measured with millm's own steering evaluation in each
numeric mode a CPU gives the demo model, and their README regenerated from the profiles as shipped.

Per numeric mode, one demo server (started as `./scripts/serve` starts it, with the mode's
flags and instruction-set caps, which torch's kernels read at their first operation):

- llama.cpp: the server's default (the Q4_1 file on llama.cpp, float16 keys and values). millm
  builds llama.cpp for AVX2 whatever the CPU has, so this mode's kernels are the same on every x86
  CPU, and the caps would change nothing;
- transformers bf16: `--engine transformers` (bfloat16 activations, int4 weights), uncapped, on
  whatever this CPU has (AVX-512 on a Zen 4/5 or a Xeon; on an AVX2-only CPU it is the same as
  the next mode, and is said so);
- transformers bf16 capped at AVX2: the same under ATEN_CPU_CAPABILITY=avx2,
  ONEDNN_MAX_CPU_ISA=AVX2 and MKL_ENABLE_INSTRUCTIONS=AVX2 (what an AMD without AVX-512 runs).

Each server runs one `POST /api/evaluations` per profile (its concept, the six default
instructions and the README's weekend question, 48 tokens, the likelihood judge), every profile at
intensity 1.0 (as shipped) and 0.8 (the margin: a profile that still brings its concept in at 80 %
of its strength is not sitting on a kernel's rounding), and asks the acceptance test's question
(tests/acceptance/test_demo_steering.py: the weekend answer, 60 tokens, greedy, plain and
steered) counting the profile's topic words, also with the profile dialled to 0.8-1.2.

    .venv/bin/python bench/demo_profiles.py                       # measure, write the README
    .venv/bin/python bench/demo_profiles.py --modes llama.cpp \\
        --try france=6:35,546:25 --try france=6:40,1362:15,546:15   # try operating points

`--try PROFILE=INDEX:STRENGTH[,INDEX:STRENGTH]` measures a candidate beside the shipped profile
(the same concept and topic words; nothing is written), `--only-tries` leaves the shipped ones
out, and `--scan 0.8,1.0,1.2` only counts the weekend answer's topic words at those dials (a
minute, not an evaluation). Results go to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from string import Template

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.lab.evaluations.job import DEFAULT_INSTRUCTIONS  # noqa: E402
from tests.acceptance.test_demo_steering import WEEKEND, topic_words  # noqa: E402
from tests.support.model_cache import start_sharing  # noqa: E402

PROFILES = ROOT / "millm" / "demo" / "profiles"
# Every mode's last figures, kept so that a run on one CPU keeps the modes only another CPU has.
MEASURED = ROOT / "bench" / "demo_profiles.json"
TEMPLATE = ROOT / "bench" / "demo_profiles_readme.md"  # the README's prose
MODEL = "SmolLM2-135M-Instruct"
# What each profile's evaluation asks the judge for (AxBench's concept).
CONCEPTS = {
    "france": "France",
    "italian-food": "Italian food",
    "music": "music",
    "pirate": "pirates",
}
AVX2 = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
MODES = {
    "llama.cpp": ([], {}),
    "bf16": (["--engine", "transformers"], {}),
    "bf16-avx2": (["--engine", "transformers"], AVX2),
}
# What a mode needs of the CPU, for the README's line on a mode not measured yet.
MODE_NEEDS = {
    "bf16": "transformers bf16 on AVX-512 (a CPU with AVX-512: an AMD Zen 4 or 5, an Intel Xeon)",
    "bf16-avx2": "transformers bf16 capped at AVX2 (any x86 CPU)",
}
INSTRUCTIONS = ["Tell me about your weekend.", *DEFAULT_INSTRUCTIONS]
INTENSITIES = [0.8, 1.0]
# Dials the weekend answer is also asked at: a profile whose answer names its topic from 0.8x to
# 1.2x of its strength has many greedy paths to it, so a kernel's rounding that changes the path
# keeps it on topic.
AROUND = [0.8, 0.9, 1.1, 1.2]


def candidate(text: str) -> tuple[str, list[dict]]:
    """`PROFILE=INDEX:STRENGTH[,INDEX:STRENGTH]` as (profile, features)."""
    profile, _, features = text.partition("=")
    if profile not in CONCEPTS or not features:
        raise argparse.ArgumentTypeError(
            f"{text!r}: PROFILE=INDEX:STRENGTH[,...], PROFILE one of {sorted(CONCEPTS)}"
        )
    pairs = [part.split(":") for part in features.split(",")]
    return profile, [{"index": int(i), "strength": float(s)} for i, s in pairs]


def shipped() -> dict[str, dict]:
    """The profile documents as shipped, by name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(PROFILES.glob("*.json"))}


def answer(client: httpx.Client, **extra) -> str:
    """The acceptance test's weekend answer (60 tokens, greedy)."""
    body = {"model": MODEL, "messages": WEEKEND, "max_tokens": 60, "temperature": 0, **extra}
    response = client.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def evaluate(client: httpx.Client, concept: str, profiles: list[str]) -> dict:
    """One evaluation of these profiles at INTENSITIES: its stored result."""
    body = {
        "concept": concept,
        "name": f"demo profiles: {concept}",
        "instructions": INSTRUCTIONS,
        "max_tokens": 48,
        "candidates": [
            {"kind": "profile", "profile": p, "intensities": INTENSITIES} for p in profiles
        ],
    }
    job = client.post("/api/evaluations", json=body)
    job.raise_for_status()
    job = job.json()
    while job["state"] in ("queued", "running"):
        time.sleep(1)
        job = client.get(f"/api/jobs/{job['id']}").json()
    if job["state"] != "succeeded":
        raise RuntimeError(f"evaluation {concept!r} ended {job['state']}: {job.get('error')}")
    return job["result"]


def figures(point: dict) -> dict:
    """A point's means, rounded for the table, and its lowest concept score over the
    instructions."""
    keys = ("concept", "instruction_score", "fluency", "harmonic_mean", "perplexity")
    means = {k: None if point[k] is None else round(point[k], 3) for k in keys}
    return {**means, "concepts": [round(s["concept"], 2) for s in point["samples"]]}


def measure_mode(
    mode: str, tries: list[tuple[str, list[dict]]], scales: list[float], only_tries: bool = False
) -> dict:
    """Every shipped profile (and each tried candidate) in one numeric mode; with `scales`, only
    the weekend answer's topic words at each dial (a quick scan for a plateau)."""
    args, caps = MODES[mode]
    home = Path(tempfile.mkdtemp(prefix=f"millm-profiles-{mode}-"))
    server = start_sharing("demo", home, ["--log-level", "warning", *args], env=caps)
    try:
        with httpx.Client(base_url=server.base_url, timeout=900) as client:
            sae = client.get("/api/saes").json()["data"][0]["id"]
            names = {
                name: (name, [f for s in doc["steering"] for f in s["features"]])
                for name, doc in shipped().items()
                if not only_tries
            }
            for n, (profile, features) in enumerate(tries):
                name = f"try-{n}-{profile}"
                steering = [{"sae_id": sae, "layer": 12, "features": features}]
                made = client.post("/api/profiles", json={"name": name, "steering": steering})
                made.raise_for_status()
                names[name] = (profile, features)
            plain = answer(client)
            result: dict = {"mode": mode, "caps": caps, "plain": plain, "profiles": {}}
            if scales:
                return {**result, "scan": scan(client, mode, names, scales, plain)}
            for concept_of in sorted({of for of, _ in names.values()}):
                mine = [name for name, (of, _) in names.items() if of == concept_of]
                evaluation = evaluate(client, CONCEPTS[concept_of], mine)
                baseline = figures(evaluation["baseline"])
                for name, sweep in zip(mine, evaluation["candidates"], strict=True):
                    steered = answer(client, profile=name)
                    around = {str(x): words_at(client, name, x, concept_of) for x in AROUND}
                    points = {str(p["strength"]): figures(p) for p in sweep["points"]}
                    result["profiles"][name] = {
                        "of": concept_of,
                        "features": [
                            {"index": f["index"], "strength": f["strength"]} for f in names[name][1]
                        ],
                        "baseline": baseline,
                        "points": points,
                        "weekend": steered,
                        "topic_words": topic_words(steered, concept_of),
                        "plain_topic_words": topic_words(plain, concept_of),
                        "around": {**around, "1.0": topic_words(steered, concept_of)},
                    }
                    print(
                        f"[{mode}] {name}: {points['1.0']} at 0.8 {points['0.8']['concept']}; "
                        f"weekend words {topic_words(steered, concept_of)} vs "
                        f"{topic_words(plain, concept_of)}, around: {around}",
                        flush=True,
                    )
            return result
    finally:
        server.stop()


def words_at(client: httpx.Client, profile: str, dial: float, of: str) -> int:
    """The weekend answer's topic words with the profile through `dial` (steering_intensity)."""
    return topic_words(answer(client, profile=profile, steering_intensity=dial), of)


def scan(client: httpx.Client, mode: str, names: dict, scales: list[float], plain: str) -> dict:
    """The weekend answer's topic words per profile at each dial."""
    found = {}
    for name, (of, _) in names.items():
        words = [words_at(client, name, x, of) for x in scales]
        found[name] = dict(zip(map(str, scales), words, strict=True))
        print(f"[{mode}] {name}: plain {topic_words(plain, of)}, at {scales}: {words}", flush=True)
    return found


def cpu() -> dict:
    """This CPU: its name and the widest instruction set torch uses on it uncapped."""
    import torch

    name = platform.processor() or platform.machine()
    for line in (
        Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    ):
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
            break
    return {"name": name, "capability": torch.backends.cpu.get_cpu_capability()}


def mode_title(mode: str, measured: dict) -> str:
    """A mode as the README's table names it."""
    if mode == "llama.cpp":
        return "llama.cpp (the default)"
    if mode == "bf16-avx2":
        return "transformers bf16, capped at AVX2"
    return f"transformers bf16, {measured['cpu']['capability'].replace('AVX512', 'AVX-512')}"


def current(measurements: dict, profiles: dict[str, dict]) -> dict:
    """The stored measurements that measured the profiles as shipped (a mode measured before a
    profile changed is stale and left out)."""

    def same(mode: dict) -> bool:
        return all(
            mode["profiles"].get(name, {}).get("features")
            == [
                {"index": f["index"], "strength": f["strength"]}
                for s in doc["steering"]
                for f in s["features"]
            ]
            for name, doc in profiles.items()
        )

    return {mode: m for mode, m in measurements.items() if same(m)}


def quote(text: str) -> str:
    """A model's answer as a markdown quote."""
    return "> " + text.strip().replace("\n", "\n> ")


def readme(measurements: dict) -> str:
    """The profiles' README (the template's prose) from the profiles as shipped and the
    measurements that match them."""
    profiles = shipped()
    modes = current(measurements, profiles)
    labels = json.loads((ROOT / "millm/demo/sae/smollm2-135m-topk/feature_labels.json").read_text())
    rows = []
    for name, doc in profiles.items():
        feats = ", ".join(
            f"#{f['index']} x {f['strength']:g}" for s in doc["steering"] for f in s["features"]
        )
        for mode, measured in modes.items():
            row = measured["profiles"][name]
            full, low = row["points"]["1.0"], row["points"]["0.8"]
            rows.append(
                f"| {name} | {feats} | {mode_title(mode, measured)} | {full['concept']:.2f} "
                f"({row['baseline']['concept']:.2f}) | "
                f"{full['instruction_score']:.2f} | {full['fluency']:.2f} | "
                f"{full['harmonic_mean']:.2f} | {low['concept']:.2f} | {row['plain_topic_words']} "
                f"→ {row['topic_words']} ({min(row['around'].values())}) |"
            )
    for mode, measured in modes.items():
        base = next(iter(measured["profiles"].values()))["baseline"]
        rows.append(
            f"| (unsteered) | | {mode_title(mode, measured)} | | {base['instruction_score']:.2f} | "
            f"{base['fluency']:.2f} | | | |"
        )
    measured_on = "Measured on: " + "; ".join(
        f"{mode_title(mode, m)} on {m['cpu']['name']} ({m['cpu']['capability']}, {m['date']})"
        for mode, m in modes.items()
    )
    missing = [MODE_NEEDS.get(mode, mode) for mode in MODES if mode not in modes]
    if missing:
        measured_on += (
            ".\n\nNot yet measured for the profiles as shipped: "
            + ", ".join(missing)
            + ". Run the script where each can run (`--modes`): it adds its rows and keeps these"
        )
    answers = []
    shown = [mode for mode in ("llama.cpp", "bf16", "bf16-avx2") if mode in modes]
    for mode in shown:
        answers += [
            f"Unsteered, {mode_title(mode, modes[mode])}:",
            "",
            quote(modes[mode]["plain"]),
            "",
        ]
    for name, doc in profiles.items():
        described = ", ".join(
            f'#{f["index"]} "{labels.get(str(f["index"]), {}).get("label", "?")}" x '
            f"{f['strength']:g}"
            for s in doc["steering"]
            for f in s["features"]
        )
        answers += [f"### {name}", "", doc["description"], "", f"Features: {described}.", ""]
        for mode in shown:
            weekend = modes[mode]["profiles"][name]["weekend"]
            answers += [f"{mode_title(mode, modes[mode])}:", "", quote(weekend), ""]
    return Template(TEMPLATE.read_text()).substitute(
        sae=next(iter(profiles.values()))["steering"][0]["sae_id"],
        rows="\n".join(rows),
        measured=measured_on + ".",
        answers="\n".join(answers),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument("--try", dest="tries", type=candidate, action="append", default=[])
    parser.add_argument(
        "--only-tries",
        action="store_true",
        help="measure the --try candidates, not the shipped profiles",
    )
    parser.add_argument(
        "--scan",
        default="",
        help="comma-separated dials: only count the weekend answer's topic words at each (no "
        "evaluation)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="every measurement as JSON (default: with --try, /tmp/demo-profiles.json)",
    )
    args = parser.parse_args()
    here = cpu()
    modes = [m for m in args.modes.split(",") if m]
    if "bf16" in modes and here["capability"] == "AVX2" and "bf16-avx2" in modes:
        modes.remove("bf16")  # the same kernels: this CPU's bf16 is the AVX2-capped one
        print("this CPU has no AVX-512: its bf16 is the AVX2 mode, measured once", flush=True)
    stored = MEASURED
    measurements = json.loads(stored.read_text()) if stored.exists() else {}
    fresh = {}
    for mode in modes:
        scales = [float(x) for x in args.scan.split(",") if x]
        result = measure_mode(mode, args.tries, scales, args.only_tries)
        fresh[mode] = {**result, "cpu": here, "date": time.strftime("%Y-%m-%d")}
    trying = bool(args.tries or args.scan)
    out = args.out or (Path("/tmp/demo-profiles.json") if trying else None)
    if out is not None:
        out.write_text(json.dumps(fresh, indent=1, ensure_ascii=False) + "\n")
    if trying:
        return  # trying operating points: the shipped README stays as it is
    for mode, result in fresh.items():
        result["profiles"] = {
            k: v for k, v in result["profiles"].items() if not k.startswith("try-")
        }
        measurements[mode] = result
    stored.write_text(json.dumps(measurements, indent=1, ensure_ascii=False) + "\n")
    (PROFILES / "README.md").write_text(readme(measurements))


if __name__ == "__main__":
    main()
