"""The replacement model: the served model's own weights, re-run with its features as nodes.

One forward pass over a prompt (in `rows` identical rows if asked; the tracer runs one and
batches its backward passes instead). At each feature source the computation is cut and
re-expressed:

- an SAE on the residual after block L replaces that residual with its reconstruction
  Σ a_i·W_dec[i] + b_dec plus an error node (what it misses), both constants;
- a transcoder at block L replaces that block's MLP output the same way; a cross-layer
  transcoder's block-L features write into the MLP output of every block from L on, so a
  block's reconstruction also holds what earlier blocks' features wrote into it.

Feature activations are therefore leaves: their values are the model's, nothing upstream can
change them in the linearised model, and a node's effect on a target is its write (a_i·W_dec[i],
the error vector, the token's embedding) dotted with the target's gradient at the place it
writes (an injection point `z`, zeros, added there).

Two linearisations, and the graph says which it used. With a transcoder on every block (the
published method) attention patterns and every normalisation's scale are computed and then
held (`frozen`), so the model between nodes is linear and the edges are its exact direct
effects. Otherwise (residual SAEs, or MLPs left in the pass) the gradient is the model's own at
this prompt, attention and norms included: attribution patching (gradient x activation), a first
order estimate of what removing a node does. Holding attention and norms there would describe
a model that is not the served one: on the demo model ("The capital of France is" -> " Paris",
the top 10 features) the frozen predictions correlated at -0.08 with the served model's change
when a tenth of each feature's write is removed, the model's own gradients at 0.92.

The pass runs on the layout the lean runner serves (engine/families.py) in float32 (float64 in
the checks), from the weights as loaded, so no kernel's rounding enters it; without sources and
steering its logits are the model's (tested).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F

from millm.engine.attention import rotate
from millm.engine.families import BlockLayout, ModelLayout, soft_capped
from millm.engine.residual import EMBEDDINGS, ResidualEdit, mlp_input, run_operation
from millm.interp.sae import SAE

Site = Literal["resid", "mlp"]
# Positions whose writes are no node's: the first is an attention sink in most models (its
# residual tens of times the others' norm; discovery skips it too), where features mean nothing.
# As circuit-tracer does (its zero_positions: features and error vectors there set to 0), what
# the sources write there stays in the pass as a constant of the graph, credited to no node.
SINK_POSITIONS = 1


@dataclass(frozen=True)
class Source:
    """A feature source: an SAE replacing the residual after block `layer` (site resid; layer -1:
    before block 0), or a transcoder replacing block `layer`'s MLP output (site mlp), with its
    skip connection when it has one (`skip`: W_skip `[d_model, d_model]`, adding read @ W_skip.T).
    A cross-layer transcoder's block writes into block `layer + k`'s MLP output too (its
    `sae.cross`, `sae.writes`)."""

    name: str
    sae: SAE
    layer: int
    site: Site
    skip: torch.Tensor | None = None


def plain(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy autograd may save: the served weights were made under inference mode."""
    with torch.inference_mode(False):
        return tensor.detach().to(dtype).clone()


def plain_source(source: Source, dtype: torch.dtype) -> Source:
    """The source with its SAE's tensors (a CLT block's whole decoder among them) and skip
    connection copied as `plain` tensors of `dtype`."""
    sae = copy.copy(source.sae)
    for name, value in vars(source.sae).items():
        if isinstance(value, torch.Tensor):
            setattr(sae, name, plain(value, dtype))
    skip = None if source.skip is None else plain(source.skip, dtype)
    return replace(source, sae=sae, skip=skip)


