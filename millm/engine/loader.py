"""Loading a causal LM and its tokenizer onto a device, and what the server reports about it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from millm.engine.constraints import GrammarSupport
from millm.engine.gguf_head import head_locations
from millm.engine.gguf_meta import readers_shared
from millm.engine.prompts import template_variables
from millm.engine.residual import Editor, ResidualEditor
from millm.engine.runners import Runner, make_runner, mlp_norms
from millm.engine.sources import ModelSource, file_quantization
from millm.errors import ModelSourceError, describe

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STORED_DTYPE_TAGS = {"float32": "FP32", "bfloat16": "BF16", "float16": "FP16"}
GGUF_META = "millm-gguf.json"
DEQUANTISED = "gguf"  # the folder of the cache root holding dequantised copies of GGUF files
# A dequantised copy takes 4 bytes a parameter (0.5 GB for the 135M demo, 28 GB for a 7B model)
# and the server runs one model at a time, so the cache keeps the copies of the two models used
# last (switching between two .gguf models converts neither again) and deletes the rest, least
# recently used first. A count, not bytes: the copy in use is kept whatever its size.
GGUF_CACHE_ENTRIES = 2
GGUF_CACHE_KEY = re.compile(r"[0-9a-f]{20}")  # only directories this cache wrote are ever deleted
UNRECORDED = "unrecorded"


@dataclass
class LoadedModel:
    """A model ready to run, with the facts the API reports about it."""

    name: str
    source: ModelSource
    model: PreTrainedModel | None  # None on llama.cpp, which holds the weights itself
    config: PretrainedConfig  # the architecture (hidden size, layers), whichever engine runs it
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    context_length: int
    eos_token_ids: frozenset[int]
    revision: str | None
    quantization: str | None
    runner: Runner  # how forward passes run (see runners.py)
    residual: (
        Editor  # per-row residual edits and reads: ResidualEditor, or GraphEditor on llama.cpp
    )
    # constrained decoding (structured output); its tokenizer is built on first use
    grammar: GrammarSupport
    vocab_size: int  # rows of the output layer: every id the model can score or emit
    engine: str = "transformers"
    parameters: int = 0  # weights of the checkpoint as loaded (before any kernel repacking)

    @property
    def dtype_name(self) -> str:
        """The compute dtype as users write it (float32, bfloat16, float16)."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def system_fingerprint(self) -> str:
        """millm:<model>@<revision>:<dtype>/<quantization>:<engine>, unknown parts `unrecorded`."""
        revision = self.revision or UNRECORDED
        quantization = self.quantization or UNRECORDED
        return f"millm:{self.name}@{revision}:{self.dtype_name}/{quantization}:{self.engine}"

    @property
    def template_variables(self) -> frozenset[str] | None:
        """The extra variables its chat template reads (chat_template_kwargs), or None where the
        engine takes none: on llama.cpp (the spec's GGUF rule), chat_template_kwargs is reported
        ignored."""
        return template_variables(self.tokenizer) if self.engine == "transformers" else None

    @property
    def differentiable(self) -> bool:
        """Whether the weights are torch tensors autograd can differentiate (attribution graphs);
        llama.cpp keeps its own."""
        return self.engine == "transformers"

    @property
    def restores_exactly(self) -> bool:
        """Whether a prefix restored from the cache gives the very tokens of a recomputed one:
        float32 on transformers; in bf16, and in llama.cpp's kernels, rounding depends on the
        batch's shape."""
        return self.engine == "transformers" and self.dtype == torch.float32


def pick_device(name: str) -> torch.device:
    """auto = CUDA when present, else CPU; an explicit CUDA device must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ModelSourceError(
            f"device {name!r} is not a torch device (use auto, cpu, cuda or cuda:N)"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelSourceError(f"device {name!r} was asked for but CUDA is not available here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelSourceError(
                f"device {name!r} does not exist ({torch.cuda.device_count()} CUDA devices)"
            )
    elif device.type != "cpu":
        raise ModelSourceError(f"device {name!r} is not supported (use auto, cpu, cuda or cuda:N)")
    return device


def cuda_bf16(device: torch.device) -> bool:
    """Whether the CUDA card `device` names computes bfloat16 natively (compute capability 8.0 on:
    Ampere and later). torch.cuda.is_bf16_supported() asks about the current card, not the one
    --device names, and counts emulation, which is slower than float16 on a T4 or V100."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8


