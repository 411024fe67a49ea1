"""A small OpenAI-compatible completion server: the stand-in for vLLM (seed document 001).

For machines without vLLM (or without the gated weights). It serves
`POST /v1/completions` (streamed as server-sent events, or whole), `GET /health`
and `GET /v1/models` with the fields `vllm bench serve` and orch's load
generator read, and generates tokens greedily with a GPT-style decoder that has
random weights: PyTorch on the GPUs when they are there (one model replica per
GPU, requests spread over them; `--gpus N` like vLLM's tensor-parallel size),
else NumPy on the CPU.

The two switches below are what the suite's human and agent patches change
(`patches/human.patch`, `patches/agent.patch`): the 3-way comparison measures
the same server before and after each patch.

    python3 server.py --port 8000 --gpus 2
"""

import argparse
import itertools
import json
import math
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USE_KV_CACHE = False  # baseline: every new token recomputes the whole sequence
HALF_PRECISION = False  # bf16 weights and activations on GPUs


class NumpyOps:
    def __init__(self):
        import numpy as np

        self.np = np
        self.name = f"numpy {np.__version__} on cpu"

    def weights(self, shape, rng_seed, std):
        rng = self.np.random.default_rng(rng_seed)
        return (rng.standard_normal(shape, dtype=self.np.float32) * std).astype(self.np.float32)

    def tensor(self, ids):
        return self.np.asarray(ids, dtype=self.np.int64)

    def mean(self, x):
        return x.mean(-1, keepdims=True)

    def cat(self, xs, axis):
        return self.np.concatenate(xs, axis=axis)

    def softmax(self, x):
        e = self.np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def tanh(self, x):
        return self.np.tanh(x)

    def triu_mask(self, t, offset):
        return self.np.triu(self.np.ones((t, t + offset), dtype=bool), k=1 + offset)

    def argmax(self, x):
        return int(x.argmax())

    def sync(self):
        pass


class TorchOps:
    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.dtype = torch.bfloat16 if HALF_PRECISION else torch.float32
        self.name = f"torch {torch.__version__} on {torch.cuda.get_device_name(self.device)} ({self.dtype})"

    def weights(self, shape, rng_seed, std):
        g = self.torch.Generator(device=self.device).manual_seed(rng_seed)
        w = self.torch.randn(shape, generator=g, device=self.device, dtype=self.torch.float32) * std
        return w.to(self.dtype)

    def tensor(self, ids):
        return self.torch.tensor(ids, device=self.device)

    def mean(self, x):
        return x.mean(-1, keepdim=True)

    def cat(self, xs, axis):
        return self.torch.cat(xs, dim=axis)

    def softmax(self, x):
        return self.torch.softmax(x.float(), dim=-1).to(x.dtype)

    def tanh(self, x):
        return self.torch.tanh(x)

    def triu_mask(self, t, offset):
        return self.torch.ones((t, t + offset), dtype=self.torch.bool, device=self.device).triu(1 + offset)

    def argmax(self, x):
        return int(x.argmax())

    def sync(self):
        self.torch.cuda.synchronize(self.device)


