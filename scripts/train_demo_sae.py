#!/usr/bin/env python
"""Train a small TopK sparse autoencoder (SAE) on the residual stream of one of millm's packaged
models.

    --model SmolLM2-135M-Instruct   (default) millm's demo SAE, millm/demo/sae/smollm2-135m-topk,
                                    on block 12 of 30 of the chat model

(Gemma 3 270M's demo SAE is made by millm's own training job: scripts/build_demo_sae.py.)

What differs between the two is one `ModelSpec` each in MODELS (output folder, default layer, the
token that opens every window, whether the model writes chat answers, token budgets, steering
notes).

Plain torch, seeded, CPU only, and offline: the corpus is built from text that is already on the
machine (Python's standard library, the virtualenv's installed packages, Debian's /usr/share/doc),
for the chat model plus chat answers that the model itself writes to a fixed list of prompts.
Stages (each caches its result under --work, so a later stage can be rerun alone; use a separate
--work per model):

    corpus   build the token sequences (train / held-out split by document)     -> corpus.json
    acts     capture resid_post of block --layer from the float32 model          -> acts_*.npy
    train    train the TopK SAE                                                   -> sae_train.pt
    export   write cfg.json + sae_weights.safetensors (decoder rows of unit norm)
    eval     held-out FVU, L0, dead features, next-token CE clean / spliced / ablated
    labels   feature_labels.json (auto labels from top tokens) and README.md
    steer    greedy completions of the model's steering prompt, unsteered and with each of
             --steer-features at each of --steer-strengths                   -> steer.json, README.md
    profiles (chat model only) stamp the steering profiles in millm/demo/profiles with the SAE's
             id (their strengths and README: bench/demo_profiles.py)

    .venv/bin/python scripts/train_demo_sae.py                 # all stages but steer and profiles
    .venv/bin/python scripts/train_demo_sae.py --stages profiles

Each stage's wall time is kept in --work/timings.json and printed in the README. On the 2-core
development machine (shared with a test run):
  SmolLM2-135M-Instruct: corpus ~40 min (almost all of it the model writing 1,040 chat answers),
      acts ~4 min, train ~8 min, eval ~5 min, labels ~1 min.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import html.parser
import importlib.metadata
import json
import logging
import random
import re
import sys
import sysconfig
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from millm.engine.batch import left_pad
from millm.engine.generate import run_job
from millm.engine.jobs import GenerationJob, RowFinished, RowSpec, TextDelta
from millm.engine.loader import DEQUANTISED, GGUF_META, gguf_cache_key, load_model
from demo_prompts import EXTRA_PROMPTS, N_TOPIC_PROMPTS, chat_prompts  # noqa: E402
from millm.engine.prompts import chat_prompt_ids
from millm.engine.residual import ResidualEdit, decoder_layers
from millm.engine.sampling import SamplingParams
from millm.engine.sources import resolve_source
from millm.settings import DEMO_MODEL_NAME

log = logging.getLogger("train_demo_sae")

SEED = 1234
SAE_DIR = REPO / "millm" / "demo" / "sae"
PROFILES_DIR = REPO / "millm" / "demo" / "profiles"


@dataclass(frozen=True)
class ModelSpec:
    """What the script does differently per model; everything else is shared."""

    name: str  # --model, as `millm serve --model` takes it
    title: str  # the README's heading, after the folder name
    model_note: str  # what the README says after the model's name
    out_dir: Path  # where the SAE is written
    layer: int  # default --layer (resid_post of this block)
    n_layers: int  # decoder blocks (checked against the loaded model)
    d_in: int  # hidden size (checked against the loaded model)
    # The token that opens every plain-text window (as in the model's pre-training packing).
    # Position 0 of every sequence is an attention sink with a huge residual norm and is never
    # trained on.
    doc_start: str
    doc_start_is_bos: bool  # doc_start is the tokenizer's BOS token (cfg.json's prepend_bos)
    # The token opening a chat conversation; None for a base model without a chat template: then the
    # corpus has no chat answers (plain text only) and the `profiles` stage does not apply.
    chat_start: str | None
    budgets: dict[str, int]  # tokens wanted per plain-text source (before the held-out split)
    # the steer stage's prompt (a user turn for a chat model, a text to continue otherwise)
    steer_prompt: str
    steering_note: str  # the README's "Steering with it" paragraph
    # False: decoder rows of unit norm (a strength is in residual-norm units). True: rows of norm
    # `scale` (the training normalisation), feature activations in training units, so strengths of a
    # few units steer. Gemma 3's residual norm (~6,000) would need strengths past millm's ±200
    # steering range with unit rows; the SAE computes the same reconstruction either way.
    decoder_rows_scaled: bool = False

    @property
    def chat_answers(self) -> bool:
        return self.chat_start is not None

    def prompt_ids(self, tok, text: str) -> list[int]:
        """`text` as the model is prompted: a user turn in its chat template, or a document
        opened by `doc_start`."""
        if self.chat_answers:
            return chat_prompt_ids(tok, [{"role": "user", "content": text}])
        return [tok.convert_tokens_to_ids(self.doc_start)] + tok(text, add_special_tokens=False)[
            "input_ids"
        ]


MODELS = {
    DEMO_MODEL_NAME: ModelSpec(
        name=DEMO_MODEL_NAME,
        title="millm's demo sparse autoencoder",
        model_note="",
        out_dir=SAE_DIR / "smollm2-135m-topk",
        layer=12,
        n_layers=30,
        d_in=576,
        doc_start="<|endoftext|>",
        doc_start_is_bos=False,
        chat_start="<|im_start|>",
        budgets={
            "stdlib-docstrings": 70_000,
            "stdlib-code": 40_000,
            "package-readmes": 55_000,
            "usr-share-doc": 75_000,
        },
        steer_prompt="Tell me about your weekend.",
        steering_note="""Topic and persona features (see `millm/demo/profiles/`) show plainly at strengths of about 15-50
