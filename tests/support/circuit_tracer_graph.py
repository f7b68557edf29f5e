"""Run by tests in circuit-tracer's own environment (circuit-tracer pins transformers below 5, so
it cannot share millm's): the graph circuit-tracer computes for a prompt, a target token and a
transcoder set (or a cross-layer transcoder) in its format, written as JSON for the test to
compare with millm's.

    python tests/support/circuit_tracer_graph.py MODEL_DIR SET_DIR IDS_JSON TARGET OUT_JSON
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from circuit_tracer import ReplacementModel, attribute
from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set


def readable(model_dir: str) -> str:
    """A copy of the checkpoint whose tokenizer transformers 4 can name (transformers 5 writes
    its own class name, TokenizersBackend, into tokenizer_config.json)."""
    copy = Path(tempfile.mkdtemp()) / "model"
    shutil.copytree(model_dir, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config))
    return str(copy)


def main() -> None:
    model_dir, set_dir, ids_json, target, out = sys.argv[1:6]
    model_dir = readable(model_dir)
    config = yaml.safe_load((Path(set_dir) / "config.yaml").read_text())
    hooks = {
        "feature_input_hook": config["feature_input_hook"],
        "feature_output_hook": config["feature_output_hook"],
    }
    common = {"device": torch.device("cpu"), "dtype": torch.float32, "lazy_encoder": False}
    if config["model_kind"] == "cross_layer_transcoder":
        transcoders = load_clt(set_dir, scan="tiny", lazy_decoder=False, **hooks, **common)
    else:
        files = sorted(Path(set_dir).glob("layer_*.safetensors"), key=lambda p: int(p.stem[6:]))
        transcoders = load_transcoder_set(
            {i: str(p) for i, p in enumerate(files)},
            scan="tiny",
            lazy_decoder=False,
            **hooks,
            **common,
        )
    model = ReplacementModel.from_pretrained_and_transcoders(
        model_dir, transcoders, backend="nnsight", device=torch.device("cpu"), dtype=torch.float32
    )
    ids = torch.tensor(json.loads(ids_json))
    graph = attribute(ids, model, attribution_targets=torch.tensor([int(target)]), batch_size=64)
    Path(out).write_text(
        json.dumps(
            {
                "input_tokens": graph.input_tokens.tolist(),
                "active_features": graph.active_features.tolist(),
                "selected_features": graph.selected_features.tolist(),
                "activation_values": graph.activation_values.tolist(),
                "adjacency": graph.adjacency_matrix.tolist(),
                "n_layers": int(graph.cfg.n_layers),
                "logit_probability": graph.logit_probabilities.tolist(),
            }
        )
    )


if __name__ == "__main__":
    main()
