"""--reproducible's promise, tried on one machine: the tiny Llama's logits and greedy tokens are
equal bit for bit under every instruction-set cap torch, oneDNN and MKL honour (each run a new
interpreter, since the caps are read at the libraries' first operation), and at one and two
threads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAPS = {
    "none": {},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "sse4.2, one thread": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "OMP_NUM_THREADS": "1",
    },
}
# Loads the checkpoint as the server does under --reproducible, prefills a prompt and decodes 24
# greedy tokens; prints a digest of every logit it saw and the tokens.
SCRIPT = """
import hashlib, sys
from pathlib import Path
from millm.engine.numerics import fix_cpu_numerics
fix_cpu_numerics()
import torch
from millm.engine.loader import load_model
from millm.engine.sources import resolve_source
lm = load_model(resolve_source(sys.argv[1], Path(sys.argv[2])), dtype="float32", device="cpu",
                cache_root=Path(sys.argv[2]), reproducible=True)
prompt = lm.tokenizer("A river becomes the city of France and the cat runs quickly.")["input_ids"]
digest, tokens = hashlib.sha256(), []
with torch.inference_mode():
    batch, logits = lm.runner.prefill([prompt], len(prompt) + 32)
    for _ in range(24):
        digest.update(logits.float().numpy().tobytes())
        tokens.append(int(logits[0].argmax()))
        logits = lm.runner.step(batch, torch.tensor([tokens[-1]]))
print(lm.runner.kernels, digest.hexdigest(), tokens)
"""


@pytest.fixture(scope="module")
def runs(tiny_dirs, tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("reproducible")
    out = {}
    for name, caps in CAPS.items():
        environment = {**os.environ, "HF_HUB_OFFLINE": "1", **caps}
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tiny_dirs["llama"]), str(home)],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        out[name] = result.stdout.strip().splitlines()[-1]
    return out


def test_logits_are_equal_bit_for_bit_under_every_cap(runs):
    assert len(set(runs.values())) == 1, runs
    assert next(iter(runs.values())).startswith("dense x"), runs  # no pre-packed (oneDNN) kernel