def pick_dtype(name: str, device: torch.device, q4_weights: bool = False) -> torch.dtype:
    """Refuse what the device lacks; auto = bfloat16 on CUDA cards that compute it natively, and on
    the CPU bfloat16 for Q4_1 GGUF files (their int4 kernel needs it), else float32."""
    if name == "auto":
        if cuda_bf16(device):
            return torch.bfloat16
        return torch.bfloat16 if (q4_weights and device.type == "cpu") else torch.float32
    dtype = DTYPES[name]
    if device.type == "cuda" and dtype == torch.bfloat16 and not cuda_bf16(device):
        raise ModelSourceError(f"dtype bfloat16 is not supported on {device}")
    try:
        a = torch.ones(4, 4, dtype=dtype, device=device)
        torch.nn.functional.linear(a, a)
    except RuntimeError as exc:
        raise ModelSourceError(f"dtype {name} is not supported on {device}: {exc}") from None
    return dtype


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_cache_key(gguf_path: Path) -> str:
    """The cache entry's name: the file's real path (links resolved: the same file reached another
    way is the same entry), size and modification time (a changed file is converted again)."""
    stat = gguf_path.stat()
    return hashlib.sha256(
        f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    ).hexdigest()[:20]


def _last_used(entry: Path) -> int:
    try:
        return (entry / GGUF_META).stat().st_mtime_ns  # stamped by every use (see gguf_checkpoint)
    except OSError:
        return -1


def evict_gguf_copies(cache_root: Path, keep: int, current: Path) -> list[Path]:
    """Delete all but the `keep` most recently used copies, never `current`; returns what was
    deleted.

    Only finished copies are candidates: a conversion in progress (a hidden .partial directory)
    and anything this cache did not write are left alone.
    """
    others = [
        entry
        for entry in cache_root.iterdir()
        if entry != current
        and GGUF_CACHE_KEY.fullmatch(entry.name)
        and (entry / GGUF_META).is_file()
    ]
    others.sort(key=_last_used, reverse=True)
    stale = others[max(keep - 1, 0) :]
    for entry in stale:
        log.info("deleting the cached copy %s (least recently used; %d kept)", entry, keep)
        shutil.rmtree(entry, ignore_errors=True)
    return stale


def gguf_facts(path: Path) -> dict:
    """What is kept about a GGUF file beside its converted metadata: where it was, its hash, its
    quantization, and where its final norm and head lie (the logit lens on llama.cpp reads them)."""
    return {
        "source": str(path),
        "sha256": file_sha256(path),
        "file_type": file_quantization(path),
        "head": head_locations(path),
    }


def gguf_checkpoint(
    source: ModelSource, cache_root: Path, keep: int = GGUF_CACHE_ENTRIES
) -> tuple[Path, dict]:
    """A dequantised safetensors copy of a .gguf file, converted once and kept under the data dir
    while it is among the `keep` copies used last."""
    gguf_path = source.gguf_path
    target = cache_root / gguf_cache_key(gguf_path)
    meta_path = target / GGUF_META
    if not meta_path.is_file():
        _convert(source, gguf_path, cache_root, target)
    now = time.time_ns()
    os.utime(meta_path, ns=(now, now))  # this use makes it the most recent
    evict_gguf_copies(cache_root, keep, current=target)
    return target, json.loads(meta_path.read_text())


