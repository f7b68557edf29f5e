"""An OpenAI-compatible chat completions endpoint on 127.0.0.1 that plays an explainer: explainer
chats get a fixed `[EXPLANATION]: pattern N` answer (a random-weight model writes none), detection
and fuzzing chats (asked with logprobs) `[1]` at P = 0.7; it records what it was asked (explainer
chats in `asked`, scorer chats in `scored`) and can be told to fail, to write no explanation line,
or to hold its answers until released. What tests put under it is millm's explaining job, not the
explainer's wit."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Explainer:
    """A chat completions endpoint: explainer chats get `[EXPLANATION]: pattern N`, detection
    chats (asked with logprobs) `[1]` at P = 0.7; past `fail_after` explanations it answers 500;
    while `silent`, its explainer answers carry no `[EXPLANATION]:` line; while `hold` is an
    unset event, explainer chats wait for it (a job that stays running until a test lets it go)."""

    def __init__(self):
        self.asked: list[dict] = []
        self.scored: list[dict] = []
        self.fail_after: int | None = None
        self.silent = False
        self.hold: threading.Event | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                explaining = not body.get("logprobs")
                if explaining:
                    if outer.hold is not None:
                        outer.hold.wait(60)
                    outer.asked.append(body)
                    if outer.fail_after is not None and len(outer.asked) > outer.fail_after:
                        self.send_response(500)
                        self.end_headers()
                        self.wfile.write(b"out of credit")
                        return
                    content = "Thinking."
                    if not outer.silent:
                        content += f"\n[EXPLANATION]: pattern {len(outer.asked)}"
                    logprobs = None
                else:
                    outer.scored.append(body)
                    content = "[1]"
                    top = [
                        {"token": "1", "logprob": math.log(0.7)},
                        {"token": "0", "logprob": math.log(0.3)},
                    ]
                    logprobs = {
                        "content": [
                            {"token": "[", "logprob": 0.0, "top_logprobs": []},
                            {"token": "1", "logprob": math.log(0.7), "top_logprobs": top},
                        ]
                    }
                answer = {
                    "choices": [
                        {"message": {"role": "assistant", "content": content}, "logprobs": logprobs}
                    ]
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