(a tenth to a third of the residual norm); around 80 most features make the answer repeat one
phrase, and from about 120 the text falls apart. Position 0 is not a place to read features from
(see above). Code and punctuation features are plentiful too (a third of the corpus is code and
technical docs); for chat demos, prefer features whose label ends in `(chat)`.""",
    ),
}

# Corpus: plain-text documents are cut into windows of CHUNK tokens, each opened by the model's
# document-start token (ModelSpec.doc_start).
CHUNK = 127
HELDOUT_PERCENT = 10
CHUNKS_PER_DOC = {
    "stdlib-docstrings": 3,
    "stdlib-code": 1,
    "package-readmes": 6,
    "usr-share-doc": 2,
}
CHAT_MAX_TOKENS = 160
CHAT_SAMPLING = SamplingParams(temperature=0.7, top_p=0.9, presence_penalty=0.5)


# ----------------------------------------------------------------------------------------------
# Model access
# ----------------------------------------------------------------------------------------------

# timings.json's entry for the one-time assembly and conversion of the GGUF file
FIRST_LOAD = "first load"
# spent in it during this run, so the stage it happened in can leave it out
_first_load_seconds = [0.0]


def converted_dir(source, work: Path) -> Path:
    """Where millm keeps the dequantised (float32 safetensors + tokenizer) copy of the model's
    GGUF file."""
    return work / "cache" / DEQUANTISED / gguf_cache_key(source.gguf_path)


def load(spec: ModelSpec, dtype: str, work: Path):
    t0 = time.time()
    # a chunked package's file is assembled on first use
    source = resolve_source(spec.name, work / "hub")
    first = not (converted_dir(source, work) / GGUF_META).is_file()
    lm = load_model(source, dtype=dtype, device="cpu", cache_root=work / "cache")
    if first:
        seconds = time.time() - t0
        _first_load_seconds[0] += seconds
        _record_time(work, FIRST_LOAD, seconds)
    d_model, n_layers = lm.model.config.hidden_size, len(decoder_layers(lm.model))
    if (d_model, n_layers) != (spec.d_in, spec.n_layers):
        raise SystemExit(
            f"{spec.name}: hidden size {d_model} and {n_layers} layers, expected "
            f"{spec.d_in} and {spec.n_layers}"
        )
    return lm


def load_tokenizer(spec: ModelSpec, work: Path):
    """The model's tokenizer from the dequantised copy under --work/cache (no weights loaded)."""
    from transformers import AutoTokenizer

    directory = converted_dir(resolve_source(spec.name, work / "hub"), work)
    if not (directory / GGUF_META).is_file():
        raise SystemExit(
            f"no converted copy of {spec.name}'s GGUF file under {work / 'cache'}: "
            "run the corpus stage first"
        )
    return AutoTokenizer.from_pretrained(str(directory))


def _record_time(work: Path, stage: str, seconds: float) -> None:
    path = work / "timings.json"
    timings = json.loads(path.read_text()) if path.is_file() else {}
    timings[stage] = round(seconds, 1)
    path.write_text(json.dumps(timings, indent=1) + "\n")
    log.info("%s took %.0fs", stage, seconds)


@contextmanager
def timed(work: Path, stage: str, cache: Path | None = None):
    """Record the stage's wall time in --work/timings.json (less any first load of the model, which
    is kept on its own), unless its result was already cached."""
    fresh = cache is None or not cache.is_file()
    t0, once = time.time(), _first_load_seconds[0]
    yield
    if fresh:
        _record_time(work, stage, time.time() - t0 - (_first_load_seconds[0] - once))


class _Stop(Exception):
    pass


def forward(
    lm,
    seqs: list[list[int]],
    *,
    layer: int | None = None,
    stop_at_layer: bool = False,
    replace=None,
    logits: bool = False,
):
    """One batched full-sequence pass through millm's own runner layers (hooks fire as in serving).

    Returns (resid [B, T, d] at `layer` or None, logits [B, T, V] or None, mask [B, T]); rows are
    left-padded. `replace(resid, mask) -> resid` swaps layer `layer`'s output (the SAE splice).
    """
    captured = {}
    _, mask = left_pad(seqs, lm.device)

    def hook(_module, _inputs, output):
        captured["resid"] = output
        if replace is not None:
            return replace(output, mask)
        if stop_at_layer:
            raise _Stop
        return None

    handle = (
        decoder_layers(lm.model)[layer].register_forward_hook(hook) if layer is not None else None
    )
    out = None
    try:
        hidden, _ = lm.runner.hidden_states(seqs)
        if logits:
            out = lm.runner.head_logits(hidden)
    except _Stop:
        pass
    finally:
        if handle is not None:
            handle.remove()
    return captured.get("resid"), out, mask


def generate_texts(
    lm,
    prompts: list[list[int]],
    sampling: SamplingParams,
    max_tokens: int,
    seeds: list[int] | None = None,
    edits: list[ResidualEdit | None] | None = None,
) -> list[tuple[str, str]]:
    """millm's own decode loop (steered rows carry a ResidualEdit, as in serving); returns (text,
    finish_reason) per prompt."""
    texts = [""] * len(prompts)
    finish = [""] * len(prompts)

    def emit(event):
        if isinstance(event, TextDelta):
            texts[event.row] += event.text
        elif isinstance(event, RowFinished):
            finish[event.row] = event.finish_reason

    rows = [
        RowSpec(
            prompt_ids=tuple(p),
            sampling=sampling,
            max_tokens=max_tokens,
            seed=None if seeds is None else seeds[i],
            edit=None if edits is None else edits[i],
        )
        for i, p in enumerate(prompts)
    ]
    run_job(lm, GenerationJob(rows=rows, emit=emit))
    return list(zip(texts, finish))


# ----------------------------------------------------------------------------------------------
# Stage 1: corpus
# ----------------------------------------------------------------------------------------------


class _HTMLText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self.skip:
            self.skip -= 1
        if tag in ("p", "div", "li", "h1", "h2", "h3", "h4", "pre", "tr", "br"):
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_to_text(raw: str) -> str:
    parser = _HTMLText()
    parser.feed(raw)
    text = "".join(parser.parts)
    text = re.sub(r"[ \t]+", " ", text)
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


def _read(path: Path) -> str | None:
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    if "\x00" in text:
        return None
    return text


def docs_usr_share() -> list[tuple[str, str]]:
    """Readable docs under /usr/share/doc: READMEs, .txt/.md/.rst (maybe gzipped) and .html.
    Skips copyright files and changelogs (licence boilerplate and release notes)."""
    root = Path("/usr/share/doc")
    if not root.is_dir():
        return []
    keep = re.compile(r"(readme|faq|todo|\.txt|\.md|\.rst|\.html?)(\.gz)?$", re.IGNORECASE)
    skip = re.compile(
        r"(copyright|changelog|changes|news|history|authors|thanks|license)", re.IGNORECASE
    )
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.name
        if not keep.search(name) or skip.search(name) or path.stat().st_size < 400:
            continue
        text = _read(path)
        if text is None:
            continue
        if re.search(r"\.html?(\.gz)?$", name, re.IGNORECASE):
            text = html_to_text(text)
        out.append((str(path), text))
    return out


def _stdlib_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = (
        "test",
        "tests",
        "site-packages",
        "idlelib",
        "lib2to3",
        "__pycache__",
        "turtledemo",
        "ensurepip",
    )
    return sorted(
        p
        for p in stdlib.rglob("*.py")
        if not any(part in skip for part in p.relative_to(stdlib).parts)
    )


