"""A small OpenAI-compatible completion server: the stand-in for vLLM (seed document 001).

For machines without vLLM (or without the gated weights). It serves
`POST /v1/completions` (streamed as server-sent events, or whole), `GET /health`
and `GET /v1/models` with the fields `vllm bench serve` and orch's load
generator read, and generates tokens greedily with a GPT-style decoder that has
random weights: PyTorch on the GPUs when they are there (one model replica per
GPU, each in its own process serving the same port; `--gpus N` like vLLM's
tensor-parallel size), else NumPy on the CPU.

Like vLLM it batches continuously: each replica has one engine thread that
admits waiting requests into free slots of a key/value cache (`--max-batch`
sequences of up to `--max-len` tokens), runs their prefill, then decodes one
token for every live sequence per step, so GPU time, not the HTTP loop, bounds
the throughput.

The two switches below are what the suite's human and agent patches change
(`patches/human.patch`, `patches/agent.patch`): the 3-way comparison measures
the same server before and after each patch.
- human: attention reads the cache only up to the longest live sequence
  instead of all `--max-len` positions (masked): the same tokens, less memory
  traffic per decode step.
- agent: also attends only to the last 32 positions of each sequence (a
  "sliding window" the model was not built for): faster still, and its
  answers differ, which the comparison's output check catches.

    python3 server.py --port 8000 --gpus 2
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ATTEND_LIVE_ONLY = False  # baseline: every decode step attends over all --max-len cache positions (masked)
ATTENTION_WINDOW = None  # None: every earlier position; N: only the last N


class NumpyOps:
    def __init__(self):
        import numpy as np

        self.np = np
        self.name = f"numpy {np.__version__} on cpu"

    def weights(self, shape, rng_seed, std):
        rng = self.np.random.default_rng(rng_seed)
        return (rng.standard_normal(shape, dtype=self.np.float32) * std).astype(self.np.float32)

    def zeros(self, shape):
        return self.np.zeros(shape, dtype=self.np.float32)

    def ints(self, xs):
        return self.np.asarray(xs, dtype=self.np.int64)

    def mean(self, x):
        return x.mean(-1, keepdims=True)

    def softmax(self, x):
        e = self.np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def tanh(self, x):
        return self.np.tanh(x)

    def masked(self, x, mask):
        return self.np.where(mask, self.np.float32(-1e9), x)

    def arange(self, n):
        return self.np.arange(n)

    def argmax_rows(self, x):
        return [int(i) for i in x.argmax(-1)]

    def sync(self):
        pass


class TorchOps:
    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.dtype = torch.float32
        torch.backends.cuda.matmul.allow_tf32 = False
        self.name = f"torch {torch.__version__} on {torch.cuda.get_device_name(self.device)} ({self.dtype})"

    def weights(self, shape, rng_seed, std):
        g = self.torch.Generator(device=self.device).manual_seed(rng_seed)
        return self.torch.randn(shape, generator=g, device=self.device, dtype=self.dtype) * std

    def zeros(self, shape):
        return self.torch.zeros(shape, device=self.device, dtype=self.dtype)

    def ints(self, xs):
        return self.torch.tensor(xs, device=self.device, dtype=self.torch.int64)

    def mean(self, x):
        return x.mean(-1, keepdim=True)

    def softmax(self, x):
        return self.torch.softmax(x, dim=-1)

    def tanh(self, x):
        return self.torch.tanh(x)

    def masked(self, x, mask):
        return x.masked_fill(mask, -1e9)

    def arange(self, n):
        return self.torch.arange(n, device=self.device)

    def argmax_rows(self, x):
        return x.argmax(-1).tolist()

    def sync(self):
        self.torch.cuda.synchronize(self.device)


class Decoder:
    """GPT-style decoder over a slotted key/value cache: `prefill` one
    sequence into a slot, `decode` one token for several slots at once."""

    def __init__(self, ops, d, layers, heads, vocab, max_len, max_batch):
        self.ops, self.d, self.h, self.vocab, self.max_len = ops, d, heads, vocab, max_len
        seed = iter(range(1 << 30))
        # 4 / sqrt(d): large enough that answers depend on the prompt (with
        # small random weights every prompt decodes to one repeated token).
        w = lambda *s, std=4 / d**0.5: ops.weights(s, next(seed), std)  # noqa: E731
        self.wte, self.wpe, self.head = w(vocab, d), w(max_len, d, std=0.01), w(d, vocab)
        self.layers = [
            {"qkv": w(d, 3 * d), "o": w(d, d), "fc1": w(d, 4 * d), "fc2": w(4 * d, d)} for _ in range(layers)
        ]
        dh = d // heads
        self.k = [ops.zeros((max_batch, heads, max_len, dh)) for _ in range(layers)]
        self.v = [ops.zeros((max_batch, heads, max_len, dh)) for _ in range(layers)]
        ops.sync()

    def _ln(self, x):
        m = self.ops.mean(x)
        v = self.ops.mean((x - m) * (x - m))
        return (x - m) / (v + 1e-5) ** 0.5

    def _gelu(self, x):
        return 0.5 * x * (1 + self.ops.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    def _mlp(self, x, p):
        return x + self._gelu(self._ln(x) @ p["fc1"]) @ p["fc2"]

    def prefill(self, slot, ids):
        """Run a prompt into `slot` of the cache; the next token's id."""
        ops, d, h = self.ops, self.d, self.h
        t, dh = len(ids), d // h
        x = self.wte[ops.ints(ids)] + self.wpe[0:t]
        pos = ops.arange(t)
        # Causal, and with a window only the last ATTENTION_WINDOW positions.
        mask = pos[None, :] > pos[:, None]
        if ATTENTION_WINDOW is not None:
            mask = mask | (pos[None, :] <= pos[:, None] - ATTENTION_WINDOW)
        for i, p in enumerate(self.layers):
            qkv = self._ln(x) @ p["qkv"]
            q, k, v = (qkv[:, j * d : (j + 1) * d].reshape(t, h, dh).swapaxes(0, 1) for j in range(3))
            self.k[i][slot, :, :t] = k
            self.v[i][slot, :, :t] = v
            s = ops.masked((q @ k.swapaxes(1, 2)) * (1.0 / dh**0.5), mask)
            a = (ops.softmax(s) @ v).swapaxes(0, 1)
            x = x + a.reshape(t, d) @ p["o"]
            x = self._mlp(x, p)
        return ops.argmax_rows(self._ln(x[-1:]) @ self.head)[0]

    def decode(self, slots, tokens, lengths):
        """One step for the sequences in `slots` (`tokens` their last token,
        `lengths` the positions already cached): each one's next token id."""
        ops, d, h = self.ops, self.d, self.h
        b, dh = len(slots), d // h
        idx, pos = ops.ints(slots), ops.ints(lengths)
        x = self.wte[ops.ints(tokens)] + self.wpe[pos]
        # The cache span one step reads: the slots up to the highest live one,
        # and all positions (baseline) or only those any live sequence has.
        hi = max(slots) + 1
        span = max(lengths) + 1 if ATTEND_LIVE_ONLY else self.max_len
        lo = 0
        if ATTENTION_WINDOW is not None:
            lo = max(0, min(lengths) + 1 - ATTENTION_WINDOW)
        cols = ops.arange(span)[lo:]
        mask = self._mask(slots, lengths, hi, cols)
        for i, p in enumerate(self.layers):
            qkv = self._ln(x) @ p["qkv"]
            q, k, v = (qkv[:, j * d : (j + 1) * d].reshape(b, h, 1, dh) for j in range(3))
            self.k[i][idx, :, pos] = k[:, :, 0]
            self.v[i][idx, :, pos] = v[:, :, 0]
            kk = self.k[i][:hi, :, lo:span]
            vv = self.v[i][:hi, :, lo:span]
            qq = ops.zeros((hi, h, 1, dh))
            qq[idx] = q
            s = (qq @ kk.swapaxes(2, 3)) * (1.0 / dh**0.5)
            s = ops.masked(s, mask)
            a = (ops.softmax(s) @ vv)[idx]
            x = x + a.reshape(b, d) @ p["o"]
            x = self._mlp(x, p)
        return ops.argmax_rows(self._ln(x) @ self.head)

    def _mask(self, slots, lengths, hi, cols):
        """[hi, 1, 1, cols]: True where a slot's row must not look (beyond its
        length, before its window, or a slot with no live sequence)."""
        ops = self.ops
        length = [-1] * hi
        for s, n in zip(slots, lengths):
            length[s] = n
        n = ops.ints(length)[:, None]
        m = cols[None, :] > n
        if ATTENTION_WINDOW is not None:
            m = m | (cols[None, :] <= n - ATTENTION_WINDOW)
        return m[:, None, None, :]


