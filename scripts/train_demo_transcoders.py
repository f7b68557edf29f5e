#!/usr/bin/env python
"""Train the demo model's transcoder set (one per block) with EleutherAI's sparsify, export it in
circuit-tracer's transcoder-set format, and write its card.

    .venv/bin/pip install -e '.[train]'          # eai-sparsify, once
    .venv/bin/python scripts/train_demo_transcoders.py [--work /tmp/tc-work]

A transcoder per block of SmolLM2-135M-Instruct reads the MLP's normalised input and predicts the
MLP's output (circuit-tracer's `mlp.hook_in` -> `mlp.hook_out`), so with one on every block
millm's attribution graphs are the exact kind (docs/attribution.md). The coder is sparsify's
`SparseCoder` (`transcode=True`: TopK, its fused encoder, its AuxK loss for dead latents, its
initialisation from the first batch's means), trained with Adam at sparsify's learning-rate rule
on activations captured once from the float32 model (sparsify's own Trainer runs the model on
every step, which on 2 CPU cores would cost a forward pass of the whole model per step).

TopK picks a fixed number of features per token; circuit-tracer's files hold a ReLU or a JumpReLU.
At export each TopK coder becomes a JumpReLU with one threshold for all its features, the one that
keeps on average k features on the training tokens (BatchTopK's inference rule, Bussmann et al.
2024); the card's figures are the exported JumpReLU's.

Stages (cached under --work): corpus (train_demo_sae.py's plain-text windows plus the demo SAE's
calibration chats) -> acts (the MLP's input and output at every block, float16 memmaps) -> train
-> export (millm/demo/transcoders/smollm2-135m-jumprelu: config.yaml, layer_{i}.safetensors in
float16) -> card (held-out variance explained, L0 and dead fraction per block; the replacement
model's next-token agreement and cross-entropy; README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

import train_demo_sae as sae_script  # noqa: E402  (the corpus and the model's loading are shared)

from millm.engine.sources import resolve_source  # noqa: E402
from millm.settings import DEMO_MODEL_NAME  # noqa: E402

log = logging.getLogger("train_demo_transcoders")

REPO = SCRIPTS.parent
OUT = REPO / "millm" / "demo" / "transcoders" / "smollm2-135m-jumprelu"
SPEC = sae_script.MODELS[DEMO_MODEL_NAME]
CALIBRATION_CHATS = (
    REPO / "millm" / "demo" / "sae" / "smollm2-135m-topk" / "calibration_corpus.jsonl"
)
N_LAYERS, D_MODEL = SPEC.n_layers, SPEC.d_in
SEED = sae_script.SEED
MASSIVE = 8  # an MLP output above this many times the median norm is left out of training


def build_corpus(work: Path) -> dict:
    """Plain-text windows (train_demo_sae.py's, without writing chat answers) plus the
    calibration chats."""
    path = work / "corpus.json"
    if path.is_file():
        return json.loads(path.read_text())
    plain = dataclasses.replace(SPEC, chat_start=None)
    corpus = sae_script.build_corpus(work, plain)
    tok = sae_script.load_tokenizer(SPEC, work)
    sep = tok.convert_tokens_to_ids(SPEC.doc_start)
    chats = 0
    for n, line in enumerate(CALIBRATION_CHATS.read_text().splitlines()):
        row = json.loads(line)
        if row["source"] != "chat":
            continue
        rendered = tok.apply_chat_template(row["messages"], tokenize=False)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        doc_id = f"calibration-chat:{n}"
        # Opened by the document token like every window: position 0 is the attention sink.
        corpus["sequences"].append(
            {
                "source": "chat",
                "doc": doc_id,
                "heldout": sae_script.is_heldout(doc_id),
                "ids": [sep] + list(ids),
            }
        )
        chats += len(ids)
    corpus["manifest"]["chat"] = {
        "conversations": "the demo SAE's calibration_corpus.jsonl",
        "tokens": chats,
    }
    path.write_text(json.dumps(corpus))
    return corpus


def hf_model(work: Path):
    """The float32 dequantised demo model as transformers loads it (the file millm converts the
    GGUF to)."""
    from transformers import AutoModelForCausalLM

    directory = sae_script.converted_dir(resolve_source(SPEC.name, work / "hub"), work)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    return model.eval()


def mlp_hooks(model, on_mlp):
    """Forward hooks on every block's MLP calling on_mlp(layer, input, output) (its return
    replaces the output)."""
    handles = []
    for layer, block in enumerate(model.model.layers):

        def hook(_module, inputs, output, layer=layer):
            return on_mlp(layer, inputs[0], output)

        handles.append(block.mlp.register_forward_hook(hook))
    return handles


def split_sequences(corpus: dict, split: str) -> list[dict]:
    """The split's sequences, shortest first (fewer pads in a batch): the order of the activation
    files."""
    chosen = [s for s in corpus["sequences"] if s["heldout"] == (split == "heldout")]
    return sorted(chosen, key=lambda s: len(s["ids"]))


def split_rows(corpus: dict, split: str) -> list[list[int]]:
    """The token ids of split_sequences."""
    return [s["ids"] for s in split_sequences(corpus, split)]


def batches(rows: list[list[int]], size: int = 16):
    """Right-padded batches: (ids [B, T], lengths)."""
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        width = max(len(r) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, r in enumerate(chunk):
            ids[i, : len(r)] = torch.tensor(r)
        yield ids, [len(r) for r in chunk]


def capture(work: Path, corpus: dict) -> None:
    """Every block's MLP input and output at every position but the first, as float16 memmaps."""
    if (work / "acts_done").is_file():
        return
    model = hf_model(work)
    for split in ("train", "heldout"):
        rows = split_rows(corpus, split)
        n = sum(len(r) - 1 for r in rows)
        files = {
            (kind, layer): np.lib.format.open_memmap(
                work / f"{split}_{kind}_{layer}.npy",
                mode="w+",
                dtype=np.float16,
                shape=(n, D_MODEL),
            )
            for kind in ("in", "out")
            for layer in range(N_LAYERS)
        }
        at, t0 = 0, time.time()
        where: dict[str, object] = {}

        def keep(layer, x, y):
            lengths, offset = where["lengths"], where["at"]
            for i, length in enumerate(lengths):
                files["in", layer][offset : offset + length - 1] = x[i, 1:length].numpy()
                files["out", layer][offset : offset + length - 1] = y[i, 1:length].numpy()
                offset += length - 1
            return None

        handles = mlp_hooks(model, keep)
        with torch.inference_mode():
            for ids, lengths in batches(rows):
                where.update(lengths=lengths, at=at)
                mask = torch.arange(ids.shape[1]) < torch.tensor(lengths)[:, None]
                model.model(input_ids=ids, attention_mask=mask.long())
                at += sum(length - 1 for length in lengths)
                log.info("acts %s: %d/%d tokens (%.0fs)", split, at, n, time.time() - t0)
        for handle in handles:
            handle.remove()
        for f in files.values():
            f.flush()
    (work / "acts_done").write_text("ok\n")


