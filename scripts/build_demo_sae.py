#!/usr/bin/env python
"""Build a packaged model's demo SAE with millm's own jobs, as any user would train one.

    .venv/bin/python scripts/build_demo_sae.py [--model SmolLM2-135M-Instruct|gemma3-270m]
        [--work DIR] [--stages chats,train,ship,calibrate]

Servers started as `millm serve` (fresh data directories) do all of it through the API:
  1. chats      (the chat model) the demo model writes its answers to 1,040 fixed prompts
                (scripts/demo_prompts.py) through `/v1/batches`, 32 at a time;
  2. train      local text (the standard library's docstrings, Debian's /usr/share/doc) spread
                through those chats, one JSONL file read as a client's file, and
                `POST /api/saes/train` (SAELens's TopK, at the model's demo layer), graded on the
                corpus's held-out windows in the same job;
  3. ship       the SAE's folder copied into millm/demo/sae/<name>, its latents put in the order of
                the SAE it replaces (below), with the request, the timing and the held-out card;
  4. calibrate  on a server with the model's defaults (which registers and attaches the shipped
                SAE): a calibration on the SAE's calibration corpus (the chat model's shipped
                `calibration_corpus.jsonl`, or held-out local text) that keeps 20 examples a
                feature, labels from its top tokens (`feature_labels.json`), the shipped
                calibration (`calibration.json`, 5 examples a feature), and the grade card the
                server makes on that corpus (`grade.json`); then the README.

Latent order: an SAE's latents have no order of their own, and every rebuild would renumber the
features that profiles, docs and users name. So the new latents are matched one-to-one with the
replaced SAE's by decoder cosine (the Hungarian assignment, scipy's linear_sum_assignment) and
stored in that order: a feature keeps its number when the new SAE learned it again. The README
lists how close the named features' matches are. Gemma's residual is about 6,000 in norm, so its
decoder rows are stored at the norm of its training scale (encoder rows divided by the same
factor: the SAE computes the same reconstruction) and strengths of a few units steer it.

On 2 CPU cores: SmolLM2, chats about 25 minutes, training and its grade 10, the rest 10; Gemma,
training and its grade 10, the rest 15 (most of it the grade: its 262k-token head).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file, save_file
from scipy.optimize import linear_sum_assignment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from demo_prompts import SEED, chat_prompts  # noqa: E402

from bench.dictionary_training import (  # noqa: E402
    CHARS_PER_TOKEN,
    finished,
    local_documents,
    trained,
    write_spread,
)
from millm.interp.sae_files import content_id  # noqa: E402
from millm.kernel.books.calibrations import SHIPPED_FILE, shipped_document  # noqa: E402
from millm.lab.calibration.protocol import CORPUS_FILE  # noqa: E402
from millm.store.calibrations import get_calibration  # noqa: E402
from millm.store.database import Store, database_url  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

SAES = ROOT / "millm" / "demo" / "sae"
WEIGHTS = "sae_weights.safetensors"
CHAT_BODY = {"temperature": 0.7, "top_p": 0.9, "presence_penalty": 0.5, "max_tokens": 160}
# The chats' lines decoded 32 at a time in one continuous batch, 64 lines to a chunk.
BATCHING = {
    "ENABLE_CONTINUOUS_BATCHING": "1", "MAX_BATCH_SIZE": "32", "MILLM_BATCH_CHUNK_ROWS": "64"
}  # fmt: skip


@dataclass(frozen=True)
class Demo:
    """What differs between the packaged models' demo SAEs."""

    model: str
    folder: str
    layer: int
    chats: bool  # a chat model: its own answers are part of the corpus
    scaled_rows: bool  # decoder rows at the training scale's norm (see the docstring)
    named: dict[int, str]  # features profiles, docs and tests name (kept in the README)
    grade_tokens: int  # graded on (Gemma's 262k-token head makes each token costly)


DEMOS = {
    "SmolLM2-135M-Instruct": Demo(
        "SmolLM2-135M-Instruct", "smollm2-135m-topk", 12, True, False,
        {1403: "pirate", 828: "pirate", 1496: "Italian food", 1178: "Italian food",
         797: "Italian food", 6: "France", 36: "France", 1362: "France", 1984: "France",
         1148: "music", 1822: "music"}, 16_384,
    ),
    "gemma3-270m": Demo(
        "gemma3-270m", "gemma3-270m-topk", 9, False, True, {1346: "reading"}, 4096
    ),
}  # fmt: skip