class Sequence:
    """A request in the engine. Its tokens go to `sink` (a callable the
    engine thread calls with each new token id) as they are made: streamed
    answers are written to the client's socket from the engine thread
    itself, so a decode step wakes no thread per token (hundreds of handler
    threads waking per step would starve the engine of the GIL). `finished`
    is set when the last token is out, or `error` when the step failed."""

    def __init__(self, ids, n, sink):
        self.ids, self.n, self.sink = ids, n, sink
        self.finished = threading.Event()
        self.error = None
        self.done = 0
        self.slot = None
        self.length = 0
        self.last = None


class Engine:
    """One decoder and the thread that batches its requests continuously."""

    def __init__(self, model, max_batch):
        self.model, self.max_batch = model, max_batch
        self.waiting = []
        self.live = {}
        self.cv = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def load(self):
        with self.cv:
            return len(self.waiting) + len(self.live)

    def submit(self, seq):
        with self.cv:
            self.waiting.append(seq)
            self.cv.notify()

    def _emit(self, seq, tok):
        seq.done += 1
        seq.last = tok
        try:
            seq.sink(tok, seq.done >= seq.n)
        except OSError:  # the client left: the sequence goes on, unseen
            seq.sink = lambda tok, last: None
        if seq.done >= seq.n:
            del self.live[seq.slot]
            seq.finished.set()

    def _loop(self):
        m = self.model
        while True:
            with self.cv:
                while not self.waiting and not self.live:
                    self.cv.wait()
                admit = []
                free = [s for s in range(self.max_batch) if s not in self.live]
                while self.waiting and free:
                    seq = self.waiting.pop(0)
                    seq.slot = free.pop(0)
                    self.live[seq.slot] = seq
                    admit.append(seq)
            try:
                for seq in admit:
                    seq.length = len(seq.ids)
                    self._emit(seq, m.prefill(seq.slot, seq.ids))
                step = [s for s in self.live.values() if s.done < s.n]
                if step:
                    toks = m.decode([s.slot for s in step], [s.last for s in step], [s.length for s in step])
                    for s, t in zip(step, toks):
                        s.length += 1
                        self._emit(s, t)
            except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                print(f"engine step failed: {e!r}", file=sys.stderr, flush=True)
                for s in list(self.live.values()):
                    s.error = e
                    s.finished.set()
                self.live.clear()