def train_layer(work: Path, layer: int, args) -> dict:
    """One block's transcoder: sparsify's SparseCoder (transcode, TopK) fitted by Adam."""
    from sparsify import SparseCoder, SparseCoderConfig

    path = work / f"coder_{layer}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    x_all = torch.from_numpy(
        np.load(work / f"train_in_{layer}.npy", mmap_mode="r")[:].astype(np.float32)
    )
    y_all = torch.from_numpy(
        np.load(work / f"train_out_{layer}.npy", mmap_mode="r")[:].astype(np.float32)
    )
    # A few tokens per block get a massive MLP output (up to ~800x the median norm at block 11:
    # 0.1% of the tokens, 99.8% of the variance); they would be all the loss sees. They are left
    # out (the demo SAE's rule: output norm above 8x the median), and both sides are trained in
    # units of their typical scale (a scalar each, folded into the weights at export), so that
    # Adam's steps are of the weights' size in every block.
    norms = y_all.norm(dim=1)
    typical = norms <= MASSIVE * norms.median()
    x_all, y_all = x_all[typical], y_all[typical]
    s_in, s_out = float(x_all.pow(2).mean().sqrt()), float(y_all.pow(2).mean().sqrt())
    x_all, y_all = x_all / s_in, y_all / s_out
    torch.manual_seed(SEED + layer)
    coder = SparseCoder(
        D_MODEL, SparseCoderConfig(num_latents=args.width, k=args.k, transcode=True)
    )
    # sparsify's initialisation on its first batch: pre-activations centred, b_dec at the output
    # mean.
    coder.encoder.bias.data = -x_all.mean(0) @ coder.encoder.weight.data.T
    coder.b_dec.data = y_all.mean(0)
    # sparsify's rule for the number of latents
    lr = args.lr or 2e-4 / math.sqrt(args.width / 2**14)
    optimizer = torch.optim.Adam(coder.parameters(), lr=lr)
    n = len(x_all)
    steps = args.epochs * (n // args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / (0.05 * steps)) * min(1.0, (steps - s) / (0.2 * steps)),
    )
    since_fired = torch.zeros(args.width, dtype=torch.long)
    generator = torch.Generator().manual_seed(SEED + layer)
    step = 0
    for _epoch in range(args.epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - args.batch + 1, args.batch):
            pick = order[start : start + args.batch]
            dead = since_fired > args.dead_after
            out = coder(x_all[pick], y_all[pick], dead_mask=dead)
            loss = out.fvu + args.aux_coef * out.auxk_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            fired = torch.zeros(args.width, dtype=torch.bool)
            fired[out.latent_indices.flatten()] = True
            since_fired = torch.where(fired, 0, since_fired + len(pick))
            step += 1
        log.info(
            "layer %d epoch %d: fvu %.3f, dead %d", layer, _epoch, float(out.fvu), int(dead.sum())
        )
    state = {k: v.detach().clone() for k, v in coder.state_dict().items()}
    state["scale_in"], state["scale_out"] = torch.tensor(s_in), torch.tensor(s_out)
    state["left_out"] = torch.tensor(int((~typical).sum()))
    # The JumpReLU export's threshold: the pre-activation above which, on average, k features per
    # training token lie (BatchTopK's inference threshold).
    with torch.no_grad():
        sample = x_all[torch.randperm(n, generator=generator)[:32768]]
        pre = torch.relu(sample @ coder.encoder.weight.T + coder.encoder.bias)
        state["threshold"] = torch.tensor(
            float(torch.quantile(pre.flatten()[:16_000_000], 1 - args.k / args.width))
        )
    torch.save(state, path)
    return state


