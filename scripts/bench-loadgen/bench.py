"""orch's load generator side by side with `vllm bench serve` and GuideLLM.

Every client runs, one at a time, against the same `fast-openai` server (a
Rust/hyper OpenAI-compatible server with known latencies, never the
bottleneck; its `usage.prompt_tokens` counted with the same tokenizer, as a
vLLM server counts them: `vllm bench serve` 0.33 takes that count when a
server sends it): see scripts/bench-loadgen.sh for how to run it.

1. agreement: the same 1,000 prompts (a JSONL file, the same tokenizer) at 32
   concurrent streams; token counts, TTFT, TPOT and throughput of orch and
   GuideLLM against `vllm bench serve`.
2. max_rate: offered request rates rising (constant intervals, tiny answers)
   until the client no longer keeps the schedule: the highest rate at which
   every request completed, the achieved rate was at least 90% of the
   offered one and the median schedule lag stayed under 1 ms; CPU seconds per
   request (the client's own process, imports excluded).
   Schedule lag: orch's `requests.jsonl` (`sent_s - scheduled_s`); GuideLLM's
   `request_dispatch_delay`; vllm (which does not record it) from its
   `start_times` with constant intervals: request i is due i / rate after
   request 0.
3. ttft_overhead: the server answers its first token after 20 ms; what each
   client measures above that at 1, 100 and 1,000 concurrent streams.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

SERVER_TTFT_MS = 20.0


class Server:
    def __init__(self, binary, ttft_ms, itl_ms, tokenizer):
        self.p = subprocess.Popen(
            [binary, "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--threads", "1", "--tokenizer", tokenizer],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.p.stdout.readline().strip()
        assert line.startswith("endpoint "), line
        self.url = line.split(" ", 1)[1]
        self.port = int(self.url.rsplit(":", 1)[1])

    def stats(self):
        with urllib.request.urlopen(self.url + "/stats") as r:
            return json.load(r)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait()


def median(xs):
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------- orch


def run_orch(a, work, name, prompts, n, out_len, rate, conc, ttft_ms, itl_ms):
    """One cell of the local backend: the agent starts `fast-openai` as the
    server workload and runs its load generator against it."""
    port = free_port()
    rate_yaml = "inf" if rate is None else str(rate)
    conc_yaml = "" if conc is None else f"\n          max_concurrency: {conc}"
    suite = f"""
