"""--model owner/name:QUANT: one file of a hub repository of GGUF files is downloaded (from a
stand-in hub on 127.0.0.1, through huggingface_hub), served under that name, and found again in
the cache by an offline restart; another registered over HTTP beside it."""

from __future__ import annotations

import shutil

import httpx

from tests.api.clients import error, post
from tests.support.local_hub import LocalHub
from tests.support.server import ServerProcess

MODEL = "acme/tiny-llama-GGUF:Q8_0"


def test_one_quantisation_is_downloaded_served_and_found_offline_later(tiny_gguf, tmp_path):
    files = tmp_path / "repo"
    files.mkdir()
    for name in ("tiny-llama.F32.gguf", "tiny-llama.Q8_0.gguf"):
        shutil.copy(tiny_gguf.parent / name, files / name)
    (files / "README.md").write_text("two quantisations of the tiny Llama\n")
    home = tmp_path / "home"
    args = ["--model", "acme/tiny-llama-GGUF:q8_0", "--engine", "llama.cpp"]
    with LocalHub("acme/tiny-llama-GGUF", files) as hub:
        server = ServerProcess(
            home,
            args,
            env={"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf")},
        )
        try:
            server.wait_ready()
            assert [m["id"] for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]] == [
                MODEL
            ]
            answer = post(
                server,
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            )
            assert answer.status_code == 200 and answer.json()["system_fingerprint"].endswith(
                "/Q8_0:llama.cpp"
            ), answer.text
            # over HTTP: a hub id, never a path
            registered = post(server, "/api/models", {"source": "acme/tiny-llama-GGUF:F32"})
            assert (
                registered.status_code == 201
                and registered.json()["id"] == "acme/tiny-llama-GGUF:F32"
            ), registered.text
            bare = {
                "model": "acme/tiny-llama-GGUF",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            }
            error(post(server, "/v1/chat/completions", bare), 400, "AMBIGUOUS_MODEL_NAME")
        finally:
            server.stop()
        downloads = [
            line for line in hub.requests if line.startswith("GET") and "/resolve/" in line
        ]
        assert downloads == [
            f"GET /acme/tiny-llama-GGUF/resolve/main/tiny-llama.{tag}.gguf"
            for tag in ("Q8_0", "F32")
        ]  # those files only
    # The hub is gone and the process offline: the download is found in MILLM_HOME/hub.
    server = ServerProcess(home, args, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    try:
        server.wait_ready()
        assert {m["id"] for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]} == {
            MODEL,
            "acme/tiny-llama-GGUF:F32",
        }
    finally:
        server.stop()
