"""Loading a .gguf file onto llama.cpp: the weights stay quantised, millm keeps its tokenizer and
loop.

The tokenizer and the architecture's description come from the file's metadata through
transformers (the same conversion the dequantising path uses, so token ids, the chat template
and the special tokens are the ones the transformers engine would see); the weights are read by
llama.cpp alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from millm.engine.constraints import GrammarSupport
from millm.engine.families import final_softcap
from millm.engine.gguf_head import GGUFHead, head_locations
from millm.engine.gguf_meta import readers_shared
from millm.engine.loader import (
    DEQUANTISED,
    GGUF_META,
    LoadedModel,
    context_window,
    eos_token_ids,
    evict_gguf_copies,
    gguf_cache_key,
    gguf_facts,
)
from millm.engine.runner_llamacpp import LlamaCppRunner
from millm.engine.sources import ModelSource
from millm.errors import MillmError, ModelSourceError, describe

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Metadata entries are small (a tokenizer and a config), so more are kept than dequantised copies.
GGUF_META_ENTRIES = 8


def file_metadata(
    source: ModelSource, cache: Path, dequantised: Path | None = None, keep: int = GGUF_META_ENTRIES
) -> tuple[PretrainedConfig, PreTrainedTokenizerBase, dict]:
    """The file's architecture, tokenizer and facts (hash, file type), read once and kept under
    `cache` (reading a large vocabulary from GGUF metadata takes seconds; a changed file is read
    again), from the transformers engine's dequantised copies under `dequantised` when one is there;
    the entries of the `keep` files used last are kept."""
    from transformers import AutoConfig, AutoTokenizer

    key = gguf_cache_key(source.gguf_path)
    entry = cache / key
    facts = entry / GGUF_META
    if not facts.is_file():
        staging = cache / f".{entry.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        # The transformers engine's dequantised copy of this very file holds the same config and
        # tokenizer, already converted: reading them there takes a second instead of ~20.
        copy = dequantised / key if dequantised is not None else None
        if copy is not None and (copy / GGUF_META).is_file():
            AutoConfig.from_pretrained(str(copy)).save_pretrained(str(staging))
            AutoTokenizer.from_pretrained(str(copy)).save_pretrained(str(staging))
            meta = json.loads((copy / GGUF_META).read_text())
        else:
            with readers_shared():  # the config and the tokenizer read one parsed header
                AutoConfig.from_pretrained(
                    str(source.directory), gguf_file=source.gguf_file
                ).save_pretrained(str(staging))
                AutoTokenizer.from_pretrained(
                    str(source.directory), gguf_file=source.gguf_file
                ).save_pretrained(str(staging))
            meta = gguf_facts(source.gguf_path)
        (staging / facts.name).write_text(json.dumps(meta, indent=2))
        shutil.rmtree(entry, ignore_errors=True)
        staging.rename(entry)
    known = json.loads(facts.read_text())
    if "head" not in known:  # an entry written before the lens ran on llama.cpp
        known["head"] = head_locations(source.gguf_path)
        staged = facts.with_suffix(".partial")
        staged.write_text(json.dumps(known, indent=2))
        staged.replace(facts)
    now = time.time_ns()
    os.utime(facts, ns=(now, now))  # this use makes it the most recent
    evict_gguf_copies(cache, keep, current=entry)
    return (
        AutoConfig.from_pretrained(str(entry)),
        AutoTokenizer.from_pretrained(str(entry)),
        json.loads(facts.read_text()),
    )


def norm_eps(config: PretrainedConfig) -> float:
    """The epsilon of the model's norms, under whichever name its family gives it."""
    for name in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"):
        value = getattr(config, name, None)
        if value is not None:
            return float(value)
    return 1e-5


def load_with_llamacpp(
    source: ModelSource,
    *,
    dtype: str,
    cache_root: Path,
    sequences: int,
    max_model_len: int | None = None,
    served_name: str | None = None,
) -> LoadedModel:
    """A LoadedModel whose forward passes run on llama.cpp over the .gguf file itself."""
    if not source.gguf_file:
        raise ModelSourceError(
            f"--engine llama.cpp runs .gguf files, and {source.reference!r} is not one; use "
            "--engine transformers or auto"
        )
    if dtype not in ("auto", "float32"):
        raise ModelSourceError(
            f"--dtype {dtype} does not apply to llama.cpp, which computes in the file's own "
            "types; use auto, or float32 (keys and values kept in float32)"
        )
    path = source.gguf_path
    try:
        config, tokenizer, meta = file_metadata(
            source, cache_root / "gguf-meta", cache_root / DEQUANTISED
        )
    except Exception as exc:
        raise ModelSourceError(f"could not read the metadata of {path}: {describe(exc)}") from exc
    context = context_window(config, max_model_len)
    threads = torch.get_num_threads()
    try:
        runner = LlamaCppRunner(
            path,
            context=context,
            sequences=sequences,
            threads=threads,
            file_type=meta["file_type"],
            model_type=str(config.model_type),
            hooks_cache=cache_root / "graph-hooks",
            exact_kv=dtype == "float32",
            lens_head=GGUFHead(path, norm_eps(config), final_softcap(config), meta.get("head")),
        )
    except (ModelSourceError, MillmError):
        raise
    except Exception as exc:
        raise ModelSourceError(f"llama.cpp could not load {path}: {describe(exc)}") from exc
    log.info("model runs on llama.cpp: %s", runner.kernels)
    return LoadedModel(
        name=served_name or source.name,
        source=source,
        model=None,
        config=config,
        tokenizer=tokenizer,
        device=runner.device,
        # what the runner hands back (logits, hidden states); the weights keep the file's types
        dtype=torch.float32,
        context_length=context,
        eos_token_ids=eos_token_ids(config, None, tokenizer),
        revision=meta["sha256"][:8],
        quantization=meta["file_type"],
        runner=runner,
        residual=runner.editor,
        # transformers' reading of a GPT-2-style GGUF vocabulary may add a token the file lacks
        # (<|endoftext|>); the grammar must know every id the tokenizer has, the mask is cut to the
        # logits.
        grammar=GrammarSupport(tokenizer, max(runner.vocab_size, len(tokenizer))),
        vocab_size=runner.vocab_size,
        engine="llama.cpp",
        parameters=int(runner.lib.llama_model_n_params(runner.model)),
    )