name: bench-loadgen-{name}
benchmarks:
  - name: {name}
    workload:
      server:
        command: ["{a.server}", "--port", "{port}", "--ttft-ms", "{ttft_ms}", "--itl-ms", "{itl_ms}", "--threads", "1", "--tokenizer", "{a.tokenizer}/tokenizer.json"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen:
          model: fast
          endpoint: /v1/completions
          prompt_file: {prompts}
          tokenizer: {a.tokenizer}/tokenizer.json
          num_prompts: {n}
          output_len: {out_len}
          request_rate: {rate_yaml}
          burstiness: 1000000{conc_yaml}
"""
    path = os.path.join(work, f"orch-{name}.yaml")
    with open(path, "w") as f:
        f.write(suite)
    store = os.path.join(work, "store")
    r = subprocess.run(
        [a.orch, "run", "-f", path, "--store", store, "--json"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"orch run failed: {r.stderr[-2000:]}")
    rec = json.loads(r.stdout)
    cell = rec["cells"][0]
    m = cell["metrics"]
    cell_dir = os.path.join(store, rec["id"], "cells", cell["id"])
    lags = []
    with open(os.path.join(cell_dir, "requests.jsonl")) as f:
        for line in f:
            v = json.loads(line)
            lags.append((v["sent_s"] - v["scheduled_s"]) * 1000.0)
    saved = json.load(open(os.path.join(cell_dir, "loadgen.json")))
    return {
        "completed": m.get("completed"),
        "failed": m.get("failed"),
        "duration_s": m.get("duration"),
        "total_input_tokens": m.get("total_input_tokens"),
        "total_output_tokens": m.get("total_output_tokens"),
        "request_throughput": m.get("request_throughput"),
        "output_throughput": m.get("output_throughput"),
        "mean_ttft_ms": m.get("mean_ttft_ms"),
        "median_ttft_ms": m.get("median_ttft_ms"),
        "mean_tpot_ms": m.get("mean_tpot_ms"),
        "median_schedule_lag_ms": median(lags),
        "cpu_s": m.get("client_cpu_s"),
        "token_counts": saved.get("token_counts"),
    }


# ---------------------------------------------------------------- vllm

VLLM_WRAPPER = r"""
import json, os, resource, sys
import vllm.benchmarks.serve  # imports first: not counted
from vllm.entrypoints.cli.main import main
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime
if __name__ == "__main__":
    out = sys.argv.pop(1)
    c0 = cpu()
    try:
        main()
    finally:
        json.dump({"cpu_s": cpu() - c0}, open(out, "w"))
"""


def run_vllm(a, work, name, prompts, n, out_len, rate, conc, server):
    res = os.path.join(work, f"vllm-{name}.json")
    cpu_file = os.path.join(work, f"vllm-{name}.cpu.json")
    wrapper = os.path.join(work, "vllm_wrapper.py")
    with open(wrapper, "w") as f:
        f.write(VLLM_WRAPPER)
    cmd = [
        a.vllm_python, wrapper, cpu_file, "bench", "serve",
        "--backend", "openai", "--base-url", server.url, "--endpoint", "/v1/completions",
        "--model", "fast", "--tokenizer", a.tokenizer,
        "--dataset-name", "custom", "--dataset-path", prompts, "--disable-shuffle",
        "--skip-chat-template", "--custom-output-len", str(out_len),
        "--num-prompts", str(n),
        "--request-rate", "inf" if rate is None else str(rate),
        "--burstiness", "inf",
        "--save-result", "--save-detailed", "--result-filename", res, "--disable-tqdm",
    ]
    if conc is not None:
        cmd += ["--max-concurrency", str(conc)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(res):
        raise RuntimeError(f"vllm bench serve failed: {r.stderr[-3000:]}")
    d = json.load(open(res))
    starts = d.get("start_times") or []
    lags = []
    if rate is not None and starts:
        s0 = starts[0]
        lags = [((s - s0) - i / rate) * 1000.0 for i, s in enumerate(starts)]
        lags = [max(0.0, x) for x in lags]
    return {
        "completed": d.get("completed"),
        "failed": d.get("failed"),
        "duration_s": d.get("duration"),
        "total_input_tokens": d.get("total_input_tokens"),
        "total_output_tokens": d.get("total_output_tokens"),
        "request_throughput": d.get("request_throughput"),
        "output_throughput": d.get("output_throughput"),
        "mean_ttft_ms": d.get("mean_ttft_ms"),
        "median_ttft_ms": d.get("median_ttft_ms"),
        "mean_tpot_ms": d.get("mean_tpot_ms"),
        "median_schedule_lag_ms": median(lags),
        "cpu_s": json.load(open(cpu_file)).get("cpu_s"),
        "input_lens": d.get("input_lens"),
    }


# ---------------------------------------------------------------- GuideLLM

GUIDELLM_WRAPPER = r"""
import json, resource, sys
import guidellm.benchmark.entrypoints  # imports first: not counted
from guidellm.cli import cli
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime
# Its workers are spawned processes that import this file again.
if __name__ == "__main__":
    out = sys.argv.pop(1)
    c0 = cpu()
    try:
        cli(sys.argv[1:], standalone_mode=False)
    finally:
        json.dump({"cpu_s": cpu() - c0}, open(out, "w"))
"""


def run_guidellm(a, work, name, prompts, n, out_len, rate, conc, server):
    res = os.path.join(work, f"guidellm-{name}.json")
    cpu_file = os.path.join(work, f"guidellm-{name}.cpu.json")
    wrapper = os.path.join(work, "guidellm_wrapper.py")
    with open(wrapper, "w") as f:
        f.write(GUIDELLM_WRAPPER)
    if conc is not None:
        profile = f"kind=concurrent,streams={conc}"
    else:
        profile = f"kind=constant,rate={rate}"
    cmd = [
        a.guidellm_python, wrapper, cpu_file, "run",
        "--backend", f"kind=openai_http,target={server.url},model=fast,request_format=/v1/completions,max_tokens={out_len}",
        "--profile", profile,
        "--constraint", f"kind=max_requests,count={n}",
        "--data", f"kind=json_file,path={prompts}",
        "--tokenizer", f"kind=hf_auto,model={a.tokenizer}",
        "--output", f"kind=json,path={res}",
        "--disable-console",
    ]
    env = dict(os.environ, GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL="ERROR")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0 or not os.path.exists(res):
        raise RuntimeError(f"guidellm failed: {(r.stdout + r.stderr)[-3000:]}")
    d = json.load(open(res))
    b = d["benchmarks"][0]
    reqs = b["requests"]["successful"]
    failed = len(b["requests"].get("errored") or []) + len(b["requests"].get("incomplete") or [])
    dur = b.get("duration") or 0.0
    ttfts = [q["time_to_first_token_ms"] for q in reqs if q.get("time_to_first_token_ms") is not None]
    tpots = [q["inter_token_latency_ms"] for q in reqs if q.get("inter_token_latency_ms") is not None]
    lags = [q["request_dispatch_delay"] * 1000.0 for q in reqs if q.get("request_dispatch_delay") is not None]
    out_tok = sum(q.get("output_tokens") or 0 for q in reqs)
    in_tok = sum(q.get("prompt_tokens") or 0 for q in reqs)
    return {
        "completed": len(reqs),
        "failed": failed,
        "duration_s": dur,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": len(reqs) / dur if dur else None,
        "output_throughput": out_tok / dur if dur else None,
        "mean_ttft_ms": statistics.fmean(ttfts) if ttfts else None,
        "median_ttft_ms": median(ttfts),
        "mean_tpot_ms": statistics.fmean(tpots) if tpots else None,
        "median_schedule_lag_ms": median(lags) if rate is not None else None,
        "cpu_s": json.load(open(cpu_file)).get("cpu_s"),
    }


# ---------------------------------------------------------------- the runs


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def one(a, client, work, name, prompts, n, out_len, rate, conc, ttft_ms, itl_ms):
    t0 = time.monotonic()
    try:
        if client == "orch":
            r = run_orch(a, work, name, prompts, n, out_len, rate, conc, ttft_ms, itl_ms)
        else:
            server = Server(a.server, ttft_ms, itl_ms, a.tokenizer + "/tokenizer.json")
            try:
                fn = run_vllm if client == "vllm" else run_guidellm
                r = fn(a, work, f"{client}-{name}", prompts, n, out_len, rate, conc, server)
                r["server_max_in_flight"] = server.stats().get("max_in_flight")
            finally:
                server.stop()
    except RuntimeError as e:
        r = {"error": str(e)[-600:]}
    r["wall_s"] = round(time.monotonic() - t0, 2)
    print(f"  {client:9s} {name:24s} {summary(r)}", file=sys.stderr, flush=True)
    return r


def summary(r):
    if "error" in r:
        return "error: " + r["error"].splitlines()[-1][:120]
    keys = ["completed", "failed", "request_throughput", "mean_ttft_ms", "median_schedule_lag_ms", "cpu_s"]
    return " ".join(f"{k}={r[k]:.4g}" if isinstance(r.get(k), float) else f"{k}={r.get(k)}" for k in keys)


def pct(x, ref):
    if x is None or ref in (None, 0):
        return None
    return round(100.0 * (x - ref) / ref, 2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--orch", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json")
    p.add_argument("--prompts", required=True)
    p.add_argument("--vllm-python", required=True)
    p.add_argument("--guidellm-python", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--clients", default="orch,vllm,guidellm")
    p.add_argument("--parts", default="agreement,max_rate,ttft_overhead",
                   help="the parts to run; the others are kept from an existing --out file")
    a = p.parse_args()
    parts = a.parts.split(",")
    clients = a.clients.split(",")
    work = tempfile.mkdtemp(prefix="bench-loadgen-")
    out = {}
    if os.path.exists(a.out) and len(parts) < 3:
        out = json.load(open(a.out))
    out.update({
        "what": __doc__.strip().splitlines()[0],
        "server": "fast-openai (crates/orch-testkit/src/bin/fast-openai.rs), 1 tokio thread",
        "machine": {"cpus": os.cpu_count()},
        "versions": versions(a),
    })

    if "agreement" in parts:
        agreement(a, clients, work, out)
    if "max_rate" in parts:
        max_rate(a, clients, work, out)
    if "ttft_overhead" in parts:
        ttft_overhead(a, clients, work, out)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {a.out}", file=sys.stderr)


def agreement(a, clients, work, out):
    print("agreement at 32 concurrent streams", file=sys.stderr)
    n_agree = 200 if a.quick else 1000
    agree = {c: one(a, c, work, "agree", a.prompts, n_agree, 32, None, 32, SERVER_TTFT_MS, 5) for c in clients}
    ref = agree.get("vllm", {})
    for c, r in agree.items():
        if c == "vllm" or "error" in r:
            continue
        r["vs_vllm_pct"] = {
            k: pct(r.get(k), ref.get(k))
            for k in ["total_input_tokens", "total_output_tokens", "mean_ttft_ms", "mean_tpot_ms", "request_throughput", "output_throughput"]
        }
    for r in agree.values():
        r.pop("input_lens", None)
    out["agreement"] = {"streams": 32, "num_prompts": n_agree, "output_len": 32, "server_ttft_ms": SERVER_TTFT_MS, "server_itl_ms": 5, "clients": agree, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def max_rate(a, clients, work, out):
    print("max sustained rate", file=sys.stderr)
    rates = [500, 1000, 2000, 4000] if a.quick else [250, 500, 1000, 2000, 4000, 8000, 16000]
    ladder = {}
    best = {}
    for c in clients:
        ladder[c] = []
        for rate in rates:
            n = max(1000, min(rate * 3, 30000))
            r = one(a, c, work, f"rate-{rate}", a.prompts, n, 4, rate, None, 0, 0)
            r["offered_rate"] = rate
            r["num_prompts"] = n
            ok = (
                "error" not in r
                and r.get("failed") == 0
                and r.get("completed") == n
                and (r.get("request_throughput") or 0) >= 0.9 * rate
                and r.get("median_schedule_lag_ms") is not None
                and r["median_schedule_lag_ms"] < 1.0
            )
            r["sustained"] = ok
            if r.get("cpu_s") is not None and r.get("completed"):
                r["cpu_ms_per_request"] = round(1000.0 * r["cpu_s"] / r["completed"], 4)
            ladder[c].append(r)
            if ok:
                best[c] = rate
            else:
                break
    out["max_rate"] = {
        "rule": "every request completed, achieved >= 90% of the offered rate, median schedule lag < 1 ms; constant intervals, 4 output tokens, the server answering at once",
        "sustained_rate": {c: best.get(c) for c in clients},
        "ladder": ladder,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def ttft_overhead(a, clients, work, out):
    print("client overhead on TTFT", file=sys.stderr)
    over = {}
    for c in clients:
        over[c] = {}
        for conc in [1, 100, 1000]:
            n = 200 if conc == 1 else (1000 if conc == 100 else 3000)
            if a.quick:
                n = max(conc * 2, 100)
            r = one(a, c, work, f"conc-{conc}", a.prompts, n, 8, None, conc, SERVER_TTFT_MS, 5)
            if r.get("median_ttft_ms") is not None:
                r["ttft_overhead_ms"] = round(r["median_ttft_ms"] - SERVER_TTFT_MS, 3)
            over[c][str(conc)] = r
    out["ttft_overhead"] = {"server_ttft_ms": SERVER_TTFT_MS, "note": "median TTFT measured minus the server's 20 ms (its timer adds about 1 ms for every client alike)", "clients": over, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def versions(a):
    v = {}
    for name, py, mod in [("vllm", a.vllm_python, "vllm"), ("guidellm", a.guidellm_python, "guidellm")]:
        try:
            v[name] = subprocess.run(
                [py, "-c", f"import importlib.metadata as m; print(m.version('{mod}'))"],
                capture_output=True, text=True, timeout=120,
            ).stdout.strip()
        except Exception as e:  # noqa: BLE001
            v[name] = f"unknown ({e})"
    v["orch"] = subprocess.run([a.orch, "--version"], capture_output=True, text=True).stdout.strip()
    return v


if __name__ == "__main__":
    main()