def stdlib_docstrings() -> list[tuple[str, str]]:
    """Module, class and function docstrings of the standard library, one document per module."""
    out = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in _stdlib_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(stdlib).with_suffix("").parts)
        parts = []
        doc = ast.get_docstring(tree)
        if doc:
            parts.append(f"Module {module}\n\n{doc}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    kind = "class" if isinstance(node, ast.ClassDef) else "def"
                    parts.append(f"{kind} {node.name}:\n{doc}")
        if parts:
            out.append((f"stdlib-doc:{module}", "\n\n".join(parts)))
    return out


def stdlib_code() -> list[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [
        (f"stdlib-code:{p.relative_to(stdlib)}", p.read_text(encoding="utf-8", errors="replace"))
        for p in _stdlib_files()
    ]


def package_readmes() -> list[tuple[str, str]]:
    """Long descriptions (READMEs) in the METADATA of the packages installed in this interpreter."""
    out = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        raw = dist.read_text("METADATA") or ""
        body = raw.split("\n\n", 1)[1] if "\n\n" in raw else ""
        if name and len(body) > 500:
            out[f"package:{name}=={dist.version}"] = body
    return sorted(out.items())


def is_heldout(doc_id: str) -> bool:
    return int(hashlib.sha256(doc_id.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def build_corpus(work: Path, spec: ModelSpec) -> dict:
    path = work / "corpus.json"
    if path.is_file():
        corpus = json.loads(path.read_text())
        if corpus.get("model", DEMO_MODEL_NAME) != spec.name:
            raise SystemExit(
                f"{path} was built for {corpus.get('model', DEMO_MODEL_NAME)}, not "
                f"{spec.name}: use another --work"
            )
        return corpus
    lm = load(spec, "float32", work)
    tok = lm.tokenizer
    sep = tok.convert_tokens_to_ids(spec.doc_start)
    rng = random.Random(SEED)
    sequences = []  # {"source", "doc", "ids", "heldout"}
    manifest = {}
    makers = {
        "stdlib-docstrings": stdlib_docstrings,
        "stdlib-code": stdlib_code,
        "package-readmes": package_readmes,
        "usr-share-doc": docs_usr_share,
    }
    for source, make in makers.items():
        docs = make()
        seen = set()
        unique = []
        for doc_id, text in docs:
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest not in seen:
                seen.add(digest)
                unique.append((doc_id, text))
        rng.shuffle(unique)
        budget, used, files = spec.budgets[source], 0, []
        for doc_id, text in unique:
            if used >= budget:
                break
            ids = tok(text, add_special_tokens=False)["input_ids"]
            n_chunks = len(ids) // CHUNK
            if n_chunks == 0:
                continue
            picks = sorted(rng.sample(range(n_chunks), min(n_chunks, CHUNKS_PER_DOC[source])))
            held = is_heldout(doc_id)
            for c in picks:
                sequences.append(
                    {
                        "source": source,
                        "doc": doc_id,
                        "heldout": held,
                        "ids": [sep] + ids[c * CHUNK : (c + 1) * CHUNK],
                    }
                )
            used += len(picks) * CHUNK
            files.append([doc_id, len(picks) * CHUNK])
        manifest[source] = {
            "documents_available": len(unique),
            "documents_used": len(files),
            "tokens": used,
            "files": files,
        }
        log.info("%s: %d tokens from %d of %d documents", source, used, len(files), len(unique))
    if spec.chat_answers:
        sequences += chat_sequences(work, lm, manifest)
    corpus = {"model": spec.name, "sequences": sequences, "manifest": manifest}
    path.write_text(json.dumps(corpus))
    (work / "chat_answers.partial.jsonl").unlink(missing_ok=True)
    return corpus


def chat_sequences(work: Path, lm, manifest: dict) -> list[dict]:
    """Conversations whose answers the (chat) model writes itself; fills manifest["chat"]."""
    tok = lm.tokenizer
    sequences = []
    conversations = chat_prompts()
    t0 = time.time()
    answers = []
    order = sorted(
        range(len(conversations)), key=lambda i: len(chat_prompt_ids(tok, conversations[i]))
    )
    prompt_ids = [chat_prompt_ids(tok, m) for m in conversations]
    partial = work / "chat_answers.partial.jsonl"  # batches done so far, so a killed run resumes
    done = (
        [json.loads(line) for line in partial.read_text().splitlines()] if partial.is_file() else []
    )
    for start in range(0, len(order), 48):
        batch = order[start : start + 48]
        if start < len(done) * 48:
            answers += [(i, tuple(o)) for i, o in done[start // 48]]
            continue
        outs = generate_texts(
            lm,
            [prompt_ids[i] for i in batch],
            CHAT_SAMPLING,
            CHAT_MAX_TOKENS,
            seeds=[SEED + i for i in batch],
        )
        answers += list(zip(batch, outs))
        with partial.open("a") as handle:
            handle.write(json.dumps(list(zip(batch, outs))) + "\n")
        log.info("chat answers %d/%d (%.0fs)", len(answers), len(order), time.time() - t0)
    answers.sort()
    chat_tokens = 0
    for i, (text, finish) in answers:
        messages = conversations[i] + [{"role": "assistant", "content": text.strip()}]
        rendered = tok.apply_chat_template(messages, tokenize=False)
        if finish == "length":  # an unfinished answer has no closing <|im_end|>
            rendered = rendered.rstrip("\n").removesuffix("<|im_end|>")
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        doc_id = f"chat:{i}"
        sequences.append(
            {
                "source": "chat",
                "doc": doc_id,
                "heldout": is_heldout(doc_id),
                "ids": ids,
                "messages": messages,
            }
        )
        chat_tokens += len(ids) - 1
    manifest["chat"] = {
        "conversations": len(answers),
        "tokens": chat_tokens,
        "sampling": {
            "temperature": CHAT_SAMPLING.temperature,
            "top_p": CHAT_SAMPLING.top_p,
            "presence_penalty": CHAT_SAMPLING.presence_penalty,
            "max_tokens": CHAT_MAX_TOKENS,
            "seed": f"{SEED} + conversation index",
        },
        "dtype": "float32",
    }
    return sequences


# ----------------------------------------------------------------------------------------------
# Stage 2: activations
# ----------------------------------------------------------------------------------------------


def capture(work: Path, corpus: dict, layer: int, spec: ModelSpec) -> None:
    if (work / "acts_train.npy").is_file():
        return
    lm = load(spec, "float32", work)
    seqs = corpus["sequences"]
    sink_norms = []  # residual norm at position 0 (the attention sink), for the README
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["ids"]))
    for split in ("train", "heldout"):
        chosen = [i for i in order if seqs[i]["heldout"] == (split == "heldout")]
        n = sum(len(seqs[i]["ids"]) - 1 for i in chosen)
        acts = np.lib.format.open_memmap(
            work / f"acts_{split}.npy", mode="w+", dtype=np.float32, shape=(n, spec.d_in)
        )
        where = np.zeros((n, 2), dtype=np.int32)  # (sequence index, position)
        row, t0 = 0, time.time()
        with torch.inference_mode():
            for start in range(0, len(chosen), 32):
                batch = chosen[start : start + 32]
                resid, _, mask = forward(
                    lm, [seqs[i]["ids"] for i in batch], layer=layer, stop_at_layer=True
                )
                width = mask.shape[1]
                for r, i in enumerate(batch):
                    length = len(seqs[i]["ids"])
                    x = resid[r, width - length + 1 :]  # drop the left padding and position 0
                    sink_norms.append(float(resid[r, width - length].norm()))
                    acts[row : row + len(x)] = x.float().numpy()
                    where[row : row + len(x), 0] = i
                    where[row : row + len(x), 1] = np.arange(1, length)
                    row += len(x)
                if start % 640 == 0:
                    log.info("acts %s: %d/%d tokens (%.0fs)", split, row, n, time.time() - t0)
        acts.flush()
        np.save(work / f"where_{split}.npy", where)
        log.info("acts %s: %d tokens in %.0fs", split, n, time.time() - t0)
    meta = {"layer": layer, "position0_median_norm": float(np.median(sink_norms))}
    (work / "acts_meta.json").write_text(json.dumps(meta, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------
# Stage 3: the SAE
# ----------------------------------------------------------------------------------------------


class TopKSAE(torch.nn.Module):
    """pre = (x - b_dec) @ W_enc + b_enc; f = top-k of ReLU(pre); x_hat = f @ W_dec + b_dec."""

    def __init__(self, d_in: int, d_sae: int, k: int):
        super().__init__()
        self.k = k
        w_dec = torch.randn(d_sae, d_in)
        w_dec /= w_dec.norm(dim=1, keepdim=True)
        self.W_dec = torch.nn.Parameter(w_dec)
        self.W_enc = torch.nn.Parameter(w_dec.T.clone().contiguous())
        self.b_enc = torch.nn.Parameter(torch.zeros(d_sae))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_in))

    def pre(self, x):
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    def topk(self, pre):
        values, index = pre.topk(self.k, dim=-1, sorted=False)
        return F.relu(values), index

    def decode_sparse(self, values, index):
        return (
            F.embedding_bag(index, self.W_dec, per_sample_weights=values, mode="sum") + self.b_dec
        )

    def forward(self, x):
        pre = self.pre(x)
        values, index = self.topk(pre)
        return self.decode_sparse(values, index), pre, values, index

    def dense_features(self, x):
        values, index = self.topk(self.pre(x))
        return torch.zeros(x.shape[0], self.W_enc.shape[1], dtype=x.dtype).scatter_(
            1, index, values
        )

    @torch.no_grad()
    def normalise_decoder(self):
        self.W_dec /= self.W_dec.norm(dim=1, keepdim=True)

    @torch.no_grad()
    def drop_parallel_grad(self):
        if self.W_dec.grad is not None:
            w = self.W_dec
            self.W_dec.grad -= (self.W_dec.grad * w).sum(1, keepdim=True) * w


def train_sae(work: Path, args) -> dict:
    path = work / "sae_train.pt"
    if path.is_file():
        return torch.load(path)
    torch.manual_seed(SEED)
    acts = torch.from_numpy(np.load(work / "acts_train.npy"))
    n, d_in = acts.shape
    # Outlier positions (massive activations other than position 0) would dominate the loss.
    norms = acts.norm(dim=1)
    median = norms.median()
    keep = norms < 8 * median
    dropped = int((~keep).sum())
    acts = acts[keep]
    n = acts.shape[0]
    # Train on x / scale (mean squared norm = d_in); the scale is folded back into b_enc, b_dec at
    # export.
    scale = float((acts.pow(2).sum(1).mean() / d_in).sqrt())
    x_all = acts / scale
    log.info(
        "training on %d vectors (dropped %d outliers over %.0f norm), scale %.3f",
        n,
        dropped,
        8 * median,
        scale,
    )

    sae = TopKSAE(d_in, args.d_sae, args.k)
    with torch.no_grad():
        sae.b_dec.copy_(x_all[torch.randperm(n)[:20000]].median(0).values)
    variance = float((x_all - x_all.mean(0)).pow(2).sum(1).mean())
    opt = torch.optim.Adam(sae.parameters(), lr=args.lr, betas=(0.9, 0.999))
    steps = args.epochs * n // args.batch
    warmup, decay_from = steps // 20, int(steps * 0.8)
    since_fired = torch.zeros(args.d_sae)
    k_aux = 256
    history = []
    t0 = time.time()
    gen = torch.Generator().manual_seed(SEED)
    step = 0
    for epoch in range(args.epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n - args.batch + 1, args.batch):
            lr = (
                args.lr
                * min(1.0, (step + 1) / warmup)
                * (1.0 if step < decay_from else (steps - step) / (steps - decay_from))
            )
            for group in opt.param_groups:
                group["lr"] = lr
            x = x_all[perm[start : start + args.batch]]
            recon, pre, values, index = sae(x)
            err = x - recon
            loss_main = err.pow(2).sum(1).mean() / variance
            fired = torch.zeros(args.d_sae, dtype=torch.bool)
            fired[index[values > 0]] = True
            since_fired += args.batch
            since_fired[fired] = 0
            dead = since_fired > args.dead_after
            loss = loss_main
            if bool(dead.any()):
                # AuxK (Gao et al. 2024): the dead latents' top k_aux try to explain the residual
                # error.
                masked = pre.masked_fill(~dead, float("-inf"))
                ka = min(k_aux, int(dead.sum()))
                av, ai = masked.topk(ka, dim=-1)
                aux = F.embedding_bag(ai, sae.W_dec, per_sample_weights=F.relu(av), mode="sum")
                e = err.detach()
                loss_aux = (e - aux).pow(2).sum(1).mean() / e.pow(2).sum(1).mean()
                loss = loss + args.aux_coef * torch.nan_to_num(loss_aux, 0.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            sae.drop_parallel_grad()
            opt.step()
            sae.normalise_decoder()
            if step % 50 == 0 or step == steps - 1:
                history.append(
                    {"step": step, "fvu": float(loss_main), "dead": int(dead.sum()), "lr": lr}
                )
                log.info(
                    "step %d/%d epoch %d fvu %.4f dead %d lr %.2e (%.0fs)",
                    step,
                    steps,
                    epoch,
                    float(loss_main),
                    int(dead.sum()),
                    lr,
                    time.time() - t0,
                )
            step += 1
    state = {k: v.detach().clone() for k, v in sae.state_dict().items()}
    result = {
        "state": state,
        "scale": scale,
        "history": history,
        "train_tokens": n,
        "dropped_outliers": dropped,
        "outlier_norm": float(8 * median),
        "seconds": time.time() - t0,
        "steps": step,
        "hparams": {
            "d_sae": args.d_sae,
            "k": args.k,
            "lr": args.lr,
            "batch": args.batch,
            "epochs": args.epochs,
            "dead_after_tokens": args.dead_after,
            "aux_k": k_aux,
            "aux_coef": args.aux_coef,
            "seed": SEED,
        },
    }
    torch.save(result, path)
    return result


def export(result: dict, layer: int, out: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    s = result["state"]
    scale = result["scale"]
    w_dec = s["W_dec"] / s["W_dec"].norm(dim=1, keepdim=True)
    # activations stay in training units; the scale goes into the decoder
    if spec.decoder_rows_scaled:
        weights = {"W_enc": s["W_enc"] / scale, "b_enc": s["b_enc"], "W_dec": w_dec * scale}
    else:  # activations in residual units; unit decoder rows
        weights = {"W_enc": s["W_enc"], "b_enc": s["b_enc"] * scale, "W_dec": w_dec}
    tensors = {name: tensor.contiguous().float() for name, tensor in weights.items()}
    tensors["b_dec"] = (s["b_dec"] * scale).contiguous().float()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "sae_weights.safetensors"))
    hp = result["hparams"]
    cfg = {
        "architecture": "topk",
        "d_in": int(w_dec.shape[1]),
        "d_sae": hp["d_sae"],
        "k": hp["k"],
        "activation_fn_str": "topk",
        "activation_fn_kwargs": {"k": hp["k"]},
        "model_name": spec.name,
        "model_from_pretrained_kwargs": {},
        "hook_name": f"blocks.{layer}.hook_resid_post",
        "hook_layer": layer,
        "hook_head_index": None,
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "decoder_rows_unit_norm": not spec.decoder_rows_scaled,
        "dtype": "float32",
        "device": "cpu",
        "context_size": CHUNK + 1,
        "prepend_bos": spec.doc_start_is_bos,
        "dataset_path": "offline mix, see README.md",
        "sae_lens_training_version": None,
        "seed": SEED,
    }
    (out / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return tensors


def sae_id(path: Path) -> str:
    return "sae_" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def load_exported(out: Path) -> TopKSAE:
    from safetensors.torch import load_file

    t = load_file(str(out / "sae_weights.safetensors"))
    cfg = json.loads((out / "cfg.json").read_text())
    sae = TopKSAE(cfg["d_in"], cfg["d_sae"], cfg["k"])
    sae.load_state_dict(t)
    sae.requires_grad_(False)
    return sae


# ----------------------------------------------------------------------------------------------
# Stage 4: held-out evaluation
# ----------------------------------------------------------------------------------------------


def evaluate(work: Path, corpus: dict, layer: int, out: Path, spec: ModelSpec) -> dict:
    sae = load_exported(out)
    acts = torch.from_numpy(np.load(work / "acts_heldout.npy"))
    norms = acts.norm(dim=1)
    keep = norms < 8 * norms.median()
    x = acts[keep]
    sq_err, l0, active = (
        torch.zeros(x.shape[1], dtype=torch.float64),
        0.0,
        torch.zeros(sae.W_dec.shape[0], dtype=torch.bool),
    )
    with torch.no_grad():
        for start in range(0, len(x), 8192):
            xb = x[start : start + 8192]
            recon, _, values, index = sae(xb)
            sq_err += (xb - recon).double().pow(2).sum(0)
            l0 += float((values > 0).sum())
            active[index[values > 0]] = True
    centred = x - x.mean(0)
    var = centred.double().pow(2).sum(0)  # per dimension
    # One dimension can carry much of the variance (Gemma 3: dimension 163, about half of it); the
    # FVU without it shows how well the rest is reconstructed.
    top = int(var.argmax())
    rest = torch.arange(x.shape[1]) != top
    metrics = {
        "heldout_tokens": len(x),
        "heldout_outliers_dropped": int((~keep).sum()),
        "fvu": float(sq_err.sum() / var.sum()),
        "mean_l0": l0 / len(x),
        "dead_features": int((~active).sum()),
        "d_sae": int(sae.W_dec.shape[0]),
        "mean_resid_norm": float(norms[keep].mean()),
        "mean_centred_norm": float(centred.norm(dim=1).mean()),
        "mean_vector_norm": float(x.mean(0).norm()),
        "top_variance_dim": top,
        "top_dim_variance_share": float(var[top] / var.sum()),
        "fvu_without_top_dim": float(sq_err[rest].sum() / var[rest].sum()),
    }

    # Next-token cross-entropy on held-out sequences: clean, SAE reconstruction spliced in at
    # every position but 0, and the layer's output zero-ablated at those positions (for scale).
    lm = load(spec, "float32", work)
    seqs = [s for s in corpus["sequences"] if s["heldout"]]
    # Rows per batch: 16, fewer when the logits [rows, T, V] would pass ~1.5 GB (Gemma's vocabulary
    # is 262k).
    longest = max(len(s["ids"]) for s in seqs)
    rows = max(1, min(16, int(1.5e9 // (longest * lm.model.config.vocab_size * 4))))
    seqs.sort(key=lambda s: len(s["ids"]))

    def splice(resid, mask):
        b, t, d = resid.shape
        flat = resid.reshape(-1, d).float()
        recon = sae(flat)[0].reshape(b, t, d).to(resid.dtype)
        first = (mask.cumsum(1) == 1)[..., None]  # each row's position 0 stays clean
        return torch.where(first | ~mask.bool()[..., None], resid, recon)

    def ablate(resid, mask):
        first = (mask.cumsum(1) == 1)[..., None]
        return torch.where(first, resid, torch.zeros_like(resid))

    totals = {"clean": [0.0, 0], "spliced": [0.0, 0], "zero_ablated": [0.0, 0]}
    by_source: dict[str, dict[str, list]] = {}
    t0 = time.time()
    with torch.inference_mode():
        for start in range(0, len(seqs), rows):
            batch = seqs[start : start + rows]
            ids = [s["ids"] for s in batch]
            for name, fn in (("clean", None), ("spliced", splice), ("zero_ablated", ablate)):
                _, logits, mask = forward(
                    lm, ids, layer=layer if fn else None, replace=fn, logits=True
                )
                targets, _ = left_pad(ids, lm.device)
                # predict token t+1 from positions >= 1 (position 0's prediction is left out, as its
                # residual is never spliced)
                lp = F.cross_entropy(
                    logits[:, 1:-1].reshape(-1, logits.shape[-1]),
                    targets[:, 2:].reshape(-1),
                    reduction="none",
                ).view(len(batch), -1)
                valid = (mask.cumsum(1) > 1)[:, 1:-1]  # real tokens after each row's position 0
                for r, s in enumerate(batch):
                    v = lp[r][valid[r]]
                    totals[name][0] += float(v.sum())
                    totals[name][1] += int(v.numel())
                    src = by_source.setdefault(s["source"], {}).setdefault(name, [0.0, 0])
                    src[0] += float(v.sum())
                    src[1] += int(v.numel())
    ce = {name: s / n for name, (s, n) in totals.items()}
    metrics.update(
        {
            "ce_clean": ce["clean"],
            "ce_spliced": ce["spliced"],
            "ce_zero_ablated": ce["zero_ablated"],
            "ce_increase": ce["spliced"] - ce["clean"],
            "ce_loss_recovered": (ce["zero_ablated"] - ce["spliced"])
            / (ce["zero_ablated"] - ce["clean"]),
            "ce_tokens": totals["clean"][1],
            "ce_by_source": {
                src: {n: v[0] / v[1] for n, v in d.items()} for src, d in by_source.items()
            },
        }
    )
    log.info(
        "eval: %s (%.0fs)",
        {k: v for k, v in metrics.items() if k != "ce_by_source"},
        time.time() - t0,
    )
    return metrics


# ----------------------------------------------------------------------------------------------
# Stage 5: labels and README
# ----------------------------------------------------------------------------------------------


def _show(piece: str) -> str:
    return piece.replace("\n", "\\n").replace("\t", "\\t")


def make_labels(work: Path, corpus: dict, out: Path, spec: ModelSpec, top_n: int = 200) -> dict:
    sae = load_exported(out)
    tok = load_tokenizer(spec, work)
    seqs = corpus["sequences"]
    d_sae = sae.W_dec.shape[0]
    best_v = torch.full((d_sae, top_n), -1.0)
    best_i = torch.zeros((d_sae, top_n), dtype=torch.long)
    counts = torch.zeros(d_sae)
    where_all, offset, n_tokens = [], 0, 0
    with torch.no_grad():
        for split in ("train", "heldout"):
            acts = torch.from_numpy(np.load(work / f"acts_{split}.npy"))
            where_all.append(np.load(work / f"where_{split}.npy"))
            norms = acts.norm(dim=1)
            ok = norms < 8 * norms.median()
            for start in range(0, len(acts), 8192):
                xb = acts[start : start + 8192]
                f = sae.dense_features(xb) * ok[start : start + 8192, None]
                counts += (f > 0).sum(0)
                v, i = f.T.topk(min(top_n, f.shape[0]), dim=1)
                cat_v = torch.cat([best_v, v], 1)
                cat_i = torch.cat([best_i, i + offset + start], 1)
                best_v, sel = cat_v.topk(top_n, dim=1)
                best_i = cat_i.gather(1, sel)
            offset += len(acts)
            n_tokens += int(ok.sum())
    where = np.concatenate(where_all)
    labels = {}
    for j in range(d_sae):
        if counts[j] == 0:
            continue
        labels[str(j)] = label_entry(
            tok, seqs, where, best_v[j], best_i[j], float(counts[j]) / n_tokens
        )
    (out / "feature_labels.json").write_text(
        json.dumps(labels, indent=1, ensure_ascii=False) + "\n"
    )
    log.info("labels: %d live features of %d", len(labels), d_sae)
    return labels


def label_entry(
    tok, seqs: list[dict], where, vals: torch.Tensor, idx: torch.Tensor, frequency: float
) -> dict:
    """One feature's auto label from its top examples (activations `vals` at rows `idx` of `where`,
    (sequence, position) pairs): its three top tokens by summed activation, with the corpus source
    most of them come from when it is 70% or more; its top tokens, best example and frequency."""
    live = vals > 0
    vals, idx = vals[live], idx[live]
    score: dict[str, float] = {}
    sources: dict[str, int] = {}
    for v, g in zip(vals.tolist(), idx.tolist()):
        s, p = where[g]
        token = _show(tok.decode([seqs[s]["ids"][p]]))
        score[token] = score.get(token, 0.0) + v
        sources[seqs[s]["source"]] = sources.get(seqs[s]["source"], 0) + 1
    top_tokens = [t for t, _ in sorted(score.items(), key=lambda kv: -kv[1])][:10]
    words = []
    for t in top_tokens:
        w = t.strip() or repr(t)
        if w.lower() not in [x.lower() for x in words]:
            words.append(w)
        if len(words) == 3:
            break
    label = " / ".join(words)
    main_source, hits = max(sources.items(), key=lambda kv: kv[1])
    if hits >= 0.7 * sum(sources.values()):
        kind = {"chat": "chat", "stdlib-code": "code"}.get(main_source, "docs")
        label += f" ({kind})"
    s, p = where[idx[0]]
    ids = seqs[s]["ids"]
    example = (
        tok.decode(ids[max(1, p - 16) : p])
        + "[["
        + tok.decode([ids[p]])
        + "]]"
        + tok.decode(ids[p + 1 : p + 6])
    )
    return {
        "label": label,
        "top_tokens": top_tokens,
        "example": example,
        "frequency": round(frequency, 6),
        "max_activation": round(float(vals[0]), 3),
    }


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


STAGE_NOTES = {
    FIRST_LOAD: " (once per work folder: assembling the GGUF file of a chunked package, "
    "converting it to a float32 copy)",
    "corpus": " (reading and tokenising the text, loading the model, any chat answers)",
}


def write_readme(
    work: Path,
    out: Path,
    spec: ModelSpec,
    corpus: dict,
    result: dict,
    metrics: dict,
    layer: int,
    labels: dict,
) -> None:
    m, hp, man = metrics, result["hparams"], corpus["manifest"]
    seqs = corpus["sequences"]
    tokens = {src: [0, 0] for src in man}
    for s in seqs:
        tokens[s["source"]][1 if s["heldout"] else 0] += len(s["ids"]) - 1
    total = sum(a + b for a, b in tokens.values())
    rows = "\n".join(
        f"| {src} | {a + b:,} | {100 * (a + b) / total:.0f}% | {a:,} | {b:,} |"
        for src, (a, b) in tokens.items()
    )
    weights = out / "sae_weights.safetensors"
    packages = ", ".join(
        sorted(
            (d.removeprefix("package:") for d, _ in man["package-readmes"]["files"]), key=str.lower
        )
    )
    sink_norm = _read_json(work / "acts_meta.json").get("position0_median_norm")
    sink = (
        f"a residual norm near {float(f'{sink_norm:.2g}'):,.0f}"
        if sink_norm
        else ("a huge residual norm")
    )
    openers = (
        f"`{spec.chat_start}` in chat, `{spec.doc_start}` before plain text"
        if spec.chat_answers
        else f"`{spec.doc_start}`"
    )
    chat = "chat" in man
    centred_note = fvu_rest_row = ""
    if "mean_centred_norm" in m:
        centred_note = (
            f"; the mean residual has norm {m['mean_vector_norm']:.0f}, and a token's "
            "distance from it (what varies from token to token) is about "
            f"{m['mean_centred_norm']:.0f}"
        )
        fvu_rest_row = (
            f"| ... leaving out dimension {m['top_variance_dim']} "
            f"({100 * m['top_dim_variance_share']:.0f}% of the variance) | "
            f"{m['fvu_without_top_dim']:.3f} |\n"
        )
    scale = result["scale"]
    if spec.decoder_rows_scaled:
        decoder_text = f"""- **Decoder rows have L2 norm {scale:.2f}** (unit norm during training, exactly renormalised, then
  multiplied by the training scale below at export), so a steering strength `s` moves the residual by
  `{scale:.0f} * s`, and feature activations are in the units the SAE was trained in. The residual
  norm at this layer is about {m["mean_resid_norm"]:.0f} on ordinary tokens{centred_note}: with unit rows, steering would
  need strengths in the hundreds or thousands, past millm's ±200 steering range.
- `normalize_activations: "none"`: the SAE reads raw activations. (Training ran on activations
  divided by a constant {scale:.4f}, the root mean square per dimension; at export that constant went
  into `W_dec` (times it), `W_enc` (divided by it) and `b_dec`, so nothing needs scaling at inference.)"""
    else:
        decoder_text = f"""- **Decoder rows have unit L2 norm** (kept so during training, exactly renormalised at export), so a
  steering strength is in residual-norm units: adding `s * W_dec[i]` moves the residual by `s`.
  The residual norm at this layer is about {m["mean_resid_norm"]:.0f} on ordinary tokens{centred_note}.
- `normalize_activations: "none"`: the SAE reads raw activations. (Training ran on activations
  divided by a constant {scale:.4f}, the root mean square per dimension; that constant is
  folded into `b_enc` and `b_dec` at export, so nothing needs scaling at inference.)"""
    chat_text = (
        f"""- **chat**: {man["chat"]["conversations"]} conversations in the model's own chat template (system prompt,
  user turn, assistant turn, `<|im_end|>` tokens included). The user turns are a fixed list in the
  script: {N_TOPIC_PROMPTS} topic x template pairs drawn with seed {SEED} (everyday topics: places,
  food, animals, nature, science, sport, arts, code, ...; one in twelve with a persona system prompt)
  and {len(EXTRA_PROMPTS)} hand-written prompts (greetings, translations, code, maths, styles). The
  answers were generated by the demo model itself through millm's decode loop in float32,
  temperature {CHAT_SAMPLING.temperature}, top_p {CHAT_SAMPLING.top_p}, presence penalty
  {CHAT_SAMPLING.presence_penalty}, at most {CHAT_MAX_TOKENS} tokens, seed {SEED} + conversation index.
"""
        if chat
        else ""
    )
    text = (
        f"""# {out.name}: {spec.title}

A TopK sparse autoencoder (SAE) on the residual stream of **{spec.name}**{spec.model_note} after block
**{layer}** of {spec.n_layers} (`resid_post`, `blocks.{layer}.hook_resid_post`; in millm: the output of
`model.model.layers[{layer}]`), trained by `scripts/train_demo_sae.py` on this repository's
development machine (2 CPU cores, no GPU) in {result["seconds"] / 60:.1f} minutes. SAELens layout:
`cfg.json`, `sae_weights.safetensors`, plus `feature_labels.json`.
Id as millm computes it: `{sae_id(weights)}` (sha256 of `sae_weights.safetensors`).

## Architecture

- d_in = {spec.d_in}, d_sae = {hp["d_sae"]}, k = {hp["k"]}, float32, {weights.stat().st_size / 1e6:.1f} MB.
- Encode: `pre = (x - b_dec) @ W_enc + b_enc` (`apply_b_dec_to_input: true`); keep the k largest
  of `ReLU(pre)`, zero elsewhere. Decode: `f @ W_dec + b_dec`.
{decoder_text}
- Position 0 of every sequence ({openers}) is an
  attention sink with {sink} at this layer; it was never trained on, and
  feature activations there mean nothing. Tokens with a norm above 8x the median ({result["dropped_outliers"]}
  of the training tokens) were dropped as well.

## Training data ({total:,} tokens, all found offline on the machine{" or written by the model" if chat else ""})

| source | tokens | share | train | held out |
| --- | ---: | ---: | ---: | ---: |
{rows}

{chat_text}- **stdlib-docstrings**: module, class and function docstrings of the CPython
  {sys.version.split()[0]} standard library (parsed with `ast`, tests and idlelib excluded).
- **stdlib-code**: one {CHUNK}-token window of source from each of {man["stdlib-code"]["documents_used"]} standard-library modules.
- **package-readmes**: the long descriptions (READMEs) in the `METADATA` of the packages installed in
  millm's virtualenv: {packages}.
- **usr-share-doc**: READMEs, `.txt`/`.md`/`.rst` and HTML manuals under Debian's `/usr/share/doc`
  ({man["usr-share-doc"]["documents_used"]} files; copyright files, changelogs and NEWS skipped).

Plain-text documents were tokenised whole, then up to a few random windows of {CHUNK} tokens were taken
from each (each window opened by `{spec.doc_start}`){"; chat conversations are whole sequences" if chat else ""}. Identical
documents were counted once. The held-out split is by document (sha256 of its id, {HELDOUT_PERCENT}%),
so no held-out text was seen in training. The exact file list is in `corpus_manifest.json`.

## Training

Plain torch, seed {SEED}: Adam (lr {hp["lr"]}, 5% warm-up, linear decay over the last 20%), batch
{hp["batch"]}, {hp["epochs"]} epochs over {result["train_tokens"]:,} activation vectors ({result["steps"]} steps);
loss = normalised MSE; AuxK loss for dead latents (Gao et al. 2024: the top {hp["aux_k"]} dead latents,
coefficient {hp["aux_coef"]}, dead = silent for {hp["dead_after_tokens"]:,} tokens); decoder
initialised as the encoder's transpose, its rows kept at unit norm with the gradient's radial part
removed; `b_dec` initialised at the activations' median.

## Quality on held-out tokens ({m["heldout_tokens"]:,} activation vectors, {m["ce_tokens"]:,} next-token predictions)

| figure | value |
| --- | ---: |
| fraction of variance unexplained (FVU) | {m["fvu"]:.3f} |
{fvu_rest_row}| mean L0 (active features per token) | {m["mean_l0"]:.1f} |
| dead features (never active on held-out) | {m["dead_features"]} of {m["d_sae"]} |
| next-token cross-entropy, clean | {m["ce_clean"]:.3f} |
| ... with the SAE reconstruction spliced in at layer {layer} | {m["ce_spliced"]:.3f} (+{m["ce_increase"]:.3f}) |
| ... with layer {layer}'s output zero-ablated | {m["ce_zero_ablated"]:.3f} |
| cross-entropy loss recovered | {100 * m["ce_loss_recovered"]:.1f}% |

Cross-entropy by source (clean -> spliced): """
        + ", ".join(
            f"{src} {v['clean']:.2f} -> {v['spliced']:.2f}" for src, v in m["ce_by_source"].items()
        )
        + f""".

## Feature labels

`feature_labels.json` holds every feature that fired at least once on the corpus ({len(labels)} of
{hp["d_sae"]}): `label` is **generated automatically** (the three tokens with the largest summed
activation among the feature's top 200 activations, plus {"`(chat)`, " if chat else ""}`(code)` or `(docs)` when 70% of those
come from one kind of text), `top_tokens` (up to 10), `example` (the context of its largest activation,
the token marked `[[like this]]`), `frequency` (fraction of corpus tokens on which it is active) and
`max_activation`. No label was written or checked by hand; read them as hints.

## Steering with it

{spec.steering_note.format(scale=result["scale"])}
"""
        + steer_section(work)
        + cost_section(work)
    )
    (out / "README.md").write_text(text)


def steer_section(work: Path) -> str:
    """The last steer stage's completions (--work/steer.json), if any."""
    steer = _read_json(work / "steer.json")
    if not steer:
        return ""

    def quote(text: str) -> str:
        return "> " + text.strip().replace("\n", "\n> ")

    lines = [
        "",
        f"Prompt `{steer['prompt']!r}`, greedy decoding, {steer['max_tokens']} tokens at "
        "most, through millm's own",
        f"decode loop in {steer['dtype']} (the vector added to block {steer['layer']}'s "
        "output at every position,",
        "as `millm serve` steers). Unsteered:",
        "",
        quote(steer["unsteered"]),
        "",
    ]
    for row in steer["steered"]:
        lines += [
            f'Feature {row["index"]} ("{row["label"]}") at strength {row["strength"]:g}:',
            "",
            quote(row["text"]),
            "",
        ]
    return "\n".join(lines)


def cost_section(work: Path) -> str:
    timings = _read_json(work / "timings.json")
    if not timings:
        return ""
    order = [FIRST_LOAD, "corpus", "acts", "train", "export", "eval", "labels", "steer", "profiles"]
    rows = "\n".join(
        f"| {stage}{STAGE_NOTES.get(stage, '')} | {sec:,.0f} s ({sec / 60:.1f} min) |"
        for stage, sec in sorted(
            timings.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99
        )
    )
    return f"""
## Cost

Wall time of each stage on the development machine (2 CPU cores, no GPU, shared with other work), as the
script measured it (`timings.json` in its work folder):

| stage | wall time |
| --- | ---: |
{rows}
| all | {sum(timings.values()) / 60:.1f} min |
"""


# ----------------------------------------------------------------------------------------------
# Stage 6: steering (steer: any model; profiles: the chat model's demo profiles)
# ----------------------------------------------------------------------------------------------


def steered_texts(
    lm,
    layer: int,
    w_dec: torch.Tensor,
    prompt_ids: list[int],
    feature_sets: list[list[dict]],
    max_tokens: int = 60,
) -> list[str]:
    """Greedy completions of one prompt, a row per feature set ([] = unsteered); a row adds
    sum(strength * W_dec[index]) to block `layer`'s output at every position, prompt and generated
    tokens alike (a ResidualEdit, as `millm serve` steers)."""
    edits = [
        ResidualEdit(((layer, sum(f["strength"] * w_dec[f["index"]] for f in feats)),))
        if feats
        else None
        for feats in feature_sets
    ]
    outs = generate_texts(
        lm,
        [prompt_ids] * len(feature_sets),
        SamplingParams(temperature=0.0),
        max_tokens,
        edits=edits,
    )
    return [text for text, _ in outs]


def steer(
    work: Path,
    out: Path,
    layer: int,
    spec: ModelSpec,
    features: list[int],
    strengths: list[float],
    prompt: str,
    dtype: str = "float32",
    max_tokens: int = 40,
) -> dict:
    """The prompt unsteered and steered by each feature at each strength -> --work/steer.json."""
    from safetensors.torch import load_file

    w_dec = load_file(str(out / "sae_weights.safetensors"))["W_dec"]
    labels = json.loads((out / "feature_labels.json").read_text())
    lm = load(spec, dtype, work)
    ids = spec.prompt_ids(lm.tokenizer, prompt)
    grid = [(i, s) for i in features for s in strengths]
    texts = steered_texts(
        lm, layer, w_dec, ids, [[]] + [[{"index": i, "strength": s}] for i, s in grid], max_tokens
    )
    result = {
        "prompt": prompt,
        "dtype": dtype,
        "layer": layer,
        "max_tokens": max_tokens,
        "unsteered": texts[0],
        "steered": [
            {
                "index": i,
                "label": labels.get(str(i), {}).get("label", "?"),
                "strength": s,
                "text": t,
            }
            for (i, s), t in zip(grid, texts[1:], strict=True)
        ],
    }
    log.info("unsteered: %r", texts[0])
    for row in result["steered"]:
        log.info("#%d %r x %g: %r", row["index"], row["label"], row["strength"], row["text"])
    (work / "steer.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return result


def check_profiles(work: Path, out: Path, layer: int, spec: ModelSpec) -> None:
    """Stamp the demo profiles with the new SAE's id; their operating points and README are
    bench/demo_profiles.py's (measured with the server's own steering evaluation per numeric
    mode)."""
    if not spec.chat_answers:
        raise SystemExit(
            f"the demo profiles are chat prompts for {DEMO_MODEL_NAME}; {spec.name} "
            "has no chat template"
        )
    ident = sae_id(out / "sae_weights.safetensors")
    for path in sorted(PROFILES_DIR.glob("*.json")):
        prof = json.loads(path.read_text())
        for s in prof["steering"]:
            s["sae_id"] = ident
        path.write_text(json.dumps(prof, indent=2) + "\n")
    log.info(
        "profiles stamped with %s: choose their strengths and write their README with "
        "bench/demo_profiles.py (a new SAE's features are not the old one's)",
        ident,
    )


# ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEMO_MODEL_NAME, choices=sorted(MODELS))
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/sae-work"),
        help="scratch directory (caches), one per model",
    )
    parser.add_argument("--out", type=Path, help="default: the model's folder under millm/demo/sae")
    parser.add_argument("--layer", type=int, help="default: 12")
    parser.add_argument("--d-sae", type=int, default=2048)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--dead-after", type=int, default=200_000)
    parser.add_argument("--aux-coef", type=float, default=1 / 32)
    parser.add_argument("--stages", default="corpus,acts,train,export,eval,labels")
    parser.add_argument(
        "--steer-features", default="", help="steer stage: feature indices, comma-separated"
    )
    parser.add_argument(
        "--steer-strengths", default="", help="steer stage: strengths, comma-separated"
    )
    parser.add_argument("--steer-prompt", help="steer stage: default the model's steering prompt")
    parser.add_argument(
        "--steer-dtype", default="float32", help="steer stage: float32 or auto (as served)"
    )
    args = parser.parse_args()
    spec = MODELS[args.model]
    out = args.out or spec.out_dir
    layer = spec.layer if args.layer is None else args.layer
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("millm").setLevel(logging.WARNING)
    torch.manual_seed(SEED)
    random.seed(SEED)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    with timed(work, "corpus", work / "corpus.json"):
        corpus = build_corpus(work, spec)
    if "acts" in stages:
        with timed(work, "acts", work / "acts_train.npy"):
            capture(work, corpus, layer, spec)
    if "train" in stages or "export" in stages:
        with timed(work, "train", work / "sae_train.pt"):
            result = train_sae(work, args)
        with timed(work, "export"):
            export(result, layer, out, spec)
            (out / "corpus_manifest.json").write_text(
                json.dumps(corpus["manifest"], indent=1) + "\n"
            )
    if "eval" in stages:
        with timed(work, "eval"):
            metrics = evaluate(work, corpus, layer, out, spec)
            (work / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if "labels" in stages:
        with timed(work, "labels"):
            make_labels(work, corpus, out, spec)
    if "steer" in stages:
        with timed(work, "steer"):
            steer(
                work,
                out,
                layer,
                spec,
                [int(i) for i in args.steer_features.split(",") if i],
                [float(x) for x in args.steer_strengths.split(",") if x],
                args.steer_prompt or spec.steer_prompt,
                args.steer_dtype,
            )
    if "labels" in stages or "steer" in stages:
        labels = json.loads((out / "feature_labels.json").read_text())
        result = torch.load(work / "sae_train.pt")
        metrics = json.loads((work / "metrics.json").read_text())
        write_readme(work, out, spec, corpus, result, metrics, layer, labels)
    if "profiles" in stages:
        check_profiles(work, out, layer, spec)


if __name__ == "__main__":
    main()
