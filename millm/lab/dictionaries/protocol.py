"""The bodies of the dictionary routes: a training's request (what to train, on what corpus, what
to do with it after), a grade's request, and the views of both."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from millm.interp.dictionary_recipes import WITH_K, Architecture
from millm.interp.transcoder_training import TRANSCODER_ARCHITECTURES
from millm.lab.calibration.protocol import CalibrateRequest
from millm.lab.labels.protocol import ExplainRequest

MAX_LATENTS = 1 << 20
DictionaryName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")]


class DictionaryCorpus(BaseModel):
    """Where the text comes from (exactly one source), and how it is cut into windows."""

    model_config = ConfigDict(strict=True, extra="forbid")

    shipped_by: str | None = Field(
        None, description="The calibration corpus shipped with this registered SAE (the demo's)."
    )
    texts: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="Plain texts sent with the request."
    )
    files: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        description="Local files inside the allowed directories, read as they stream: .txt "
        '(paragraphs are documents) or .jsonl (one {"text": ...} or {"messages": [...]} per '
        "line).",
    )
    dataset: str | None = Field(
        None,
        description="A dataset saved with Hugging Face datasets' save_to_disk, inside the allowed "
        "directories (its first split, or `train`).",
    )
    column: Annotated[str, Field(min_length=1)] = Field(
        "text", description="The dataset's text column."
    )
    context_size: Annotated[int, Field(ge=8, le=4096)] = Field(
        128, description="Tokens per window: documents are cut into windows this long."
    )

    @model_validator(mode="after")
    def _one_source(self) -> DictionaryCorpus:
        given = [
            name
            for name in ("shipped_by", "texts", "files", "dataset")
            if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one source: shipped_by, texts, files or dataset"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    @property
    def source(self) -> str:
        """Which source it is, for messages and provenance."""
        for name in ("shipped_by", "texts", "files", "dataset"):
            if getattr(self, name) is not None:
                return name
        raise AssertionError("validated to have one source")


class TrainThen(BaseModel):
    """What the training job does with the dictionary once it is saved and registered."""

    model_config = ConfigDict(strict=True, extra="forbid")

    attach: bool = Field(False, description="Attach it to the served model.")
    calibrate: CalibrateRequest | None = Field(
        None, description="Then calibrate it (the calibration job's body; needs attach)."
    )
    label: bool = Field(
        False,
        description="Then label each feature that fired in the calibration by its top tokens "
        "(needs calibrate).",
    )
    explain: ExplainRequest | None = Field(
        None, description="Then explain its features (the explaining job's body; needs calibrate)."
    )
    grade: bool | None = Field(
        None,
        description="Grade it on the corpus's held-out windows (needs attach; default: when "
        "attached).",
    )

    @model_validator(mode="after")
    def _in_order(self) -> TrainThen:
        if self.calibrate is not None and not self.attach:
            raise ValueError("calibrate needs attach: a calibration reads the attached SAE")
        if self.label and (self.calibrate is None or self.calibrate.top_examples == 0):
            raise ValueError(
                "label needs calibrate with top_examples: a feature's top tokens are its "
                "calibration's top examples"
            )
        if self.explain is not None and self.calibrate is None:
            raise ValueError("explain needs calibrate: explaining reads the calibration's examples")
        if self.grade and not self.attach:
            raise ValueError("grade needs attach: a grade reads the attached SAE")
        return self

    @property
    def grading(self) -> bool:
        """Whether the training grades what it made."""
        return self.attach if self.grade is None else self.grade


class TrainRequest(BaseModel):
    """POST /api/saes/train: an SAE at a layer of the served model, or a transcoder set (one per
    block), trained with SAELens on activations millm reads."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: DictionaryName | None = Field(
        None,
        description="The folder it is saved in under the data directory's dictionaries/ "
        "(default: model-Llayer-architecture-width; a set: model-transcoders-architecture-width).",
    )
    kind: Literal["sae", "transcoder_set"] = Field(
        "sae",
        description="An SAE at `layer`, or a transcoder per block (each reads its block's MLP "
        "input and predicts the MLP's output), registered as a transcoder set for attribution "
        "graphs.",
    )
    architecture: Architecture | None = Field(
        None,
        description="SAELens's training architecture (default: topk for an SAE, batchtopk for "
        "transcoders, which are batchtopk or jumprelu).",
    )
    layer: Annotated[int, Field(ge=0)] | None = Field(None, description="An SAE's layer.")
    hook_point: Literal["resid_post", "resid_pre"] | None = Field(
        None, description="Where an SAE reads (default resid_post)."
    )
    skip: bool = Field(False, description="Give each transcoder a skip connection (x @ W_skip.T).")
    d_sae: Annotated[int, Field(ge=16, le=MAX_LATENTS)] | None = Field(
        None, description="Latents (default: 8 × the residual width; a set's, each block's)."
    )
    k: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Active latents per token (TopK, BatchTopK, Matryoshka; default 32)."
    )
    matryoshka_widths: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, description="Matryoshka's nested widths, increasing, the last d_sae."
    )
    l0_coefficient: Annotated[float, Field(gt=0)] | None = Field(
        None, description="JumpReLU's sparsity coefficient (default 1)."
    )
    training_tokens: Annotated[int, Field(ge=1024)] = Field(
        2_000_000, description="Activations trained on (the corpus is read once, at most)."
    )
    batch_tokens: Annotated[int, Field(ge=64, le=65_536)] = Field(
        4096, description="Activations per optimiser step."
    )
    buffer_tokens: Annotated[int, Field(ge=128)] | None = Field(
        None,
        description="Rows of the shuffling buffer (its memory is rows × row width × 4 bytes, a "
        "set's row every block's input and output; default 16 batches, or fewer to fit "
        "MILLM_DICTIONARY_BUFFER_BYTES).",
    )
    epochs: Annotated[int, Field(ge=1, le=1000)] = Field(
        1,
        description="Passes over the activations read: the model reads training_tokens / epochs "
        "of them once, kept on disk in the training's folder (rows × row width × 4 bytes, within "
        "MILLM_DICTIONARY_CACHE_BYTES), and the later passes replay them shuffled.",
    )
    lr: Annotated[float, Field(gt=0, le=1)] = Field(1e-3, description="Adam's learning rate.")
    seed: int = 0
    dead_window_tokens: Annotated[int, Field(ge=64)] = Field(
        1_000_000,
        description="A latent silent for this many tokens is dead: SAELens's dead-latent window, "
        "after which TopK's and BatchTopK's auxiliary loss revives it (and the curve counts it).",
    )
    checkpoint_every_tokens: Annotated[int, Field(ge=1024)] | None = Field(
        None, description="Tokens between checkpoints (default: a tenth of the training)."
    )
    corpus: DictionaryCorpus
    then: TrainThen = Field(default_factory=TrainThen)

    @model_validator(mode="after")
    def _kind_options(self) -> TrainRequest:
        if self.kind == "sae":
            if self.layer is None:
                raise ValueError("layer: an SAE is trained at a layer; give one")
            if self.skip:
                raise ValueError("skip: a skip connection is a transcoder's")
            return self
        if self.layer is not None or self.hook_point is not None:
            raise ValueError(
                "layer, hook_point: a transcoder set has one transcoder per block, each reading "
                "its block's MLP input"
            )
        if self.architecture is not None and self.architecture not in TRANSCODER_ARCHITECTURES:
            raise ValueError(
                f"architecture: transcoders are trained as {' or '.join(TRANSCODER_ARCHITECTURES)}"
                " (JumpReLUs at inference, what transcoder sets hold)"
            )
        then = self.then
        if then.attach or then.grade or then.calibrate is not None or then.explain is not None:
            raise ValueError(
                "then: a transcoder set is registered for attribution graphs; attach, calibrate, "
                "explain and grade are an SAE's"
            )
        return self

    @property
    def trained(self) -> Architecture:
        """The architecture trained (the request's, or its kind's default)."""
        if self.architecture is not None:
            return self.architecture
        return "topk" if self.kind == "sae" else "batchtopk"

    @property
    def read_point(self) -> str:
        """Where it reads: an SAE's hook point, or the MLPs' input."""
        return "mlp" if self.kind == "transcoder_set" else (self.hook_point or "resid_post")

    @model_validator(mode="after")
    def _architecture_options(self) -> TrainRequest:
        if self.trained not in WITH_K and self.k is not None:
            raise ValueError(f"k: a {self.trained} dictionary has no k (use l0_coefficient)")
        if self.trained != "jumprelu" and self.l0_coefficient is not None:
            raise ValueError("l0_coefficient is JumpReLU's alone")
        if (self.trained == "matryoshka_batchtopk") != (self.matryoshka_widths is not None):
            raise ValueError("matryoshka_widths: give them for matryoshka_batchtopk, and only then")
        return self


class GradeRequest(BaseModel):
    """POST /api/saes/{id}/grade and /api/transcoders/{id}/grade: the text to grade an attached
    SAE (or transcoder) or a registered transcoder set on."""

    model_config = ConfigDict(strict=True, extra="forbid")

    corpus: DictionaryCorpus
    part: Literal["all", "held_out"] = Field(
        "all",
        description="Every window, or only those a training on this corpus holds out (every "
        "20th): grade a dictionary trained here on text it never saw.",
    )
    max_tokens: Annotated[int, Field(ge=16, le=1_000_000)] = Field(
        16_384, description="Tokens graded at most."
    )


class TrainingView(BaseModel):
    """A training as GET /api/saes/trainings/{id} shows it."""

    id: str
    object: Literal["dictionary_training"] = "dictionary_training"
    model: str
    state: str
    request: dict[str, Any]
    progress: dict[str, Any]
    job_id: str | None = None  # the job running it in this process, while it runs
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: float
    finished_at: float | None = None