def jumprelu_tensors(state: dict) -> dict[str, torch.Tensor]:
    """circuit-tracer's SingleLayerTranscoder tensors for a trained coder (float16), its training
    scales folded in: it reads and writes the model's own units."""
    width = state["encoder.weight"].shape[0]
    s_in, s_out = float(state["scale_in"]), float(state["scale_out"])
    tensors = {
        "W_enc": state["encoder.weight"] / s_in,  # [d_transcoder, d_model]
        "b_enc": state["encoder.bias"],
        "W_dec": state["W_dec"] * s_out,  # [d_transcoder, d_model]
        "b_dec": state["b_dec"] * s_out,
        "activation_function.threshold": state["threshold"].expand(width),
    }
    return {k: v.to(torch.float16).contiguous() for k, v in tensors.items()}


def export(states: list[dict], out: Path) -> None:
    """config.yaml and layer_{i}.safetensors in circuit-tracer's transcoder-set layout."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for layer, state in enumerate(states):
        save_file(jumprelu_tensors(state), str(out / f"layer_{layer}.safetensors"))
    (out / "config.yaml").write_text(
        "model_kind: transcoder_set\n"
        f"model_name: {SPEC.name}\n"
        "feature_input_hook: mlp.hook_in\n"
        "feature_output_hook: mlp.hook_out\n"
        "scan: millm-demo-smollm2-135m-jumprelu\n"
        "transcoders:\n" + "".join(f"  - layer_{i}.safetensors\n" for i in range(len(states)))
    )


def encode(tensors: dict, x: torch.Tensor) -> torch.Tensor:
    """JumpReLU feature activations as the exported file computes them (float32)."""
    pre = x @ tensors["W_enc"].float().T + tensors["b_enc"].float()
    return pre * (pre > tensors["activation_function.threshold"].float())


def layer_figures(work: Path, tensors: dict, layer: int) -> dict:
    """Held-out variance explained, L0 and dead fraction of one exported transcoder."""
    x = torch.from_numpy(np.load(work / f"heldout_in_{layer}.npy")[:].astype(np.float32))
    y = torch.from_numpy(np.load(work / f"heldout_out_{layer}.npy")[:].astype(np.float32))
    acts = encode(tensors, x)
    y_hat = acts @ tensors["W_dec"].float() + tensors["b_dec"].float()

    def explained(keep):
        ys = y[keep]
        return 1 - float((ys - y_hat[keep]).pow(2).sum() / (ys - ys.mean(0)).pow(2).sum())

    norms = y.norm(dim=1)
    typical = norms <= MASSIVE * norms.median()
    alive = (acts > 0).any(0)
    return {
        "layer": layer,
        "variance_explained": explained(typical),
        "variance_explained_all": explained(norms >= 0),
        "massive_tokens": int((~typical).sum()),
        "l0": float((acts > 0).sum(1).float().mean()),
        "dead_fraction": float(1 - alive.float().mean()),
    }


def spliced(work: Path, corpus: dict, sets: list[dict], every: int = 8) -> dict[int, float]:
    """Next-token cross-entropy with one block's MLP replaced by its transcoder (no error term),
    for each block, on every `every`-th held-out sequence; key -1: the model itself."""
    model = hf_model(work)
    rows = split_rows(corpus, "heldout")[::every]
    replaced = {"layer": -1}

    def swap(layer, x, _y):
        if layer != replaced["layer"]:
            return None
        t = sets[layer]
        return encode(t, x) @ t["W_dec"].float() + t["b_dec"].float()

    handles = mlp_hooks(model, swap)
    found = {}
    with torch.inference_mode():
        for layer in range(-1, len(sets)):
            replaced["layer"] = layer
            total = count = 0.0
            for ids, lengths in batches(rows):
                mask = torch.arange(ids.shape[1]) < torch.tensor(lengths)[:, None]
                logits = model(input_ids=ids, attention_mask=mask.long()).logits.float()
                for i, length in enumerate(lengths):
                    total += float(
                        torch.nn.functional.cross_entropy(
                            logits[i, 1 : length - 1], ids[i, 2:length], reduction="sum"
                        )
                    )
                    count += length - 2
            found[layer] = total / count
    for handle in handles:
        handle.remove()
    return found


def agreement(work: Path, corpus: dict, sets: list[dict]) -> dict:
    """The replacement model (every MLP replaced by its transcoder, no error terms) against the
    model, held out."""
    model = hf_model(work)
    rows = split_rows(corpus, "heldout")
    replace = {"on": False}

    def swap(layer, x, _y):
        if not replace["on"]:
            return None
        t = sets[layer]
        return encode(t, x) @ t["W_dec"].float() + t["b_dec"].float()

    handles = mlp_hooks(model, swap)
    same = total = 0
    ce = {"clean": 0.0, "replaced": 0.0}
    with torch.inference_mode():
        for ids, lengths in batches(rows):
            mask = torch.arange(ids.shape[1]) < torch.tensor(lengths)[:, None]
            logits = {}
            for name in ("clean", "replaced"):
                replace["on"] = name == "replaced"
                logits[name] = model(input_ids=ids, attention_mask=mask.long()).logits.float()
            # Positions 1..len-2 predict tokens 2..len-1 (position 0, the sink, is left out as in
            # training).
            for i, length in enumerate(lengths):
                target = ids[i, 2:length]
                for name in ce:
                    ce[name] += float(
                        torch.nn.functional.cross_entropy(
                            logits[name][i, 1 : length - 1], target, reduction="sum"
                        )
                    )
                same += int(
                    (
                        logits["clean"][i, 1 : length - 1].argmax(-1)
                        == logits["replaced"][i, 1 : length - 1].argmax(-1)
                    ).sum()
                )
                total += length - 2
    for handle in handles:
        handle.remove()
    return {
        "tokens": total,
        "top1_agreement": same / total,
        "ce_clean": ce["clean"] / total,
        "ce_replaced": ce["replaced"] / total,
    }


def card(work: Path, corpus: dict, args, seconds: dict) -> None:
    """The README beside the files: how it was made and what it does on held-out text."""
    from safetensors.torch import load_file

    sets = [load_file(str(OUT / f"layer_{i}.safetensors")) for i in range(N_LAYERS)]
    per_layer = [layer_figures(work, sets[i], i) for i in range(N_LAYERS)]
    agree = agreement(work, corpus, sets)
    one = spliced(work, corpus, sets)
    for f in per_layer:
        f["ce_spliced"] = one[f["layer"]]
    figures = {
        "layers": per_layer,
        "replacement": agree,
        "ce_clean_subset": one[-1],
        "args": vars(args) | {"work": str(args.work)},
        "seconds": seconds,
    }
    (work / "card.json").write_text(json.dumps(figures, indent=1))
    size = sum(p.stat().st_size for p in OUT.glob("layer_*.safetensors"))
    manifest = corpus["manifest"]
    train = sum(len(s["ids"]) - 1 for s in corpus["sequences"] if not s["heldout"])
    held = sum(len(s["ids"]) - 1 for s in corpus["sequences"] if s["heldout"])
    rows = "\n".join(
        f"| {f['layer']} | {f['variance_explained']:.3f} | {f['variance_explained_all']:.3f} | "
        f"{f['massive_tokens']} | {f['l0']:.1f} | {f['dead_fraction']:.3f} | "
        f"{f['ce_spliced']:.3f} |"
        for f in per_layer
    )
    mean_ve = sum(f["variance_explained"] for f in per_layer) / len(per_layer)
    sources = ", ".join(f"{name} {m['tokens']:,}" for name, m in manifest.items())
    (OUT / "README.md").write_text(f"""# smollm2-135m-jumprelu: millm's demo transcoder set