def write_chats(client: httpx.Client, model: str, out: Path) -> None:
    """The demo model's answers to the training prompts, through /v1/batches. Unseeded: a seeded
    request runs alone (its seed promises its own arithmetic), and 1,040 of them would take an
    hour; a rebuild writes other answers of the same kind."""
    lines = [
        {"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "messages": messages, **CHAT_BODY}}
        for i, messages in enumerate(chat_prompts())
    ]  # fmt: skip
    text = "".join(json.dumps(line) + "\n" for line in lines)
    stored = client.post(
        "/v1/files", data={"purpose": "batch"}, files={"file": ("chats.jsonl", text)}
    ).raise_for_status()
    body = {"input_file_id": stored.json()["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}  # fmt: skip
    batch = client.post("/v1/batches", json=body).raise_for_status().json()
    began = time.monotonic()
    while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(10)
        batch = client.get(f"/v1/batches/{batch['id']}").raise_for_status().json()
        counts = batch["request_counts"]
        print(f"chats {counts['completed']}/{counts['total']}, {time.monotonic() - began:.0f} s")
    if batch["status"] != "completed" or batch["request_counts"]["failed"]:
        raise SystemExit(f"the chats' batch ended {batch['status']}: {batch}")
    answers = client.get(f"/v1/files/{batch['output_file_id']}/content").raise_for_status()
    replies = map(json.loads, answers.text.splitlines())
    by_id = {row["custom_id"]: row["response"]["body"] for row in replies}
    rows = []
    for line in lines:
        choice = by_id[line["custom_id"]]["choices"][0]
        answer = {"role": "assistant", "content": choice["message"]["content"]}
        messages = [*line["body"]["messages"], answer]
        rows.append({"messages": messages, "finish_reason": choice["finish_reason"]})
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{len(rows)} chats in {time.monotonic() - began:.0f} s", flush=True)


def write_corpus(work: Path, chats: Path | None, chars: int, unseen: list[str]) -> Path:
    """The training corpus, one JSONL file: local text and the chats spread through each other,
    so that every stretch of it holds both; no document holding one of the `unseen` texts."""
    marks = [text.strip()[:80] for text in unseen]
    documents = [{"text": d} for d in local_documents(chars) if not any(m in d for m in marks)]
    talks = [json.loads(line) for line in chats.read_text().splitlines()] if chats else []
    corpus = work / "corpus.jsonl"
    write_spread(corpus, documents, [{"messages": t["messages"]} for t in talks])
    return corpus


def calibration_texts(demo: Demo, chars: int) -> list[str]:
    """The plain texts of the SAE's shipped calibration corpus (the training must not read them).
    A folder that ships none (a base model's) gets one: 150 stretches of 1,500 characters of the
    local text past what the training reads."""
    corpus = SAES / demo.folder / CORPUS_FILE
    if not corpus.is_file():
        past = local_documents(int(chars * 1.5))[-150:]
        rows = [{"source": "local", "text": text[:1500]} for text in past]
        corpus.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    rows = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    return [row["text"] for row in rows if "text" in row]


def train(work: Path, demo: Demo, args: argparse.Namespace) -> None:
    """Train, grade on the held-out windows; the folder, request, timing and card into `work`."""
    chats = work / "chats.jsonl" if demo.chats else None
    chars = int(args.tokens / args.epochs * CHARS_PER_TOKEN * (0.55 if demo.chats else 1.1))
    corpus = write_corpus(work, chats, chars, calibration_texts(demo, chars))
    home = work / "train-home"
    shutil.rmtree(home, ignore_errors=True)
    flags = ["--log-level", "warning", "--engine", "transformers", "--model", demo.model]
    server = ServerProcess(home, flags, allowed=[work]).wait_ready(900)
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            body = {
                "kind": "sae", "name": demo.folder, "layer": demo.layer, "architecture": "topk",
                "d_sae": 2048, "k": 32, "training_tokens": args.tokens, "batch_tokens": 4096,
                "lr": 2e-3, "epochs": args.epochs, "seed": SEED,
                "corpus": {"files": [str(corpus)], "context_size": 128},
                "then": {"attach": True, "grade": True},
            }  # fmt: skip
            view, took = trained(client, body)
            print(f"trained and graded in {took:.0f} s", flush=True)
            sae_id = view["result"]["sae_id"]
            card = client.get(f"/api/saes/{sae_id}/grades").raise_for_status().json()["data"][0]
            made = Path(client.get(f"/api/saes/{sae_id}").raise_for_status().json()["path"])
    finally:
        server.stop()
    shutil.rmtree(work / "trained", ignore_errors=True)
    shutil.copytree(made, work / "trained")
    training = {"request": view["request"], "timing": view["progress"]["timing"],
                "final": view["progress"]["curve"][-1], "held_out_grade": card}  # fmt: skip
    (work / "training.json").write_text(json.dumps(training, indent=1) + "\n")


def matched_order(new_dec: torch.Tensor, old_dec: torch.Tensor) -> tuple[list[int], list[float]]:
    """For each old latent i, the new latent put at i (one-to-one, most decoder cosine in all)
    and the cosine of the pair."""
    new = torch.nn.functional.normalize(new_dec.double(), dim=1)
    old = torch.nn.functional.normalize(old_dec.double(), dim=1)
    cosine = old @ new.T
    rows, cols = linear_sum_assignment(cosine.numpy(), maximize=True)
    order = [0] * len(rows)
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        order[i] = j
    return order, [float(cosine[i, order[i]]) for i in range(len(order))]


def ship(work: Path, demo: Demo) -> None:
    """The trained SAE into the demo folder: latents in the replaced SAE's order, Gemma's rows
    scaled, cfg.json and training.json beside; the files the next stage remakes removed."""
    out = SAES / demo.folder
    weights = load_file(str(work / "trained" / WEIGHTS))
    old = load_file(str(out / WEIGHTS))["W_dec"].float()
    order, cosines = matched_order(weights["W_dec"].float(), old)
    index = torch.tensor(order)
    weights = {
        "W_enc": weights["W_enc"][:, index],
        "b_enc": weights["b_enc"][index],
        "W_dec": weights["W_dec"][index],
        "b_dec": weights["b_dec"],
    }
    cfg = json.loads((work / "trained" / "cfg.json").read_text())
    if demo.scaled_rows:
        scale = float(old.norm(dim=1).median())
        weights["W_dec"] = weights["W_dec"] * scale
        weights["W_enc"] = weights["W_enc"] / scale
        weights["b_enc"] = weights["b_enc"] / scale
        cfg["metadata"]["millm_decoder_row_norm"] = scale
    training = json.loads((work / "training.json").read_text())
    training["latent_order"] = {
        "matched_to": content_id(out / WEIGHTS),
        "mean_cosine": sum(cosines) / len(cosines),
        "cosines": [round(c, 3) for c in cosines],  # latent i's with the replaced SAE's latent i
    }
    for stale in ("calibration.json", "feature_labels.json", "grade.json", "corpus_manifest.json"):
        (out / stale).unlink(missing_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / WEIGHTS))
    (out / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(training, indent=1) + "\n")
    print(f"latents matched, mean cosine {training['latent_order']['mean_cosine']:.3f}", flush=True)


def calibrate(work: Path, demo: Demo) -> None:
    """Labels, the shipped calibration and the grade card, made on the model's default server."""
    out = SAES / demo.folder
    sae_id = content_id(out / WEIGHTS)
    home = work / "ship-home"
    shutil.rmtree(home, ignore_errors=True)
    flags = ["--log-level", "warning", "--model", demo.model]
    server = ServerProcess(home, flags, allowed=[work]).wait_ready(900)
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            for top_examples in (20, 5):  # 20 to label from, then the 5 that ship
                body = {"corpus": "demo", "top_examples": top_examples}
                job = client.post(f"/api/saes/{sae_id}/calibrate", json=body).raise_for_status()
                done = finished(client, f"/api/jobs/{job.json()['id']}")
                if done["state"] != "succeeded":
                    raise SystemExit(f"calibration: {done}")
                if top_examples == 20:
                    client.post(f"/api/saes/{sae_id}/labels/top-tokens", json={}).raise_for_status()
                    labels = client.get(f"/api/saes/{sae_id}/labels", params={"detail": "true"})
                    found = labels.raise_for_status().json()
                    text = json.dumps(found, indent=1, ensure_ascii=False)
                    (out / "feature_labels.json").write_text(text + "\n")
            grade = {"corpus": {"shipped_by": sae_id}, "max_tokens": demo.grade_tokens}
            job = client.post(f"/api/saes/{sae_id}/grade", json=grade).raise_for_status()
            card = finished(client, f"/api/jobs/{job.json()['id']}")["result"]
            model = done["result"]["model"]
    finally:
        server.stop()
    (out / "grade.json").write_text(json.dumps(card) + "\n")
    store = Store(database_url(home, None))
    row = get_calibration(store, sae_id, model)
    store.close()
    document = shipped_document(row)
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    (out / SHIPPED_FILE).write_text(text + "\n")
    print(json.dumps(card["figures"]), flush=True)


def card_rows(figures: dict) -> str:
    """A grade card's figures as the README's table rows."""
    f = figures
    return "\n".join(
        f"| {name} | {value} |"
        for name, value in [
            ("fraction of variance explained", f"{f['fraction_variance_explained']:.3f}"),
            ("L0", f"{f['l0']:.1f}"),
            ("dead / dense latents", f"{f['dead_fraction']:.3f} / {f['dense_fraction']:.3f}"),
            ("CE loss clean / spliced / zero-ablated (nats)",
             " / ".join(f"{f[k]:.3f}" for k in ("ce_loss_clean", "ce_loss_spliced",
                                                 "ce_loss_zero_ablated"))),
            ("CE loss recovered", f"{f['ce_loss_recovered']:.3f}"),
            ("KL spliced / zero-ablated (nats per token), KL score",
             f"{f['kl_spliced']:.3f} / {f['kl_zero_ablated']:.3f}, {f['kl_score']:.3f}"),
        ]
    )  # fmt: skip


def readme(demo: Demo, out: Path) -> str:
    """The SAE's README: what it is, how it was made (training.json), its cards and files."""
    training = json.loads((out / "training.json").read_text())
    card = json.loads((out / "grade.json").read_text())
    summary = json.loads((out / SHIPPED_FILE).read_text())["summary"]
    cfg = json.loads((out / "cfg.json").read_text())
    asked, timing, order = training["request"], training["timing"], training["latent_order"]
    held_out = training["held_out_grade"]
    provenance = cfg["metadata"]["millm_provenance"]
    sae_id = content_id(out / WEIGHTS)
    size = (out / WEIGHTS).stat().st_size / 1e6
    labels = json.loads((out / "feature_labels.json").read_text())
    named = "\n".join(
        f"| {i} | {topic} | {labels[str(i)]['label']} | {order['cosines'][i]:.3f} |"
        for i, topic in demo.named.items()
    )
    if demo.scaled_rows:
        rows = (
            f"Decoder rows have L2 norm {cfg['metadata']['millm_decoder_row_norm']:.1f} (the "
            "training scale; the encoder divided by the same factor, so the reconstruction is "
            "the same): a strength `s` moves the residual by that many times `s`. The residual "
            "here is about 6,000 in norm; with unit rows, steering would need strengths past "
            "millm's ±200 range."
        )
    else:
        rows = (
            "Decoder rows have unit L2 norm (SAELens folds a TopK SAE's decoder norms into the "
            "encoder when it saves one), so a strength is in residual-norm units: `s * W_dec[i]` "
            "moves the residual by `s`."
        )
    corpus = (
        "the standard library's docstrings and Debian's /usr/share/doc, spread through 1,040 "
        "chats whose answers the demo model wrote (`scripts/demo_prompts.py`: 960 topic x "
        "template prompts drawn with seed 1234, one in twelve under a persona system prompt, "
        "and 80 hand-written ones; temperature 0.7, top_p 0.9, presence penalty 0.5, at most "
        "160 tokens, through `/v1/batches`)"
        if demo.chats
        else "the standard library's docstrings and Debian's /usr/share/doc (a base model: no "
        "chats)"
    )
    calibrated_on = f'its calibration corpus (`{CORPUS_FILE}`, `{{"corpus": "demo"}}`)'
    shipped_corpus = (
        f"\n\n`{CORPUS_FILE}` ({summary['texts']} texts) is the corpus a calibration or a grade "
        'reads with `{"corpus": "demo"}`: chats about the demo profiles\' topics (food, France, '
        "Italy, music, the sea and pirates) and everyday ones, whose answers the demo model wrote "
        "in float32 (seed 2027), and windows of standard-library docstrings and code. It is kept "
        "from one build to the next, so that calibrations and cards stay comparable; the "
        "training never reads its chats, and leaves out every document one of its windows comes "
        "from."
        if demo.chats
        else f"\n\n`{CORPUS_FILE}` ({summary['texts']} texts) is the corpus a calibration or a "
        'grade reads with `{"corpus": "demo"}`: 150 stretches of the same kinds of local text as '
        "the training corpus, from documents the training never read."
    )
    return f"""# {demo.folder}: the demo SAE of {demo.model}

A TopK sparse autoencoder (SAE) on the residual stream of **{demo.model}** after block
**{demo.layer}** (`resid_post`, `{cfg["metadata"]["hook_name"]}`), {asked["d_sae"]} latents,
k = {asked["k"]}, float32, {size:.1f} MB, in SAELens's layout (`cfg.json`,
`{WEIGHTS}`): `SAE.load_from_disk` reads it. Id as millm computes it: `{sae_id}`.
{rows}

## How it was made

By millm's own training job, as any user trains one (docs/dictionaries.md), driven by
`scripts/build_demo_sae.py` on a server with `--engine transformers` (2 CPU cores):
`POST /api/saes/train`, SAELens's TopK, batch {asked["batch_tokens"]:,}, lr {asked["lr"]},
{asked["epochs"]} epochs over {provenance["activations_read"]:,} activations read once,
{provenance["tokens"]:,} trained on ({timing["read_s"]:.0f} s reading, {timing["train_s"]:.0f} s
training). The corpus: {corpus}; every 20th window held out. The request as sent, the timing
and the card on the held-out windows are in `training.json`; `cfg.json`'s
`metadata.millm_provenance` says the rest.

Latent order: the latents were matched one-to-one with those of the SAE this one replaced, by
decoder cosine (the assignment with the most cosine in all; mean {order["mean_cosine"]:.3f}), and
stored in that order, so that a feature the new SAE learned again keeps the number profiles, docs
and users name it by. The features the demo's profiles and docs name, their labels, and the cosine
of each with the replaced SAE's feature of the same number:

| feature | named for | label | cosine with the replaced SAE's |
| ---: | --- | --- | ---: |
{named}

## Grade cards

On the held-out windows of its training corpus ({held_out["tokens"]:,} tokens; the training
job's own grade, on the transformers engine):

| figure | value |
|---|---:|
{card_rows(held_out["figures"])}

`grade.json`, the card `GET /api/saes/{sae_id}/grades` lists with the server's own: made on
`millm serve`'s default engine over the first {card["tokens"]:,} tokens of {calibrated_on}:

| figure | value |
|---|---:|
{card_rows(card["figures"])}

## Labels and calibration

`calibration.json` is a calibration on {calibrated_on}, on `{summary["model"]}` with the server's
defaults: millm imports it when it registers this folder, so densities, quantiles, top examples
and percentiles are served without running a job ({summary["texts"]} texts, {summary["tokens"]:,}
tokens, {summary["features_fired"]} of {summary["d_sae"]} features fired, {summary["top_examples"]}
examples a feature). `feature_labels.json` holds {len(labels)} labels, each feature's three
heaviest top tokens on a calibration of the same texts keeping 20 examples a feature
(`POST /api/saes/{{id}}/labels/top-tokens`, docs/labels.md): made by a rule, never checked by hand;
read them as hints.{shipped_corpus}

Position 0 of every sequence is an attention sink whose residual is tens of times the others'
norm: the SAE never trained on it, and activations there mean nothing.

Rebuild: `.venv/bin/python scripts/build_demo_sae.py --model {demo.model}`.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", choices=list(DEMOS))
    parser.add_argument("--work", type=Path, default=None, help="kept between stages")
    parser.add_argument("--stages", default="chats,train,ship,calibrate", help="and readme")
    parser.add_argument("--tokens", type=int, default=2_000_000, help="trained on, all epochs")
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    demo = DEMOS[args.model]
    work = args.work or Path(tempfile.mkdtemp(prefix="millm-demo-sae-"))
    work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    if "chats" in stages and demo.chats:
        home = work / "chats-home"
        shutil.rmtree(home, ignore_errors=True)
        flags = ["--log-level", "warning", "--engine", "transformers"]
        server = ServerProcess(home, flags, env=BATCHING, allowed=[work]).wait_ready(900)
        try:
            with httpx.Client(base_url=server.base_url, timeout=600) as client:
                write_chats(client, demo.model, work / "chats.jsonl")
        finally:
            server.stop()
    if "train" in stages:
        train(work, demo, args)
    if "ship" in stages:
        ship(work, demo)
    if "calibrate" in stages:
        calibrate(work, demo)
    if "readme" in stages or "calibrate" in stages:
        (SAES / demo.folder / "README.md").write_text(readme(demo, SAES / demo.folder))
    print(f"work kept in {work}")


if __name__ == "__main__":
    main()
