#!/usr/bin/env python3
"""A toy OpenAI-compatible server whose tokens cost CPU work, for measuring
orch's comparisons (scripts/bench-compare.sh).

    python3 toy_server.py PORT

Every generated token costs STEP_MS of device time (a sleep, as a GPU
kernel's time is to the host) and WORK iterations of an integer loop under
the GIL (the host side: scheduling, sampling, detokenising), so throughput is
set by the work per token and by how busy the machine is, like a real server
on a shared host. A patch that lowers both by 10% is a known ~10% effect; two
checkouts of the same commit are an A/A pair.
Endpoints: /health, /v1/models, /v1/completions, /v1/chat/completions
(streaming or not).
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEP_MS = 4.0  # device time per generated token
WORK = 200  # host-side loop iterations per generated token


def generate_token(state):
    time.sleep(STEP_MS / 1000)
    x = state
    for i in range(WORK):
        x = (x * 1103515245 + 12345 + i) & 0x7FFFFFFF
    return x


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": "toy"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n) or b"{}")
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._json(404, {"error": "not found"})
        tokens = int(req.get("max_tokens", 16))
        state = len(json.dumps(req))
        if not req.get("stream"):
            for _ in range(tokens):
                state = generate_token(state)
            text = " tok" * tokens
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            return self._json(200, {"choices": [choice], "usage": {"completion_tokens": tokens}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(tokens):
            state = generate_token(state)
            choice = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
            self.wfile.flush()
        usage = {"choices": [], "usage": {"completion_tokens": tokens}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()


if __name__ == "__main__":
    port = int(sys.argv[1])
    print(f"INFO: toy server on http://127.0.0.1:{port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