One transcoder per block (30) of **SmolLM2-135M-Instruct**, each reading its block's MLP input
(the normalised residual, `mlp.hook_in`) and predicting the MLP's output (`mlp.hook_out`), in
circuit-tracer's transcoder-set layout: `config.yaml` and `layer_{{i}}.safetensors` (`W_enc`,
`W_dec` `[{args.width}, 576]`, `b_enc`, `b_dec`, `activation_function.threshold`), float16,
{size / 2**20:.1f} MB. With a transcoder on every block, millm's attribution graphs hold attention
and norms and give exact direct effects (docs/attribution.md); circuit-tracer reads the same files.
Made by `scripts/train_demo_transcoders.py` on the development machine (2 CPU cores, no GPU).

## Training

- Coder: EleutherAI sparsify's `SparseCoder` (eai-sparsify {_version("eai-sparsify")}), `transcode=True`,
  {args.width} latents, TopK k = {args.k}, its AuxK loss for latents silent for {args.dead_after:,} tokens
  (coefficient {args.aux_coef}), its initialisation (pre-activations centred, `b_dec` at the output mean);
  Adam at sparsify's learning rate for the width, 5% warm-up and a linear decay over the last 20%,
  batch {args.batch}, {args.epochs} epochs, seed {SEED} + block.
