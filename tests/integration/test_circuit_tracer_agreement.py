"""millm's attribution graph against circuit-tracer's own (issue 35): the tiny Llama with a random
transcoder set in circuit-tracer's format on every block, the same prompt and target. circuit-tracer
runs in its own environment (.venv-circuit-tracer, made by scripts/setup.sh: it pins transformers
below 5) through its nnsight backend; millm's tracer runs here on the served model's weights.
Both must find the same active features, the same target probability, and every edge of the
graph equal within 1e-4 (measured: 1.7e-6 at most, the largest edge about 7)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from millm.interp.attribution.graph import EXACT, Budget, Target, Tracer
from millm.interp.attribution.replacement import ReplacementModel, Source, plain_source
from millm.interp.transcoders import read_transcoder_set
from tests.integration.engine_helpers import prompt_ids
from tests.support.tiny_models import BOS_ID
from tests.support.tiny_transcoders import build_clt, build_transcoder_set

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-circuit-tracer" / "bin" / "python"
SCRIPT = ROOT / "tests" / "support" / "circuit_tracer_graph.py"


def circuit_tracer(model_dir: Path, set_dir: Path, ids: list[int], target: int, out: Path) -> dict:
    assert PYTHON.exists(), (
        "circuit-tracer's environment is missing: run ./scripts/setup.sh --browser"
    )
    subprocess.run(
        [
            str(PYTHON),
            str(SCRIPT),
            str(model_dir),
            str(set_dir),
            json.dumps(ids),
            str(target),
            str(out),
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return json.loads(out.read_text())


def node_keys(graph) -> list[tuple]:
    """A name for each node that both tools' layouts share."""
    keys = []
    for node in range(graph.adjacency.shape[0]):
        kind, source, position = graph.kind(node)
        if kind == "feature":
            feature = graph.features[node]
            keys.append(("feature", graph.sources[feature.source].layer, position, feature.index))
        elif kind == "error":
            keys.append(("error", graph.sources[source].layer, position))
        else:
            keys.append((kind, position))
    return keys


def their_index(found: dict, positions: int) -> dict[tuple, int]:
    """circuit-tracer's node order: selected features, errors (layer, then position), tokens,
    logits."""
    index = {}
    for row, chosen in enumerate(found["selected_features"]):
        layer, position, feature = found["active_features"][chosen]
        index[("feature", layer, position, feature)] = row
    base = len(found["selected_features"])
    for layer in range(found["n_layers"]):
        for position in range(positions):
            index[("error", layer, position)] = base + layer * positions + position
    base += found["n_layers"] * positions
    for position in range(positions):
        index[("token", position)] = base + position
    index[("target", positions - 1)] = len(found["adjacency"]) - 1
    return index


@pytest.mark.parametrize("kind", ["plain", "skip-connections", "cross-layer"])
def test_millms_graph_is_circuit_tracers(llama_lm, tiny_dirs, tmp_path, kind):
    if kind == "cross-layer":
        set_dir = build_clt(tmp_path / "clt", seed=6)
    else:
        set_dir = build_transcoder_set(tmp_path / "set", seed=5, skip=kind == "skip-connections")
    ids = prompt_ids(llama_lm, "The capital of France is")
    if ids[0] != BOS_ID:  # circuit-tracer starts a prompt with a special token
        ids = [BOS_ID, *ids]
    with torch.inference_mode():
        top = int(llama_lm.runner.prompt_logits([*ids, 0], len(ids))[-1].argmax())
    theirs = circuit_tracer(tiny_dirs["llama"], set_dir, ids, top, tmp_path / "graph.json")
    assert theirs["input_tokens"] == ids

    transcoders = read_transcoder_set(set_dir)
    model = ReplacementModel(llama_lm.runner.layout)
    sources = [
        plain_source(
            Source(f"set/{layer}", sae, layer, "mlp", transcoders.skips.get(layer)),
            torch.float32,
        )
        for layer, sae in transcoders.layers.items()
    ]
    tracer = Tracer(model, ids, sources, Target((top,), (1.0,)), Budget(10_000))
    tracer.start()
    while tracer.expand():
        pass
    mine = tracer.finish()
    assert mine.method == EXACT
    assert mine.active_features == len(theirs["active_features"])
    assert mine.probability == pytest.approx(theirs["logit_probability"][0], abs=1e-5)

    index = their_index(theirs, len(ids))
    keys = node_keys(mine)
    assert all(key in index for key in keys)
    adjacency = torch.tensor(theirs["adjacency"], dtype=torch.float64)
    theirs_here = adjacency[[index[k] for k in keys]][:, [index[k] for k in keys]]
    compared = (mine.adjacency != 0) | (theirs_here != 0)
    assert int(compared.sum()) > 1000
    difference = (mine.adjacency - theirs_here).abs()[compared]
    assert float(difference.max()) < 1e-4, float(difference.max())
    # Features millm left unexpanded reach the target by no path: circuit-tracer's edges from
    # them to the target are zero too.
    expanded = {k for k in keys if k[0] == "feature"}
    for key, row in index.items():
        if key[0] == "feature" and key not in expanded:
            assert float(adjacency[-1, row]) == 0.0
