"""EleutherAI delphi's prompts for explaining a feature and for detection scoring, and how delphi
formats and parses what goes through them.

The prompt texts are delphi's own, read from the installed `eai-delphi` package (scripts/setup.sh
installs it with --no-deps): its package imports vLLM and a hub client, so the two prompt files,
which import nothing, are loaded by path instead of imported. What surrounds them is delphi's
method done here: the explainer's examples with the activating tokens between << >> (tokens above
THRESHOLD × the example's largest activation) followed by their activations scaled 0-10 against
the feature's largest; the last `[EXPLANATION]:` line is the explanation; detection shows one text
at a time (delphi's default `n_examples_shown=1`) and reads the answer `[1]` or `[0]`; fuzzing
shows one marked text at a time, an activating window marked where the feature fired (tokens at
or above THRESHOLD × its peak, as delphi's scorer marks them) or a quiet window marked at random
tokens, and asks whether every marked token fits the explanation.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import re
from types import ModuleType

from millm.errors import InvalidRequest

DISTRIBUTION = "eai-delphi"
THRESHOLD = 0.3  # delphi's Explainer.threshold: a token is marked above 0.3 × the example's peak
MAX_SHOWN_ACTIVATIONS = 11  # delphi lists the first 11 marked tokens' activations per example
NOT_PARSED = "Explanation could not be parsed."  # delphi's text for an answer without the tag
EXPLANATION = re.compile(r"\[EXPLANATION\]:\s*(.*)", re.DOTALL)
Messages = list[dict[str, str]]


@functools.cache
def _module(relative: str) -> ModuleType:
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise InvalidRequest(
            "this server cannot explain features: EleutherAI delphi's prompts are not installed "
            "(pip install --no-deps eai-delphi==0.1.3; scripts/setup.sh does)",
            param="explainer",
            code="explainer_unavailable",
        ) from None
    path = distribution.locate_file(f"delphi/{relative}")
    spec = importlib.util.spec_from_file_location(f"millm_delphi_{relative}", str(path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_version() -> str:
    """Which prompts wrote and scored an explanation, for its provenance."""
    version = importlib.metadata.version(DISTRIBUTION)
    return (
        f"delphi {version}: default explainer (activations shown), detection and fuzzing (one text)"
    )


def marked(tokens: list[str], chosen: list[bool]) -> str:
    """The text with each run of chosen tokens between << >>."""
    out, i = [], 0
    while i < len(tokens):
        if chosen[i]:
            run = []
            while i < len(tokens) and chosen[i]:
                run.append(tokens[i])
                i += 1
            out.append("<<" + "".join(run) + ">>")
        else:
            out.append(tokens[i])
            i += 1
    return "".join(out)


def fuzz_marks(activations: list[float]) -> list[bool]:
    """Where delphi's fuzzing scorer marks an activating window: at or above THRESHOLD × its
    peak."""
    threshold = max(activations) * THRESHOLD
    return [a >= threshold for a in activations]


def highlighted(tokens: list[str], activations: list[float]) -> str:
    """The example's text with each run of tokens above THRESHOLD × its peak between << >>."""
    threshold = max(activations) * THRESHOLD
    return marked(tokens, [a > threshold for a in activations])


def scaled(activation: float, peak: float) -> int:
    """An activation on delphi's 0-10 scale against the feature's largest (rounded up)."""
    return int(min(10, max(0, math.ceil(activation * 10 / max(peak, 1e-6)))))


def activation_line(tokens: list[str], activations: list[float], peak: float) -> str:
    """delphi's `Activations:` line: the marked tokens with their scaled activations."""
    threshold = max(activations) * THRESHOLD
    shown = [
        f'("{token}" : {scaled(a, peak)}), '
        for token, a in zip(tokens, activations, strict=True)
        if a > threshold
    ][:MAX_SHOWN_ACTIVATIONS]
    return "Activations: " + "".join(shown)


def explainer_messages(examples: list[tuple[list[str], list[float]]], peak: float) -> Messages:
    """The chat that asks for an explanation: delphi's system prompt, its three worked examples,
    then the feature's examples (token strings and activations), each marked and followed by its
    activations."""
    prompts = _module("explainers/default/prompts.py")
    messages: Messages = list(prompts.system(cot=False))
    for n in (1, 2, 3):
        asked, answered = prompts.example(n, activations=True, cot=False)
        messages += [
            {"role": "user", "content": asked},
            {"role": "assistant", "content": answered},
        ]
    lines = []
    for tokens, activations in examples:
        lines += [highlighted(tokens, activations), activation_line(tokens, activations, peak)]
    messages.append({"role": "user", "content": "\n" + "\n".join(lines) + "\n"})
    return messages


def parsed_explanation(answer: str) -> str | None:
    """The first line of text after the answer's `[EXPLANATION]:` tag (delphi asks for one line),
    or None when it has none (or nothing after it)."""
    match = EXPLANATION.search(answer)
    if match is None:
        return None
    lines = [line.strip() for line in match.group(1).strip().splitlines()]
    return lines[0] if lines and lines[0] else None


def detection_messages(explanation: str, text: str) -> Messages:
    """The chat that asks whether one text has the explained feature (delphi's detection prompt)."""
    return list(
        _module("scorers/classifier/prompts/detection_prompt.py").prompt(
            f"Example 0: {text}", explanation
        )
    )


def fuzzing_messages(explanation: str, marked_text: str) -> Messages:
    """The chat that asks whether every marked token of one text fits the explanation (delphi's
    fuzzing prompt)."""
    prompt = _module("scorers/classifier/prompts/fuzz_prompt.py").prompt
    return list(prompt(f"Example 0: {marked_text}", explanation))