def _convert(source: ModelSource, gguf_path: Path, cache_root: Path, target: Path) -> None:
    """Write the dequantised copy of `source` (its file `gguf_path`) at `target`, through a
    staging directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a dequantised checkpoint (once; cached in %s)", gguf_path, target)
    staging = cache_root / f".{target.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with readers_shared():  # the config, the weights and the tokenizer read one parsed header
            model = AutoModelForCausalLM.from_pretrained(
                str(source.directory), gguf_file=source.gguf_file, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(
                str(source.directory), gguf_file=source.gguf_file
            )
        # The copy holds plain float weights; keeping the GGUF quantizer config would make
        # transformers look for the .gguf file again.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's __setattr__ is typed for tensors and modules only
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        meta = gguf_facts(gguf_path)
        (staging / GGUF_META).write_text(json.dumps(meta, indent=2))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def stored_quantization(config) -> str | None:
    """How the checkpoint's weights are stored: a quantization method, else its float dtype."""
    quant = getattr(config, "quantization_config", None)
    if quant:
        quant = quant if isinstance(quant, dict) else quant.to_dict()
        method = str(quant.get("quant_method", "")).upper() or None
        bits = quant.get("bits") or (
            4 if quant.get("load_in_4bit") else 8 if quant.get("load_in_8bit") else None
        )
        return f"{method}-{bits}bit" if method and bits else method
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if stored is None:
        return None
    return STORED_DTYPE_TAGS.get(str(stored).removeprefix("torch."))


def context_window(config, max_model_len: int | None) -> int:
    """The model's context window, optionally lowered by --max-model-len."""
    attrs = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    native = next((getattr(config, a) for a in attrs if getattr(config, a, None)), None)
    if max_model_len is None:
        if native is None:
            raise ModelSourceError(
                "the model's config names no context window; pass --max-model-len"
            )
        return int(native)
    if native is not None and max_model_len > native:
        raise ModelSourceError(
            f"--max-model-len {max_model_len} is larger than the model's context window ({native} "
            "tokens)"
        )
    return max_model_len


def eos_token_ids(config, generation_config, tokenizer) -> frozenset[int]:
    """Every id that ends a generation: the generation config's, the config's and the
    tokenizer's."""
    ids: set[int] = set()
    for value in (
        getattr(generation_config, "eos_token_id", None),
        getattr(config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def load_model(
    source: ModelSource,
    *,
    dtype: str,
    device: str,
    cache_root: Path,
    max_model_len: int | None = None,
    served_name: str | None = None,
    reproducible: bool = False,
) -> LoadedModel:
    """Load weights and tokenizer for transformers, place them on the device and describe the
    result (loader_llamacpp.load_with_llamacpp is the llama.cpp engine's counterpart). With
    `reproducible`, every linear runs on the plain float32 kernel (engine/numerics.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_device = pick_device(device)
    revision = source.revision
    try:
        if source.gguf_file:
            directory, meta = gguf_checkpoint(source, cache_root / DEQUANTISED)
            revision = meta["sha256"][:8]
            quantization = meta.get("file_type")
        else:
            directory = source.directory
            quantization = stored_quantization(AutoConfig.from_pretrained(str(directory)))
        q4_weights = quantization == "Q4_1"
        torch_dtype = pick_dtype(dtype, torch_device, q4_weights)
        # On the CPU the kernels are built from float32 weights (exact int4 codes, a float32 head).
        load_dtype = torch.float32 if torch_device.type == "cpu" else torch_dtype
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=load_dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except ModelSourceError:
        raise
    except Exception as exc:
        raise ModelSourceError(
            f"could not load model {source.reference!r}: {describe(exc)}"
        ) from exc
    model.to(torch_device)  # type: ignore[arg-type]  # transformers wraps to() with functools.wraps(Module.to), whose stub loses the bound self
    model.eval()
    model.requires_grad_(False)
    # counted before the runner repacks them
    parameters = sum(p.numel() for p in model.parameters())
    with torch.inference_mode():
        runner = make_runner(
            model, torch_device, torch_dtype, q4_weights, fixed_kernels=reproducible
        )
    log.info(
        "model runs on %s (%s): %s runner, kernels: %s",
        torch_device,
        torch_dtype,
        runner.name,
        runner.kernels,
    )
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    return LoadedModel(
        name=served_name or source.name,
        source=source,
        model=model,
        config=model.config,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        context_length=context_window(model.config, max_model_len),
        eos_token_ids=eos_token_ids(
            model.config, getattr(model, "generation_config", None), tokenizer
        ),
        revision=revision,
        quantization=quantization,
        runner=runner,
        residual=ResidualEditor(model, torch_dtype, torch_device, mlp_norms(runner)),
        grammar=GrammarSupport(tokenizer, vocab_size),
        vocab_size=vocab_size,
        parameters=parameters,
    )