class FrozenPass:
    """The frozen values of one pass (patterns, norm scales, what each source stands in for), in
    the order the pass makes them; `replaying` hands them back to a later pass instead, so a
    perturbed pass runs the very linearised model of the first (the finite-difference check)."""

    def __init__(self) -> None:
        self.values: list[torch.Tensor] = []
        self.cursor: int | None = None

    def replaying(self) -> FrozenPass:
        """Start handing the recorded values back from the first."""
        self.cursor = 0
        return self

    def __call__(self, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.cursor is None:
            self.values.append(compute())
            return self.values[-1]
        self.cursor += 1
        return self.values[self.cursor - 1]


Hold = Callable[[Callable[[], torch.Tensor]], torch.Tensor]


def _live(compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    return compute()


class FrozenNorm:
    """A model's normalisation module (RMSNorm, Gemma's 1 + w RMSNorm, LayerNorm) in any dtype,
    with its scale held at the operating point when `frozen`."""

    def __init__(self, module: torch.nn.Module):
        self.layer_norm = isinstance(module, torch.nn.LayerNorm)
        self.name = type(module).__name__
        weight: torch.Tensor | None = getattr(module, "weight", None)
        bias: torch.Tensor | None = getattr(module, "bias", None)
        self.weight = None if weight is None else plain(weight, torch.float64)
        self.bias = None if bias is None else plain(bias, torch.float64)
        eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None)
        if eps is None:
            raise ValueError(f"attribution does not know the normalisation {self.name}")
        self.eps = float(eps)
        # Gemma's RMSNorm multiplies by (1 + w): its weights are kept as offsets from one.
        self.offset = 1.0 if not self.layer_norm and self.name.startswith("Gemma") else 0.0
        if weight is None:
            raise ValueError(f"attribution does not know the normalisation {self.name}")
        probe = torch.randn(3, weight.shape[0])
        mine = self(probe.double(), frozen=False).float()
        # forward, not __call__: the served model's hooks (MLP-input taps) must not see the probe.
        theirs = module.forward(probe.to(weight.dtype)).float()
        if not torch.allclose(mine, theirs, rtol=2e-2, atol=2e-2):
            raise ValueError(f"attribution does not know the normalisation {self.name}")

    def __call__(
        self, x: torch.Tensor, frozen: bool = True, hold: Hold | None = None
    ) -> torch.Tensor:
        """Normalise the last dimension; with `frozen` the scale is a constant (`hold`'s, if
        given)."""
        if self.layer_norm:
            x = x - x.mean(-1, keepdim=True)
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if frozen:
            live = scale.detach()
            scale = live if hold is None else hold(lambda: live)
        out = x * scale
        if self.weight is not None:
            out = out * (self.weight.to(x.dtype) + self.offset)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out


@dataclass
class SourceTrace:
    """What one source saw and wrote in a pass: pre-activations `[B, T, d_sae]` (with grad),
    activations `[T, d_sae]`, the decoder's output scale `[T, 1]`, its error nodes' writes
    `[T, d]` (zero at the sink positions), and its injection point `z` `[B, T, d]`."""

    source: Source
    pre: torch.Tensor
    acts: torch.Tensor
    scale: torch.Tensor
    errors: torch.Tensor
    z: torch.Tensor


@dataclass
class Trace:
    """One replacement pass: each source's trace, the token embeddings `[T, d]` and their
    injection point, and the last position's logits `[B, V]` (with grad)."""

    sources: list[SourceTrace]
    embeddings: torch.Tensor
    z_embed: torch.Tensor
    logits: torch.Tensor


class ReplacementModel:
    """The served model's layout re-run in `dtype`, its sources spliced in."""

    def __init__(
        self, layout: ModelLayout, dtype: torch.dtype = torch.float32, frozen: bool = True
    ):
        """`frozen`: hold attention patterns and norm scales (the transcoder method); without it
        every gradient is the model's own (attribution patching)."""
        self.layout, self.dtype, self.frozen = layout, dtype, frozen
        self.norms: dict[int, FrozenNorm] = {}
        self.weights: dict[int, torch.Tensor] = {}
        self.hold: Hold = _live
        self.seen: dict[int, torch.Tensor] = {}  # this pass's MLP inputs, for a transcoder's clamp
        self.pending: dict[int, torch.Tensor] = {}
        self.final_norm = self._norm(layout.final_norm)
        for block in layout.blocks:
            for module in (
                block.attn_norm,
                block.mlp_norm,
                block.attn_out_norm,
                block.mlp_out_norm,
                block.attention.q_norm,
                block.attention.k_norm,
            ):
                if module is not None:
                    self._norm(module)

    def _norm(self, module: torch.nn.Module) -> FrozenNorm:
        key = id(module)
        if key not in self.norms:
            self.norms[key] = FrozenNorm(module)
        return self.norms[key]

    def linear(self, x: torch.Tensor, weights) -> torch.Tensor:
        """x @ W.T + b over a plain copy of the served weight (made once per model)."""
        weight, bias = weights
        return F.linear(x, self._plain(weight), None if bias is None else self._plain(bias))

    def _plain(self, tensor: torch.Tensor) -> torch.Tensor:
        key = id(tensor)
        found = self.weights.get(key)
        if found is None:
            found = self.weights[key] = plain(tensor, self.dtype)
        return found

    def norm(self, module: torch.nn.Module | None, x: torch.Tensor) -> torch.Tensor:
        """A module's frozen normalisation of x (x itself where the family has none there)."""
        return x if module is None else self.norms[id(module)](x, self.frozen, self.hold)

    def attention(self, block: BlockLayout, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Attention with its pattern computed from the live q and k, then held."""
        spec = block.attention
        rows, width, _ = h.shape
        q_size, kv_size = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        q, k, v = self.linear(h, spec.qkv).split([q_size, kv_size, kv_size], dim=-1)
        if self.frozen:
            q, k = q.detach(), k.detach()
        q = q.view(rows, width, spec.heads, spec.head_dim)
        k = k.view(rows, width, spec.kv_heads, spec.head_dim)
        if spec.q_norm is not None and spec.k_norm is not None:
            q, k = self.norm(spec.q_norm, q), self.norm(spec.k_norm, k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(rows, width, spec.kv_heads, spec.head_dim).transpose(1, 2)
        if spec.rope is not None:
            probe = torch.zeros(1, dtype=self.dtype, device=h.device)
            cos, sin = self.layout.rotary[spec.rope](probe, pos[None])
            cos, sin = cos.to(self.dtype)[:, None], sin.to(self.dtype)[:, None]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        groups = spec.heads // spec.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)

        def pattern() -> torch.Tensor:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
                scores = torch.matmul(q, k.transpose(2, 3)) * spec.scaling
                if spec.softcap is not None:
                    scores = torch.tanh(scores / spec.softcap) * spec.softcap
                distance = pos[:, None] - pos[None, :]
                seen = distance >= 0
                if spec.window is not None:
                    seen = seen & (distance < spec.window)
                return torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)

        out = (
            torch.matmul(self.hold(pattern) if self.frozen else pattern(), v)
            .transpose(1, 2)
            .reshape(rows, width, q_size)
        )
        return self.norm(block.attn_out_norm, self.linear(out, spec.out))

    def mlp(self, block: BlockLayout, h: torch.Tensor) -> torch.Tensor:
        """The block's own MLP (left non-linear: its gradient is taken at this prompt)."""
        z = self.linear(h, block.mlp_in)
        if block.gated:
            gate, up = z.chunk(2, dim=-1)
            z = block.act(gate) * up
        else:
            z = block.act(z)
        return self.norm(block.mlp_out_norm, self.linear(z, block.mlp_out))

    def trace(
        self,
        prompt: list[int],
        rows: int,
        sources: list[Source],
        edit: ResidualEdit | None = None,
        held: FrozenPass | None = None,
        shifts: dict[int, torch.Tensor] | None = None,
    ) -> Trace:
        """One pass over `prompt` in `rows` identical rows, every source spliced in; call with
        grad enabled (the injections and pre-activations carry it). `held` records the frozen
        values (or replays them); `shifts` adds `[T, d]` at injection points (0: the tokens,
        i + 1: source i), which is how a check perturbs one node's write."""
        self.hold = _live if held is None else held
        self.shifts = shifts or {}
        try:
            return self._trace(prompt, rows, sources, edit)
        finally:
            self.hold = _live

    def _trace(self, prompt, rows, sources, edit) -> Trace:
        device = self.layout.head.weight.device
        ids = torch.tensor(prompt, device=device)
        pos = torch.arange(len(prompt), device=device)
        embeddings = self.layout.embed(ids[None], pos[None])[0].detach().to(self.dtype)
        z_embed = torch.zeros(rows, *embeddings.shape, dtype=self.dtype, device=device)
        z_embed.requires_grad_(True)
        x = embeddings[None] + z_embed + self._shift(0, x_like=embeddings)
        by_place = {(s.layer, s.site): s for s in sources}
        traces: list[SourceTrace] = []
        self.seen = {}
        self.pending = {}  # block -> what earlier CLT blocks' features wrote into its MLP output
        x = self._after(EMBEDDINGS, x, by_place, traces, edit)
        for block in self.layout.blocks:
            a = self.attention(block, self.norm(block.attn_norm, x), pos)
            h = x if block.parallel else x + a
            mlp_in = self.norm(block.mlp_norm, h)
            self.seen[mlp_input(block.index)] = mlp_in
            transcoder = by_place.get((block.index, "mlp"))
            if transcoder is None:
                m = self.mlp(block, mlp_in)
            else:
                m = self._replace(transcoder, mlp_in, self.mlp(block, mlp_in).detach(), traces)
            x = (x + a + m) if block.parallel else (h + m)
            x = self._after(block.index, x, by_place, traces, edit)
        last = self.final_norm(x[:, -1], self.frozen, self.hold)
        logits = self.linear(last, (self.layout.head.weight, self.layout.head.bias))
        logits = soft_capped(logits, self.layout.final_softcap)
        return Trace(traces, embeddings, z_embed, logits)

    def _after(self, point: int, x, by_place, traces, edit) -> torch.Tensor:
        """The residual after `point`: the steering there, then any SAE replacing it."""
        if edit is not None:
            vector = edit.vector(point)
            if vector is not None:
                x = x + vector.to(device=x.device, dtype=x.dtype)
            for operation in edit.operations_at(point):
                rows = [run_operation(operation, r, self.seen, i) for i, r in enumerate(x)]
                x = torch.stack([row.to(x.dtype) for row in rows])
        source = by_place.get((point, "resid"))
        return x if source is None else self._replace(source, x, x.detach(), traces)

    def _replace(
        self, source: Source, read: torch.Tensor, actual: torch.Tensor, traces: list[SourceTrace]
    ) -> torch.Tensor:
        """A source reads `read` and stands in for `actual`: reconstruction + error, both constant,
        plus its injection point. A transcoder's skip connection stays a live linear path from
        what it reads (circuit-tracer's `skip + (output - skip).detach()`); the error node is
        what the features, b_dec and the skip leave out."""
        sae = source.sae
        dtype = sae.W_enc.dtype
        pre = sae.pre_activation(read.to(dtype)).to(self.dtype)
        first = read[0].detach().to(dtype)
        acts = sae.activate(pre[0].detach().to(dtype))
        acts[:SINK_POSITIONS] = 0
        scale = sae.output_scale(first).to(self.dtype)
        reconstruction = sae.decode(acts, first).to(self.dtype)
        if source.site == "mlp":
            reconstruction = reconstruction + self.pending.pop(source.layer, 0.0)
        if sae.cross is not None:  # this block's features' writes into later blocks
            for k in range(1, sae.reach):
                later = (acts @ sae.cross[:, k].to(dtype)).to(self.dtype)
                self.pending[source.layer + k] = self.pending.get(source.layer + k, 0.0) + later
        acts = acts.to(self.dtype)
        skip = None if source.skip is None else read @ source.skip.T
        errors = actual[0] - reconstruction
        if skip is not None:
            errors = errors - skip[0].detach()
        z = torch.zeros_like(actual, requires_grad=True)
        nodes = errors.clone()
        nodes[:SINK_POSITIONS] = 0  # the sink's error node writes nothing (the pass keeps it)
        traces.append(SourceTrace(source, pre, acts, scale, nodes, z))
        written = self.hold(lambda: reconstruction + errors)
        out = written[None] + z + self._shift(len(traces), x_like=written)
        return out if skip is None else out + skip

    def _shift(self, point: int, x_like: torch.Tensor) -> torch.Tensor | float:
        shift = self.shifts.get(point)
        return 0.0 if shift is None else shift.to(x_like.dtype)
