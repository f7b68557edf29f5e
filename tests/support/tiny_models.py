"""Tiny random-weight checkpoints and a locally trained tokenizer, built in seconds, offline.

Real transformers models and a real BPE tokenizer (trained here on a fixed corpus), so tests
exercise the same code paths as a production model, only smaller.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

CHATML_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    # Qwen 3's switch, read from chat_template_kwargs: an empty thought block when thinking is off.
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% "
    "endif %}{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>"]
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CONTEXT = 2048


def corpus() -> list[str]:
    """A fixed, varied English corpus (with some non-ASCII) to train the BPE tokenizer on."""
    subjects = [
        "The cat",
        "A river",
        "Paris",
        "My friend",
        "The model",
        "Every feature",
        "The capital",
        "Sparse codes",
    ]
    verbs = ["runs", "is", "becomes", "answers", "steers", "reads", "writes", "counts"]
    objects = [
        "quickly",
        "the city of France",
        "a small autoencoder",
        "one two three four five",
        "naïve café",
        "über",
        "数字",
    ]
    lines = [f"{s} {v} {o}." for s in subjects for v in verbs for o in objects]
    lines += [
        "Hello! How are you today? I am fine, thank you.",
        "What is the capital of France? Paris.",
    ]
    return lines * 3


def build_tokenizer(directory: Path, chat_template: str | None = CHATML_TEMPLATE):
    """Train a byte-level BPE tokenizer (adds BOS) and save it as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="<|im_end|>", pad_token="<pad>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    return fast


def _common(vocab_size: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )


def _save(model, tokenizer_dir: Path, directory: Path) -> Path:
    model.save_pretrained(str(directory))
    for name in tokenizer_dir.iterdir():
        if name.is_file():
            shutil.copy(name, directory / name.name)
    return directory


def build_llama(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer Llama with random weights (initializer_range widened so logits are not flat)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"])
    torch.manual_seed(seed)
    config = LlamaConfig(**_common(vocab), initializer_range=0.2)
    model = LlamaForCausalLM(config).eval()
    return _save(model, tokenizer_dir, directory)


def build_gemma2(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer Gemma2 (soft-capping, sliding window of 16 on alternate layers) with random
    weights."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"])
    torch.manual_seed(seed)
    config = Gemma2Config(
        **_common(vocab),
        head_dim=16,
        sliding_window=16,
        query_pre_attn_scalar=16,
        initializer_range=0.2,
    )
    model = Gemma2ForCausalLM(config).eval()
    return _save(model, tokenizer_dir, directory)


def with_extra_eos(directory: Path, model_dir: Path, eos_ids: list[int]) -> Path:
    """A copy of a checkpoint whose generation config ends generation at any of `eos_ids` too."""
    shutil.copytree(model_dir, directory)
    path = directory / "generation_config.json"
    config = json.loads(path.read_text())
    config["eos_token_id"] = [EOS_ID, *eos_ids]
    path.write_text(json.dumps(config))
    return directory


def build_qwen2(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer Qwen2 (q/k/v biases, so it runs on the generic transformers runner) with random
    weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"])
    torch.manual_seed(seed)
    config = Qwen2Config(**_common(vocab), initializer_range=0.2, use_sliding_window=False)
    model = Qwen2ForCausalLM(config).eval()
    _jitter(model, "bias", std=0.1)
    return _save(model, tokenizer_dir, directory)


# A Hermes-style template that takes `tools` (as Qwen 2.5 and many others do): the tools in a
# system block, calls as <tool_call>{...}</tool_call>, results as <tool_response> user turns.
TOOLS_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Call one with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\n{% endif %}'
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% for call in message.tool_calls %}<tool_call>{{ {'name': call.function.name, 'arguments': "
    "call.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% elif message.role "
    "== 'tool' %}<|im_start|>user\n<tool_response>{{ message.content "
    "}}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _jitter(model, part: str, mean: float = 0.0, std: float = 0.3) -> None:
    """Random values for parameters whose name contains `part` (biases and norms start constant,
    which would hide their handling)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if part in name:
                parameter.normal_(mean, std)


def _vocab(tokenizer_dir: Path) -> int:
    return len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])


def build_gemma3(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 4-layer Gemma 3 text model (QK-norm, sliding window of 8 on layers 0-2, local and global
    RoPE, tied head)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        **{**_common(_vocab(tokenizer_dir)), "num_hidden_layers": 4, "tie_word_embeddings": True},
        head_dim=16,
        sliding_window=8,
        sliding_window_pattern=4,
        query_pre_attn_scalar=16,
        initializer_range=0.2,
    )
    model = Gemma3ForCausalLM(config).eval()
    _jitter(model, "norm")  # Gemma's norms scale by 1 + w
    return _save(model, tokenizer_dir, directory)


def build_llama3(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer Llama with Llama 3.1's RoPE scaling (`rope_type: llama3`, theta 500,000) and
    random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = LlamaConfig(
        **_common(_vocab(tokenizer_dir)), initializer_range=0.2, rope_parameters=rope
    )
    model = LlamaForCausalLM(config).eval()
    return _save(model, tokenizer_dir, directory)


def build_mistral(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer Mistral whose every layer has a sliding window of 8, with random weights."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(
        **_common(_vocab(tokenizer_dir)), head_dim=16, sliding_window=8, initializer_range=0.2
    )
    model = MistralForCausalLM(config).eval()
    return _save(model, tokenizer_dir, directory)


def build_qwen3(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer Qwen 3 (QK-norm, no biases) with random weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        **_common(_vocab(tokenizer_dir)),
        head_dim=16,
        initializer_range=0.2,
        use_sliding_window=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    _jitter(model, "norm", mean=1.0)
    return _save(model, tokenizer_dir, directory)


def build_gpt2(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer GPT-2 (learned positions, LayerNorm, biases, tied head) with random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=_vocab(tokenizer_dir),
        n_embd=64,
        n_layer=3,
        n_head=4,
        n_positions=CONTEXT,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        initializer_range=0.2,
    )
    model = GPT2LMHeadModel(config).eval()
    _jitter(model, "bias", std=0.1)
    return _save(model, tokenizer_dir, directory)


def build_gpt_neox(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 3-layer GPT-NeoX (Pythia's layout: parallel residual, a quarter of each head rotated)
    with random weights."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    config = GPTNeoXConfig(
        vocab_size=_vocab(tokenizer_dir),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=CONTEXT,
        rotary_pct=0.25,
        use_parallel_residual=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    model = GPTNeoXForCausalLM(config).eval()
    _jitter(model, "bias", std=0.1)
    return _save(model, tokenizer_dir, directory)


def build_phi3(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 2-layer Phi-3 with a sliding window: a family the lean runner leaves to transformers'
    forward."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(seed)
    config = Phi3Config(
        **{**_common(_vocab(tokenizer_dir)), "num_hidden_layers": 2},
        sliding_window=16,
        initializer_range=0.2,
    )
    model = Phi3ForCausalLM(config).eval()
    return _save(model, tokenizer_dir, directory)


# Every family the lean runner serves, by fixture name: its builder.
FAMILIES = {
    "llama": build_llama,
    "llama3": build_llama3,
    "mistral": build_mistral,
    "gemma2": build_gemma2,
    "gemma3": build_gemma3,
    "qwen2": build_qwen2,
    "qwen3": build_qwen3,
    "gpt2": build_gpt2,
    "gpt_neox": build_gpt_neox,
}
