"""The llama.cpp runner: a GGUF file executed by llama.cpp, millm's own decode loop on top.

The weights stay quantised in llama.cpp's memory; millm keeps everything above the forward pass
(sampling, penalties, seeds, stop strings, grammars, cancellation, continuous batching), because
this runner answers the same prefill / step / select_rows / merge as the transformers runners,
with next-token logits as float32 tensors. Rows are llama.cpp sequences in one context whose KV
cells are shared by all of them (`kv_unified`): a row joining is a new sequence, a row leaving
is `llama_memory_seq_rm`, n choices of one prompt are `llama_memory_seq_cp` of its prefill, and
merging two batches is just listing their sequences together (no padding, no copies).

Steering and reading happen inside llama.cpp's graph (graph_editor.py, through the evaluation
callback of graph_callback.py): every row of a step, whatever its plan, goes into one decode.
Everything runs on the scheduler thread, the only thread that touches the context.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from millm.engine.batch import PrefillColumns, common_skip
from millm.engine.gguf_head import GGUFHead
from millm.engine.graph_callback import GraphHooks, ggml_library
from millm.engine.graph_editor import GraphEditor
from millm.engine.llamacpp_sequences import CellCopies, CppBatch, SavedCells, Sequences
from millm.errors import InsufficientMemory, ModelSourceError

# Tokens per llama_decode micro-batch; llama.cpp's output buffer holds this many rows of logits.
MICRO_BATCH = 512
log = logging.getLogger(__name__)
GGML_F32 = 0  # ggml_type


def bindings():
    """llama-cpp-python's low-level module, or a clear error saying how to install it."""
    try:
        import llama_cpp
        import llama_cpp._logger  # routes llama.cpp's own log through a level we set
    except ImportError:
        raise ModelSourceError(
            "--engine llama.cpp needs llama-cpp-python, which is not installed: run "
            './scripts/setup.sh, or CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" pip '
            "install 'millm[gguf]'"
        ) from None
    # llama.cpp's load chatter otherwise goes to stderr
    logging.getLogger("llama-cpp-python").setLevel(logging.WARNING)
    return llama_cpp


@dataclass
class CppPrefill(PrefillColumns):
    """Joining rows being prefilled on llama.cpp, a chunk of columns at a time: their batch and
    prompts (the columns are the left-padded layout's, as on the lean runner; llama.cpp itself
    never pads)."""

    batch: CppBatch
    prompts: list[list[int]]


