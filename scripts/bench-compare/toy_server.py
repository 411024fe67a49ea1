#!/usr/bin/env python3
"""A toy OpenAI-compatible server whose tokens cost CPU work, for measuring
orch's comparisons (scripts/bench-compare.sh, crates/orch/tests/it/workloads/compare_check.rs).

    python3 toy_server.py PORT

Every generated token costs STEP_MS of device time (a sleep, as a GPU
kernel's time is to the host) and WORK iterations of an integer loop under
the GIL (the host side: scheduling, sampling, detokenising), so throughput is
set by the work per token and by how busy the machine is, like a real server
on a shared host. A patch that lowers both by 10% is a known ~10% effect; two
checkouts of the same commit are an A/A pair.

The answer is a function of the prompt (greedy decoding of a toy model):
token i is a word picked by a hash of the prompt and i. MODE plants the ways
a patch can game a timer (the benchmark and the tests patch this line):
  honest  the answer above;
  wrong   a wrong answer, twice as fast (a skipped layer, garbage);
  cache   answers kept per prompt (in memory and in `.answer-cache.json`
          across restarts): a prompt seen before costs nothing;
  early   stops after half the tokens, twice as fast, and still reports
          `max_tokens` in `usage`;
  cache_strip  the cache, keyed on the prompt with orch's nonce
          (` [nonce ...]`) cut out: it hits whenever a round repeats a
          prompt of an earlier one;
  early_long  answers asked for more than 32 tokens (longer than the
          output check's default) stop at half their length, and `usage`
          still reports `max_tokens` (issue 44's attack);
  early_stream  streamed answers stop at half their length (the output
          check asks without streaming and gets whole answers), `usage`
          still `max_tokens`;
  usage_lie  the right answer, with `usage.completion_tokens` 1.5 times the
          tokens generated (a token throughput read from `usage` rises).
Endpoints: /health, /v1/models, /v1/completions, /v1/chat/completions
(streaming or not).
"""
import json
import os
import re
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEP_MS = 4.0  # device time per generated token
WORK = 200  # host-side loop iterations per generated token
MODE = "honest"  # honest | wrong | cache | cache_strip | early | early_long | early_stream | usage_lie (see above)

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
CACHE_FILE = ".answer-cache.json"
CACHE_LOCK = threading.Lock()
try:
    CACHE = json.load(open(CACHE_FILE)) if MODE in ("cache", "cache_strip") else {}
except (OSError, ValueError):
    CACHE = {}


def generate_token(state, scale=1.0):
    time.sleep(STEP_MS * scale / 1000)
    x = state
    for i in range(int(WORK * scale)):
        x = (x * 1103515245 + 12345 + i) & 0x7FFFFFFF
    return x


def word(prompt, i):
    return WORDS[zlib.crc32(f"{prompt}\x00{i}".encode()) % len(WORDS)]


def cache_key(prompt, tokens):
    if MODE == "cache_strip":
        prompt = re.sub(r" \[nonce [^\]]*\]", "", prompt)
    return f"{tokens}:{prompt}"


def answer(prompt, tokens, stream=False):
    """The generated pieces (each ' word'): generated one by one, with their cost."""
    if MODE in ("cache", "cache_strip"):
        with CACHE_LOCK:
            hit = CACHE.get(cache_key(prompt, tokens))
        if hit is not None:
            yield from hit
            return
    out = []
    cut = MODE == "early" or (MODE == "early_long" and tokens > 32) or (MODE == "early_stream" and stream)
    n = tokens // 2 if cut else tokens
    scale = 0.5 if MODE in ("wrong", "early") else 1.0
    state = len(prompt)
    for i in range(n):
        state = generate_token(state, scale)
        piece = " " + (WORDS[i % 3] if MODE == "wrong" else word(prompt, i))
        out.append(piece)
        yield piece
    if MODE in ("cache", "cache_strip"):
        with CACHE_LOCK:
            CACHE[cache_key(prompt, tokens)] = out
            tmp = CACHE_FILE + ".tmp"
            json.dump(CACHE, open(tmp, "w"))
            os.replace(tmp, CACHE_FILE)


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
        prompt = req.get("prompt") or "\n".join(m.get("content", "") for m in req.get("messages", []))
        claimed = int(tokens * 1.5) if MODE == "usage_lie" else tokens
        usage = {"completion_tokens": claimed, "prompt_tokens": len(str(prompt).split())}
        if not req.get("stream"):
            text = "".join(answer(str(prompt), tokens))
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            return self._json(200, {"choices": [choice], "usage": usage})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in answer(str(prompt), tokens, stream=True):
            choice = {"delta": {"content": piece}} if chat else {"text": piece}
            self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()


if __name__ == "__main__":
    port = int(sys.argv[1])
    print(f"INFO: toy server on http://127.0.0.1:{port}", flush=True)
    ThreadingHTTPServer.request_queue_size = 1024
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