class Decoder:
    """GPT-style decoder, batch of one sequence, optional key/value cache."""

    def __init__(self, ops, d, layers, heads, vocab, max_len):
        self.ops, self.d, self.h, self.vocab, self.max_len = ops, d, heads, vocab, max_len
        seed = itertools.count()
        w = lambda *s, std=0.02: ops.weights(s, next(seed), std)  # noqa: E731
        self.wte, self.wpe, self.head = w(vocab, d), w(max_len, d, std=0.01), w(d, vocab)
        self.layers = [
            {"qkv": w(d, 3 * d), "o": w(d, d), "fc1": w(d, 4 * d), "fc2": w(4 * d, d)} for _ in range(layers)
        ]
        ops.sync()

    def _ln(self, x):
        m = self.ops.mean(x)
        v = self.ops.mean((x - m) * (x - m))
        return (x - m) / (v + 1e-5) ** 0.5

    def _gelu(self, x):
        return 0.5 * x * (1 + self.ops.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    def forward(self, ids, pos, cache):
        """Logits of the last position of `ids` (tokens at `pos`...); `cache`
        holds each layer's keys and values of the earlier positions, or is None."""
        ops, d, h = self.ops, self.d, self.h
        t = len(ids)
        x = self.wte[ops.tensor(ids)] + self.wpe[pos : pos + t]
        for i, p in enumerate(self.layers):
            qkv = self._ln(x) @ p["qkv"]
            q, k, v = (qkv[:, j * d : (j + 1) * d].reshape(t, h, d // h).swapaxes(0, 1) for j in range(3))
            if cache is not None:
                if cache[i] is not None:
                    k, v = ops.cat([cache[i][0], k], 1), ops.cat([cache[i][1], v], 1)
                cache[i] = (k, v)
            s = (q @ k.swapaxes(1, 2)) * (1.0 / math.sqrt(d // h))
            s[:, ops.triu_mask(t, k.shape[1] - t)] = -1e9
            a = (ops.softmax(s) @ v).swapaxes(0, 1)
            x = x + a.reshape(t, d) @ p["o"]
            x = x + self._gelu(self._ln(x) @ p["fc1"]) @ p["fc2"]
        return self._ln(x[-1:]) @ self.head

    def generate(self, ids, n):
        """Yield `n` greedy token ids."""
        ids = list(ids)[-max(1, self.max_len - n) :]
        cache = [None] * len(self.layers) if USE_KV_CACHE else None
        new, pos = ids, 0
        for _ in range(n):
            logits = self.forward(new, pos, cache)
            tok = self.ops.argmax(logits)
            yield tok
            if USE_KV_CACHE:
                pos += len(new)
                new = [tok]
            else:
                new = new + [tok]


class Replicas:
    """One decoder per device; a request takes the first free one."""

    def __init__(self, models):
        self.free = list(models)
        self.cv = threading.Condition()

    def acquire(self):
        with self.cv:
            while not self.free:
                self.cv.wait()
            return self.free.pop()

    def release(self, m):
        with self.cv:
            self.free.append(m)
            self.cv.notify()


def token_text(tok):
    return f" t{tok}"


def make_handler(replicas, model_name):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
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
                self._json(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path != "/v1/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                prompt = req["prompt"]
                n = int(req.get("max_tokens", 16))
            except (ValueError, KeyError, TypeError) as e:
                self._json(400, {"error": {"message": f"bad request: {e}"}})
                return
            ids = list(prompt.encode("utf-8")) or [0]
            rid, created = f"cmpl-{time.monotonic_ns()}", int(time.time())
            usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
            model = replicas.acquire()
            try:
                if not req.get("stream"):
                    text = "".join(token_text(t) for t in model.generate(ids, n))
                    self._json(200, {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                                     "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

                def send(obj):
                    self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
                    self.wfile.flush()

                for i, t in enumerate(model.generate(ids, n)):
                    send({"id": rid, "object": "text_completion", "created": created, "model": model_name,
                          "choices": [{"index": 0, "text": token_text(t), "finish_reason": "length" if i == n - 1 else None}]})
                if (req.get("stream_options") or {}).get("include_usage"):
                    send({"id": rid, "object": "text_completion", "created": created, "model": model_name, "choices": [], "usage": usage})
                send(b"[DONE]")
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                replicas.release(model)

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--gpus", type=int, default=0, help="model replicas, one per GPU (0: every visible GPU)")
    ap.add_argument("--model", default="standin", help="the name served in `model`")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--cpu", action="store_true", help="NumPy on the CPU even when GPUs are there")
    a = ap.parse_args()

    try:
        import torch

        gpus = torch.cuda.device_count() if not a.cpu else 0
    except ImportError:
        gpus = 0
    if a.gpus and a.gpus > gpus:
        sys.exit(f"error: --gpus {a.gpus} asked for, {gpus} visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})")
    count = a.gpus or gpus
    ops = [TorchOps(f"cuda:{i}") for i in range(count)] or [NumpyOps()]
    t0 = time.perf_counter()
    models = [Decoder(o, a.d_model, a.layers, a.heads, a.vocab, a.max_len) for o in ops]
    print(f"{len(models)} replica(s), {ops[0].name}, kv cache {'on' if USE_KV_CACHE else 'off'}, "
          f"loaded in {time.perf_counter() - t0:.1f}s", flush=True)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(Replicas(models), a.model))
    server.daemon_threads = True
    print(f"serving on http://{a.host}:{a.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