def token_text(tok):
    return f" t{tok}"


def make_handler(engines, model_name, max_len):
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
                n = max(1, int(req.get("max_tokens", 16)))
            except (ValueError, KeyError, TypeError) as e:
                self._json(400, {"error": {"message": f"bad request: {e}"}})
                return
            if n >= max_len:
                self._json(400, {"error": {"message": f"max_tokens {n} does not fit --max-len {max_len}"}})
                return
            # Bytes are tokens; the prompt's start is cut to fit the cache.
            ids = (list(prompt.encode("utf-8")) or [0])[-(max_len - n) :]
            rid, created = f"cmpl-{time.monotonic_ns()}", int(time.time())
            usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
            stream = bool(req.get("stream"))
            head = json.dumps({"id": rid, "object": "text_completion", "created": created, "model": model_name})[:-1]
            pieces = []

            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.flush()
                self.close_connection = True
                sock = self.connection

                def sink(tok, last):
                    # One SSE event per token, written by the engine thread.
                    reason = '"length"' if last else "null"
                    sock.sendall(f'data: {head}, "choices": [{{"index": 0, "text": "{token_text(tok)}", '
                                 f'"finish_reason": {reason}}}]}}\n\n'.encode())
            else:

                def sink(tok, last):
                    pieces.append(token_text(tok))

            seq = Sequence(ids, n, sink)
            min(engines, key=lambda e: e.load()).submit(seq)
            seq.finished.wait()
            try:
                if seq.error is not None:
                    if stream:
                        return  # the stream is cut short: the client sees the error
                    self._json(500, {"error": {"message": f"generation failed: {seq.error!r}"}})
                    return
                if not stream:
                    self._json(200, {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                                     "choices": [{"index": 0, "text": "".join(pieces), "finish_reason": "length"}],
                                     "usage": usage})
                    return
                if (req.get("stream_options") or {}).get("include_usage"):
                    body = {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                            "choices": [], "usage": usage}
                    self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler


def serve(a, ops):
    """One process: its replicas, then the HTTP server (with `--reuse-port`,
    one of several processes sharing the port; the kernel spreads the
    connections)."""
    t0 = time.perf_counter()
    engines = [
        Engine(Decoder(o, a.d_model, a.layers, a.heads, a.vocab, a.max_len, a.max_batch), a.max_batch) for o in ops
    ]
    print(f"{len(engines)} replica(s), {ops[0].name}, batches of up to {a.max_batch}, "
          f"attention over {'live positions' if ATTEND_LIVE_ONLY else 'the whole cache'}"
          f"{'' if ATTENTION_WINDOW is None else f', window {ATTENTION_WINDOW}'}, "
          f"loaded in {time.perf_counter() - t0:.1f}s", flush=True)
    if a.replica is not None:
        # Bind only when every replica is loaded, so none takes all the first requests.
        sys.stdin.readline()

    class Server(ThreadingHTTPServer):
        request_queue_size = 1024  # the default backlog of 5 resets a burst of clients
        daemon_threads = True

        def server_bind(self):
            if a.replica is not None:
                import socket

                self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

    server = Server((a.host, a.port), make_handler(engines, a.model, a.max_len))
    print(f"serving on http://{a.host}:{a.port}", flush=True)
    server.serve_forever()


def spawn_replicas(a, count):
    """One process per GPU (each its own Python, so no GIL is shared between
    GPUs), all serving the same port; stops them all when one stops."""
    import signal
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(count)]
    args = [x for x in sys.argv[1:]]
    procs = []
    for i in range(count):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=ids[i])
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *args, "--replica", str(i)],
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))

    def stop(*_):
        for p in procs:
            if p.poll() is None:
                p.terminate()
        sys.exit(1)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i, p in enumerate(procs):
        line = p.stdout.readline()
        if not line:
            print(f"replica {i} failed while loading (exit {p.wait()})", file=sys.stderr, flush=True)
            stop()
        print(f"replica {i} (GPU {ids[i]}): {line.strip()}", flush=True)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for i, p in enumerate(procs):
        print(f"replica {i}: {p.stdout.readline().strip()}", flush=True)

    def relay(i, p):
        for line in p.stdout:
            print(f"replica {i}: {line.rstrip()}", flush=True)

    for i, p in enumerate(procs):
        threading.Thread(target=relay, args=(i, p), daemon=True).start()
    while True:
        for i, p in enumerate(procs):
            code = p.poll()
            if code is not None:
                print(f"replica {i} exited with {code}; stopping the others", file=sys.stderr, flush=True)
                stop()
        time.sleep(0.5)


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
    ap.add_argument("--max-batch", type=int, default=32, help="sequences decoded together per replica")
    ap.add_argument("--cpu", action="store_true", help="NumPy on the CPU even when GPUs are there")
    ap.add_argument("--replica", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.replica is not None:
        serve(a, [TorchOps("cuda:0")])
        return
    if a.gpus > 1 and not a.cpu:
        # One process per GPU; this one needs no torch (importing it costs
        # seconds of every start): a replica that finds no GPU fails the start.
        spawn_replicas(a, a.gpus)
        return
    try:
        import torch

        gpus = torch.cuda.device_count() if not a.cpu else 0
    except ImportError:
        gpus = 0
    if a.gpus and a.gpus > gpus:
        sys.exit(f"error: --gpus {a.gpus} asked for, {gpus} visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})")
    count = a.gpus or gpus
    if count > 1:
        spawn_replicas(a, count)
        return
    serve(a, [TorchOps("cuda:0")] if count == 1 else [NumpyOps()])


if __name__ == "__main__":
    main()
