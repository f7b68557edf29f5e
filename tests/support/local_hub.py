"""A stand-in for the Hugging Face hub on 127.0.0.1, serving one repository's files as the hub's
HTTP API does (model info, file HEAD and GET by revision), so downloads run through
huggingface_hub for real with no network. Point a process at it with HF_ENDPOINT=hub.url."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


class LocalHub:
    """`repo_id` holding the files of `folder` at one commit; `requests` lists the paths asked
    for."""

    def __init__(self, repo_id: str, folder: Path):
        self.repo_id, self.folder, self.requests = repo_id, folder, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        """Model info at /api/models/{repo}[/revision/{rev}]; a file at
        /{repo}/resolve/{rev}/{name}."""
        path = unquote(handler.path.split("?")[0])
        self.requests.append(f"{handler.command} {path}")
        if path.startswith(f"/api/models/{self.repo_id}"):
            files = sorted(p.name for p in self.folder.iterdir() if p.is_file())
            info = {
                "id": self.repo_id,
                "modelId": self.repo_id,
                "sha": COMMIT,
                "private": False,
                "siblings": [{"rfilename": name} for name in files],
            }
            return self.send(
                handler, json.dumps(info).encode(), {"Content-Type": "application/json"}, body
            )
        prefix = f"/{self.repo_id}/resolve/"
        if path.startswith(prefix):
            _, _, name = path[len(prefix) :].partition("/")
            file = self.folder / name
            if file.is_file():
                data = file.read_bytes()
                etag = hashlib.sha256(data).hexdigest()
                headers = {
                    "X-Repo-Commit": COMMIT,
                    "ETag": f'"{etag}"',
                    "Content-Type": "application/octet-stream",
                }
                return self.send(handler, data, headers, body)
        handler.send_response(404)
        handler.send_header("X-Error-Code", "EntryNotFound")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    @staticmethod
    def send(
        handler: BaseHTTPRequestHandler, data: bytes, headers: dict[str, str], body: bool
    ) -> None:
        handler.send_response(200)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