- Data: the float32 model's MLP inputs and outputs on {train:,} training tokens (held out: {held:,},
  split by document): {sources} tokens by source: `scripts/train_demo_sae.py`'s plain-text windows
  (Python's standard library, installed packages' READMEs, Debian's /usr/share/doc) and the demo SAE's
  calibration chats. Position 0 (the attention sink) is left out.
- Scale: a few tokens per block get a massive MLP output (at block 11 up to ~800x the median norm:
  0.1% of the tokens, 99.8% of the output's variance), which would be all the loss sees; tokens
  whose output is above {MASSIVE}x the median norm are left out of training, and inputs and
  outputs are trained in units of their typical scale (one scalar each per block, folded into
  `W_enc`, `W_dec` and `b_dec` at export). At those tokens the error nodes carry what the
  transcoders miss.
- Export: TopK becomes a JumpReLU with one threshold per block for all its features, the
  pre-activation that keeps k features per training token on average (BatchTopK's inference rule);
  the figures below are the exported JumpReLU's.

## Quality on held-out tokens

Replacement model (all 30 MLPs replaced by their transcoders, no error terms) against the model
itself on {agree["tokens"]:,} held-out next-token predictions:

| figure | value |
| --- | ---: |
| top-1 next-token agreement with the model | {agree["top1_agreement"]:.3f} |
| cross-entropy, model | {agree["ce_clean"]:.3f} |
| cross-entropy, replacement model | {agree["ce_replaced"]:.3f} |
| mean variance explained over blocks | {mean_ve:.3f} |

Per block: the variance of the MLP's output explained on the held-out tokens trained for, and on
all of them (the massive outputs included: tokens whose MLP output is above {MASSIVE}x the median
norm, left out of training, counted in the next column); mean active features per token; features
never active on held-out tokens; next-token cross-entropy with this block's MLP alone replaced by
its transcoder (no error term), on every 8th held-out sequence, where the model itself scores
{one[-1]:.3f}:

| block | variance explained | all tokens | massive | L0 | dead fraction | CE, this block replaced |
| ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{rows}

{args.width} features per block is what the 25 MB budget for files in the repository allows; graphs
built on them carry large error nodes, which millm shows and counts (a graph's replacement and
completeness scores).
""")


def make_labels(work: Path, corpus: dict, sets: list[dict], top_n: int = 200) -> None:
    """layer_{i}.labels.json: each live feature labelled as the demo SAE's are (the tokens it fires
    on most, over every captured token), with the tokens its write promotes most through the
    final norm's scale and the unembedding (its `promotes`)."""
    tok = sae_script.load_tokenizer(SPEC, work)
    model = hf_model(work)
    unembed = model.lm_head.weight.float() * model.model.norm.weight.float()  # [V, d]
    where, seqs = [], []
    for split in ("train", "heldout"):
        for s in split_sequences(corpus, split):
            where += [(len(seqs), p) for p in range(1, len(s["ids"]))]
            seqs.append(s)
    for layer, t in enumerate(sets):
        x = torch.cat(
            [
                torch.from_numpy(np.load(work / f"{split}_in_{layer}.npy")[:].astype(np.float32))
                for split in ("train", "heldout")
            ]
        )
        acts = encode(t, x)
        counts = (acts > 0).sum(0)
        values, rows = acts.topk(min(top_n, len(acts)), dim=0)  # [top_n, width]
        promoted = (t["W_dec"].float() @ unembed.T).topk(5, dim=1).indices
        labels = {}
        for j in range(acts.shape[1]):
            if counts[j] == 0:
                continue
            entry = sae_script.label_entry(
                tok, seqs, where, values[:, j], rows[:, j], float(counts[j]) / len(acts)
            )
            entry["promotes"] = [sae_script._show(tok.decode([i])) for i in promoted[j].tolist()]
            # the 25 MB budget: five tokens, a short example
            entry["top_tokens"] = entry["top_tokens"][:5]
            marked, closed = entry["example"].find("[["), entry["example"].find("]]")
            entry["example"] = entry["example"][max(0, marked - 40) : closed + 22]
            labels[str(j)] = entry
        # One line per feature: 30 files of labels stay small beside the weights (the 25 MB budget).
        lines = ",\n".join(
            f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in labels.items()
        )
        (OUT / f"layer_{layer}.labels.json").write_text("{\n" + lines + "\n}\n")
        log.info("labels: block %d, %d live features", layer, len(labels))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/tc-work"))
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--dead-after", type=int, default=100_000)
    parser.add_argument("--aux-coef", type=float, default=1 / 32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("millm").setLevel(logging.WARNING)
    torch.manual_seed(SEED)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    seconds = {}
    t0 = time.time()
    corpus = build_corpus(work)
    seconds["corpus"] = time.time() - t0
    t0 = time.time()
    capture(work, corpus)
    seconds["acts"] = time.time() - t0
    t0 = time.time()
    states = [train_layer(work, layer, args) for layer in range(N_LAYERS)]
    seconds["train"] = time.time() - t0
    export(states, OUT)
    from safetensors.torch import load_file

    t0 = time.time()
    make_labels(
        work, corpus, [load_file(str(OUT / f"layer_{i}.safetensors")) for i in range(N_LAYERS)]
    )
    seconds["labels"] = time.time() - t0
    t0 = time.time()
    card(work, corpus, args, seconds)
    seconds["card"] = time.time() - t0
    log.info("done: %s", {k: round(v) for k, v in seconds.items()})


if __name__ == "__main__":
    main()