class LlamaCppRunner:
    """Prefill / step / select / merge over a llama.cpp context (CPU, or the GPU llama.cpp was
    built for)."""

    name = "llama.cpp"
    mergeable = True
    chunked = True  # prefills in chunks, from restored KV cells (begin / advance / row_kv)

    def __init__(
        self,
        path: Path,
        *,
        context: int,
        sequences: int,
        threads: int,
        file_type: str | None,
        model_type: str,
        hooks_cache: Path,
        exact_kv: bool = False,
        lens_head: GGUFHead | None = None,
    ):
        lib = self.lib = bindings()
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        # Every layer on the main GPU (device 0) when this build of llama.cpp has one.
        self.on_gpu = bool(lib.llama_supports_gpu_offload())
        model_params.n_gpu_layers = -1 if self.on_gpu else 0
        self.model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if not self.model:
            raise ModelSourceError(
                f"llama.cpp could not load {path} (see the server log for llama.cpp's reason)"
            )
        params = lib.llama_context_default_params()
        params.n_ctx = context
        params.n_batch = params.n_ubatch = min(MICRO_BATCH, context)
        params.n_seq_max = sequences + 1  # the last: the prefix cache's scratch sequence
        params.kv_unified = (
            True  # one pool of KV cells for every row: a row can use the whole window
        )
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.editor = GraphEditor(
            int(lib.llama_model_n_layer(self.model)),
            int(lib.llama_model_n_embd(self.model)),
            model_type,
        )
        self.hooks = GraphHooks(ggml_library(), self.editor.at_node, hooks_cache)
        params.cb_eval = ctypes.cast(self.hooks.callback, type(params.cb_eval))
        params.cb_eval_user_data = self.hooks.user_data
        # float32 asked for: keys and values kept in float32 too (llama.cpp's default is float16)
        if exact_kv:
            params.type_k = params.type_v = GGML_F32
            params.flash_attn_type = 0  # disabled: its CPU kernel rounds queries to float16
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            lib.llama_model_free(self.model)
            raise InsufficientMemory(
                f"llama.cpp could not create a context of {context} positions for {path}"
            )
        vocab = lib.llama_model_get_vocab(self.model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        self.width = int(lib.llama_model_n_embd(self.model))
        self.layers = int(lib.llama_model_n_layer(self.model))
        self.context = int(lib.llama_n_ctx(self.ctx))
        self.chunk = int(lib.llama_n_batch(self.ctx))
        self.sequences = Sequences(lib, lib.llama_get_memory(self.ctx), sequences)
        # Sliding-window layers keep only their window's cells, so a cached prefix would lose
        # them: such a model recomputes every prompt.
        sliding = int(lib.llama_model_n_swa(self.model)) > 0
        self.prefix_storage: CellCopies | None = (
            None if sliding else CellCopies(lib, self.ctx, self.sequences.memory, scratch=sequences)
        )
        self.prefix_unavailable = (
            "llama.cpp keeps only a sliding window of this model's keys and values"
            if sliding
            else None
        )
        self.editor.bind(self.hooks)
        self._batch = lib.llama_batch_init(self.chunk, 0, 1)
        self.decodes = 0  # llama_decode calls so far (one per pass of up to `chunk` tokens)
        asking = "compiled" if self.hooks.compiled else "Python"
        self.kernels = (
            f"ggml ({file_type or 'unrecorded'}, {threads} threads; graph hooks {asking})"
        )
        self.device = torch.device("cpu")
        self.lens_head = lens_head  # the file's final norm and head, for the logit lens

    def close(self) -> None:
        """Free the context and the weights (the runner is unusable afterwards)."""
        if self.ctx:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self.ctx)
            self.lib.llama_model_free(self.model)
            self.ctx = self.model = None

    def __del__(self):
        if (
            not sys.is_finalizing()
        ):  # at exit llama_cpp's functions may already be gone; the OS frees all
            self.close()

    # one decode ----------------------------------------------------------------------------
    def _decode(
        self,
        entries: list[tuple[int, int, int, bool, int, int]],
        outputs: np.ndarray,
        slots: list[int],
    ) -> None:
        """Decode (seq, pos, token, wants_logits, row, column) entries in chunks; the logits of
        the k-th entry that wants them go to `outputs[slots[k]]`. The graph editor is told each
        chunk's rows and columns; a pass that touches the last block asks every token's logits
        (llama.cpp computes that block for output rows only) and keeps the wanted ones."""
        lib, batch, editor = self.lib, self._batch, self.editor
        done = 0
        every = editor.active and editor.every_output
        for start in range(0, len(entries), self.chunk):
            part = entries[start : start + self.chunk]
            for i, (seq, pos, token, wants, _, _) in enumerate(part):
                batch.token[i] = token
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = wants or every
            batch.n_tokens = len(part)
            if editor.active:
                editor.chunk(
                    np.fromiter((entry[4] for entry in part), np.int64, len(part)),
                    np.fromiter((entry[5] for entry in part), np.int64, len(part)),
                )
            status = lib.llama_decode(self.ctx, batch)
            self.decodes += 1
            failure = self.hooks.take_failure()
            if failure is not None:
                raise failure
            if editor.active:
                editor.decoded()
            if status == 1:
                raise InsufficientMemory(
                    f"llama.cpp's KV cache ({self.context} positions shared by every row) is "
                    "full: fewer concurrent rows, shorter prompts or max_tokens, or a larger "
                    "--max-model-len"
                )
            if status != 0:
                raise RuntimeError(f"llama_decode failed with status {status}")
            wanted = [i for i, entry in enumerate(part) if entry[3]]
            if wanted:
                given = len(part) if every else len(wanted)
                logits = np.ctypeslib.as_array(
                    lib.llama_get_logits(self.ctx), shape=(given * self.vocab_size,)
                ).reshape(given, self.vocab_size)
                outputs[slots[done : done + len(wanted)]] = logits[wanted] if every else logits
                done += len(wanted)

    def _run(self, batch: CppBatch, tokens: list[list[int]], last_only: bool = True) -> np.ndarray:
        """Feed each row its tokens, every row in one pass; logits of each row's last token
        `[B, V]`, or with last_only=False of every token, rows back to back."""
        counts = [len(t) if not last_only else 1 for t in tokens]
        offsets = np.cumsum([0, *counts])
        outputs = np.empty((int(offsets[-1]), self.vocab_size), dtype=np.float32)
        entries, slots = [], []
        for row, row_tokens in enumerate(tokens):
            seq, fed = batch.seqs[row], batch.fed[row]
            for j, token in enumerate(row_tokens):
                wants = not last_only or j == len(row_tokens) - 1
                entries.append((seq, fed + j, token, wants, row, j))
                if wants:
                    slots.append(int(offsets[row]) + (j if not last_only else 0))
            batch.fed[row] += len(row_tokens)
        self.editor.begin_pass([len(t) for t in tokens])
        self._decode(entries, outputs, slots)
        self.editor.end_pass()
        return outputs

    # the runner interface ------------------------------------------------------------------
    def prefill(self, prompts: list[list[int]], capacity: int) -> tuple[CppBatch, torch.Tensor]:
        """Run the prompts as new sequences; returns the batch and next-token logits `[B, V]`."""
        prefill = self.begin(prompts, capacity)
        logits = self.advance(prefill, None)
        assert logits is not None  # one pass covers every column
        return prefill.batch, logits

    def begin(
        self,
        prompts: list[list[int]],
        capacity: int,
        restored: list[list[SavedCells] | None] | None = None,
    ) -> CppPrefill:
        """A prefill of the prompts as new sequences, nothing computed yet; row i may bring
        copies of its first positions' cells (`restored[i]`, put into its sequence now), and
        keeps as many as every row can skip together (the lean runner's rule)."""
        rows = len(prompts)
        batch = CppBatch([], [0] * rows)
        batch.seqs = self.sequences.take(batch, rows)
        store = self.prefix_storage
        offered = [0] * rows
        for row, chain in enumerate(restored or []):
            if chain and store is not None:
                offered[row] = store.restore(chain, batch.seqs[row])
        lengths = [len(p) for p in prompts]
        done, reused = common_skip(lengths, offered)
        for row, seq in enumerate(batch.seqs):
            if offered[row] > reused[row]:  # restored past what every row can skip together
                self.lib.llama_memory_seq_rm(self.sequences.memory, seq, reused[row], -1)
            batch.fed[row] = reused[row]
        return CppPrefill(lengths, done, reused, batch, prompts)

    def advance(self, prefill: CppPrefill, tokens: int | None) -> torch.Tensor | None:
        """Compute the next `tokens` columns (None: all that are left); the last chunk returns
        the logits `[B, V]`."""
        start, end = prefill.done, prefill.span(tokens)
        width = prefill.width
        parts = []
        for prompt, n in zip(prefill.prompts, prefill.lengths, strict=True):
            pad = width - n
            parts.append(prompt[max(0, start - pad) : max(0, end - pad)])
        logits = self._run(prefill.batch, parts)
        prefill.done = end
        return torch.from_numpy(logits) if prefill.finished else None

    def row_kv(self, batch: CppBatch, row: int, start: int, end: int) -> SavedCells | None:
        """A copy of one row's cells at positions start..end, for the prefix cache."""
        assert self.prefix_storage is not None  # a cache exists only where there is storage
        return self.prefix_storage.copy(batch.seqs[row], start, end)

    def step(self, batch: CppBatch, next_ids: torch.Tensor) -> torch.Tensor:
        """Feed each row its newest token; returns the next-token logits `[B, V]`."""
        return torch.from_numpy(self._run(batch, [[int(t)] for t in next_ids.tolist()]))

    def select_rows(self, batch: CppBatch, indices: list[int]) -> None:
        """Keep (or repeat: a copy of the sequence) rows by index, in the given order; freed rows
        leave the KV cache."""
        seqs, fed, used = [], [], set()
        for index in indices:
            seq = batch.seqs[index]
            if seq in used:
                copy = self.sequences.take(batch, 1)[0]
                self.lib.llama_memory_seq_cp(self.sequences.memory, seq, copy, -1, -1)
                seq = copy
            used.add(seq)
            seqs.append(seq)
            fed.append(batch.fed[index])
        for seq in set(batch.seqs) - used:
            self.sequences.free(seq)
        batch.seqs, batch.fed = seqs, fed

    def merge(self, a: CppBatch, b: CppBatch, room: int) -> CppBatch:
        """One batch of a's rows then b's: the sequences already share the context."""
        a.seqs, a.fed = a.seqs + b.seqs, a.fed + b.fed
        b.seqs, b.fed = [], []
        self.sequences.adopt(a)
        return a

    def hidden_states(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Final normalised hidden states `[B, T, d]` of right-padded prompts (zeros past each
        end), with their mask."""
        lib = self.lib
        width = max(len(p) for p in prompts)
        hidden = torch.zeros(len(prompts), width, self.width)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        lib.llama_set_embeddings(self.ctx, True)
        self.editor.bypass()  # never steered nor read: what is embedded is the model's own
        try:
            for row, prompt in enumerate(prompts):
                batch = CppBatch([], [0])
                batch.seqs = self.sequences.take(batch, 1)
                self._embed(batch.seqs[0], prompt, hidden[row])
                self.sequences.free(batch.seqs[0])
                mask[row, : len(prompt)] = 1
        finally:
            lib.llama_set_embeddings(self.ctx, False)
            self.editor.restore()
        return hidden, mask

    def _embed(self, seq: int, prompt: list[int], into: torch.Tensor) -> None:
        lib, batch = self.lib, self._batch
        for start in range(0, len(prompt), self.chunk):
            part = prompt[start : start + self.chunk]
            for i, token in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = (
                    token,
                    start + i,
                    1,
                    True,
                )
                batch.seq_id[i][0] = seq
            batch.n_tokens = len(part)
            if lib.llama_decode(self.ctx, batch) != 0:
                raise InsufficientMemory(
                    f"llama.cpp's KV cache ({self.context} positions) cannot hold this input"
                )
            values = np.ctypeslib.as_array(
                lib.llama_get_embeddings(self.ctx), shape=(len(part) * self.width,)
            )
            into[start : start + len(part)] = torch.from_numpy(
                values.reshape(len(part), self.width).copy()
            )

    def prompt_logits(self, sequence: list[int], start: int) -> torch.Tensor:
        """Logits `[len - start, V]` at the positions predicting sequence[start:] (start >= 1),
        under the edit installed for the first row: none unless a scoring job's edit (a steered
        variant whose scoring is steered); likelihood and scoring jobs clear it first."""
        batch = CppBatch([], [0])
        batch.seqs = self.sequences.take(batch, 1)
        try:
            logits = self._run(batch, [sequence[:-1]], last_only=False)
        finally:
            self.sequences.free(batch.seqs[0])
        return torch.from_numpy(logits[start - 1 :])
