#!/usr/bin/env python3
"""Helpers of scripts/bench-scale.sh (standard library only).

  bench-scale.py sample PID OUT        sample /proc/PID every 100 ms until it exits:
                                       peak RSS, threads, open fds and sockets -> OUT (JSON)
  bench-scale.py shims DIR LOG CMD...  write a logging shim for each Slurm command CMD
                                       into DIR (each call: `TIME NAME EXIT` in LOG)
  bench-scale.py case DIR              one (backend, size) case of DIR -> DIR/case.json
  bench-scale.py s3fill STORE ROOT BUCKET PREFIX FIRST
                                       copy the pushed run FIRST's objects in the bucket
                                       folder for every other run of the folder STORE
  bench-scale.py report WORK JSON SVG  every case and the store timings -> JSON and SVG
"""
import json
import os
import re
import statistics
import sys
import time


def sample(pid, out):
    """Peak resident memory (VmHWM, the kernel's own high-water mark, and the largest
    VmRSS seen), threads, open file descriptors and sockets of a process, sampled
    every 100 ms until it exits."""
    peak = {"rss_kib": 0, "hwm_kib": 0, "threads": 0, "fds": 0, "sockets": 0, "samples": 0}
    series = []
    t0 = time.time()
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                st = f.read()
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            break
        socks = 0
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    socks += 1
            except OSError:
                pass
        vals = {}
        for key, name in (("VmRSS", "rss_kib"), ("VmHWM", "hwm_kib"), ("Threads", "threads")):
            m = re.search(rf"^{key}:\s+(\d+)", st, re.M)
            if m:
                vals[name] = int(m.group(1))
        if "rss_kib" not in vals:  # a zombie: it has exited
            break
        vals["fds"] = len(fds)
        vals["sockets"] = socks
        for k, v in vals.items():
            peak[k] = max(peak[k], v)
        peak["samples"] += 1
        if peak["samples"] % 10 == 1:
            series.append([round(time.time() - t0, 1), vals["rss_kib"], vals["fds"], vals["threads"]])
        with open(out + ".tmp", "w") as f:
            json.dump({**peak, "series": series}, f)
        os.replace(out + ".tmp", out)
        time.sleep(0.1)
    with open(out, "w") as f:
        json.dump({**peak, "series": series}, f)


SHIM = """#!/bin/sh
# bench-scale: log each call of {name} (time, name, exit status, and `job` when a job's
# own script made it: SLURM_JOB_ID set), then answer as {real} does
{real} "$@"
rc=$?
echo "$(date +%s.%N) {name} $rc ${{SLURM_JOB_ID:+job}}" >> {log}
exit $rc
"""


def shims(d, log, names):
    os.makedirs(d, exist_ok=True)
    path = [p for p in os.environ.get("PATH", "").split(":") if p and os.path.abspath(p) != os.path.abspath(d)]
    for name in names:
        real = next((os.path.join(p, name) for p in path if os.access(os.path.join(p, name), os.X_OK)), None)
        if real is None:
            continue
        p = os.path.join(d, name)
        with open(p, "w") as f:
            f.write(SHIM.format(name=name, real=real, log=log))
        os.chmod(p, 0o755)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else None


def case(d):
    """One case: the run's record (`orch run --json`), the store's result files, the
    fake's request statistics and the process samples -> case.json."""
    meta = json.load(open(os.path.join(d, "meta.json")))
    out = dict(meta)
    try:
        rec = json.load(open(os.path.join(d, "run.json")))
    except (OSError, ValueError) as e:
        out["error"] = f"no run record: {e}: " + open(os.path.join(d, "orch.err")).read()[-2000:]
        json.dump(out, open(os.path.join(d, "case.json"), "w"), indent=2)
        return out
    cells = rec.get("cells", [])
    n = meta["cells"]
    by_status = {}
    for c in cells:
        by_status[c["status"]] = by_status.get(c["status"], 0) + 1
    out["orch_exit"] = meta.get("orch_exit")
    out["cells_by_status"] = by_status
    out["wall_s"] = round(meta["t1"] - meta["t0"], 2)
    for w in ("before", "after"):
        try:
            out[f"loadavg_{w}"] = [float(x) for x in open(os.path.join(d, f"loadavg-{w}.txt")).read().split()]
        except (OSError, ValueError):
            pass
    ds = [c["duration_s"] for c in cells if c.get("duration_s") is not None and c["status"] == "succeeded"]
    work = meta["workload_s"]
    if ds:
        out["cell_duration_median_s"] = round(statistics.median(ds), 3)
        out["cell_duration_p90_s"] = round(pct(ds, 0.9), 3)
        out["overhead_median_ms"] = round((statistics.median(ds) - work) * 1000, 1)
        out["overhead_p90_ms"] = round((pct(ds, 0.9) - work) * 1000, 1)
    prov = [c["timings"].get("provision") for c in cells if c.get("timings", {}).get("provision") is not None]
    if prov:
        out["provision_median_ms"] = round(statistics.median(prov) * 1000, 1)
    # Time to first result: the first cell record stored (result.json written), from launch.
    store = os.path.join(meta["store"], rec["id"], "cells")
    mtimes = []
    if os.path.isdir(store):
        for c in os.listdir(store):
            p = os.path.join(store, c, "result.json")
            if os.path.isfile(p):
                mtimes.append(os.path.getmtime(p))
    out["records_stored"] = len(mtimes)
    if mtimes:
        out["first_result_s"] = round(min(mtimes) - meta["t0"], 2)
        out["last_result_s"] = round(max(mtimes) - meta["t0"], 2)
    # orch's own process
    try:
        s = json.load(open(os.path.join(d, "sample.json")))
        out["orch_peak_rss_mib"] = round(max(s["hwm_kib"], s["rss_kib"]) / 1024, 1)
        out["orch_peak_fds"] = s["fds"]
        out["orch_peak_sockets"] = s["sockets"]
        out["orch_peak_threads"] = s["threads"]
        out["orch_samples"] = s["samples"]
        out["orch_series"] = s["series"]
    except (OSError, ValueError):
        pass
    # The platform's requests
    stats_path = os.path.join(d, "fake-stats.json")
    if meta["backend"] == "slurm":
        calls, in_jobs = [], {}
        log = os.path.join(d, "slurm-calls.log")
        if os.path.isfile(log):
            for line in open(log):
                parts = line.split()
                if len(parts) == 4 and parts[3] == "job":
                    # A job's own script (`scontrol show hostnames` for MASTER_ADDR): not orch's.
                    in_jobs[parts[1]] = in_jobs.get(parts[1], 0) + 1
                elif len(parts) == 3:
                    calls.append((float(parts[0]), parts[1], int(parts[2])))
        by = {}
        for _, name, _ in calls:
            by[name] = by.get(name, 0) + 1
        sec = {}
        for t, _, _ in calls:
            sec[int(t - meta["t0"])] = sec.get(int(t - meta["t0"]), 0) + 1
        out["requests"] = len(calls)
        out["requests_by_verb"] = by
        out["commands_in_jobs"] = in_jobs
        out["requests_per_second"] = [sec.get(i, 0) for i in range(max(sec) + 1)] if sec else []
        out["sbatch_refused"] = sum(1 for _, name, rc in calls if name == "sbatch" and rc != 0)
        out["throttled"] = out["sbatch_refused"]
        out["throttled_note"] = "sbatch calls that exited non-zero (a submission refused, e.g. past MaxSubmitJobs)"
        try:
            out["slurmctld_limit_refusals"] = int(open(os.path.join(d, "slurmctld-refusals.txt")).read().strip() or 0)
        except (OSError, ValueError):
            pass
    elif os.path.isfile(stats_path):
        st = json.load(open(stats_path))
        out["requests"] = st["requests"]
        out["requests_by_verb"] = st.get("by_verb") or st.get("by_method")
        if "by_verb_resource" in st:
            out["requests_by_verb_resource"] = st["by_verb_resource"]
        out["requests_per_second"] = st["per_second"]
        out["throttled"] = st["throttled"]
        for k in ("throttled_by_method", "throttled_early", "throttled_waited", "throttled_retry_after_max_s"):
            if k in st:
                out[k] = st[k]
    if "requests" in out:
        out["requests_per_cell"] = round(out["requests"] / n, 2)
        out["requests_per_cell_by_verb"] = {k: round(v / n, 2) for k, v in sorted(out["requests_by_verb"].items())}
        out["peak_requests_per_s"] = max(out["requests_per_second"] or [0])
    json.dump(out, open(os.path.join(d, "case.json"), "w"), indent=2)
    return out


def s3fill(store, root, bucket, prefix, first):
    """Every other run of the folder store written into the bucket folder as a copy of
    the pushed run's objects, with the run's own id, creation time, commit and metric
    value substituted (scripts/bench-history.sh fills its bucket with it too: `orch push` takes
    about 0.64 s a run here, results/bench-store.json)."""
    def facts(run):
        meta = json.load(open(os.path.join(store, run, "run.json")))
        recs = []
        for dd, _, files in os.walk(os.path.join(store, run, "cells")):
            recs += [os.path.join(dd, f) for f in files if f == "result.json"]
        text = "".join(open(p).read() for p in sorted(recs))
        value = re.search(r'"output_throughput":\s*([-0-9.eE+]+)', text).group(1)
        return {"id": run, "created_at": meta["created_at"], "value": value,
                "commit": meta["environment"].get("git_commit")}
    tpl = facts(first)
    bdir = os.path.join(root, bucket)
    objs = []
    for dd, _, files in os.walk(bdir):
        for f in files:
            key = os.path.relpath(os.path.join(dd, f), bdir)
            if first in key:
                objs.append(key)
    assert objs, "the pushed run is not in the bucket"
    blobs = {k: open(os.path.join(bdir, k), "rb").read().decode() for k in objs}

    def subst(text, r):
        for a, b in ((tpl["id"], r["id"]), (tpl["created_at"], r["created_at"]), (tpl["value"], r["value"])):
            text = text.replace(a, b)
        if tpl["commit"] and r["commit"]:
            text = text.replace(tpl["commit"], r["commit"])
        return re.sub(r'("output_throughput":\s*)[-0-9.eE+]+', lambda m: m.group(1) + r["value"], text)
    n = 0
    for run in sorted(os.listdir(store)):
        if run == first or not os.path.isfile(os.path.join(store, run, "run.json")):
            continue
        r = facts(run)
        for k, text in blobs.items():
            p = os.path.join(bdir, k.replace(first, run))
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as fh:
                fh.write(subst(text, r))
        n += 1
    print(f"copied {n} runs ({len(objs)} objects each)", file=sys.stderr)


COLORS = {"kubernetes": "#326ce5", "modal": "#7fbf3f", "slurm": "#d9822b"}


def svg(cases, path):
    """Four small panels, one bar per (backend, cells): wall time, API requests per
    cell, orch's peak RSS, per-cell overhead."""
    ok = [c for c in cases if "wall_s" in c]
    panels = [
        ("wall time (s)", "wall_s"),
        ("platform requests per cell", "requests_per_cell"),
        ("orch peak RSS (MiB)", "orch_peak_rss_mib"),
        ("per-cell overhead, median (ms)", "overhead_median_ms"),
    ]
    W, H, PW, PH = 960, 560, 440, 210
    backends = [b for b in ("kubernetes", "modal", "slurm") if any(c["backend"] == b for c in ok)]
    sizes = sorted({c["cells"] for c in ok})
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           '<text x="20" y="22" font-size="14" font-weight="bold">orch at scale: fake cluster (200 GPU nodes), fake Modal, one-node Slurm</text>']
    for i, (title, key) in enumerate(panels):
        x0 = 40 + (i % 2) * (PW + 40)
        y0 = 50 + (i // 2) * (PH + 60)
        vals = [c.get(key) for c in ok if isinstance(c.get(key), (int, float))]
        top = max(vals + [1e-9]) * 1.15
        out.append(f'<text x="{x0}" y="{y0 - 6}" font-weight="bold">{title}</text>')
        out.append(f'<line x1="{x0}" y1="{y0 + PH}" x2="{x0 + PW}" y2="{y0 + PH}" stroke="#444"/>')
        groups = max(1, len(sizes))
        gw = PW / groups
        bw = max(6, (gw - 16) / max(1, len(backends)))
        for gi, n in enumerate(sizes):
            gx = x0 + gi * gw + 8
            out.append(f'<text x="{gx + (gw - 16) / 2:.0f}" y="{y0 + PH + 14}" text-anchor="middle">{n:,} cells</text>')
            for bi, b in enumerate(backends):
                c = next((c for c in ok if c["backend"] == b and c["cells"] == n), None)
                bx = gx + bi * bw
                if c is None or not isinstance(c.get(key), (int, float)):
                    out.append(f'<text x="{bx + bw / 2:.0f}" y="{y0 + PH - 4}" text-anchor="middle" fill="#999">-</text>')
                    continue
                v = c[key]
                h = max(0.0, v) / top * PH
                out.append(f'<rect x="{bx:.1f}" y="{y0 + PH - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" fill="{COLORS[b]}"/>')
                label = f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2g}"
                out.append(f'<text x="{bx + (bw - 2) / 2:.1f}" y="{y0 + PH - h - 3:.1f}" text-anchor="middle" font-size="9">{label}</text>')
    lx = 40
    for b in backends:
        out.append(f'<rect x="{lx}" y="{H - 22}" width="12" height="12" fill="{COLORS[b]}"/>')
        out.append(f'<text x="{lx + 16}" y="{H - 12}">{b}</text>')
        lx += 110
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def report(work, json_path, svg_path):
    meta = json.load(open(os.path.join(work, "bench.json")))
    cases, skipped = [], []
    for name in sorted(os.listdir(work)):
        d = os.path.join(work, name)
        if os.path.isfile(os.path.join(d, "meta.json")):
            cases.append(case(d))
        elif os.path.isfile(os.path.join(d, "skipped.json")):
            skipped.append(json.load(open(os.path.join(d, "skipped.json"))))
    order = {"kubernetes": 0, "modal": 1, "slurm": 2}
    cases.sort(key=lambda c: (order.get(c["backend"], 9), c["cells"]))
    for c in cases:
        for k in ("t0", "t1", "store"):
            c.pop(k, None)
    s3 = None
    p = os.path.join(work, "s3.json")
    if os.path.isfile(p):
        s3 = json.load(open(p))
    if os.environ.get("MERGE") and os.path.isfile(json_path):
        # MERGE=1: what this run did not measure again is kept from the file
        old = json.load(open(json_path))
        seen = {(c["backend"], c["cells"]) for c in cases}
        cases += [c for c in old.get("cases", []) if (c["backend"], c["cells"]) not in seen]
        cases.sort(key=lambda c: (order.get(c["backend"], 9), c["cells"]))
        seen |= {(c["backend"], c["cells"]) for c in cases}
        skipped += [k for k in old.get("skipped", []) if (k.get("backend"), k.get("cells")) not in seen
                    and k not in skipped]
        s3 = s3 or old.get("store_at_scale")
        meta["command"] = f'{old.get("command", "")}; then {meta.get("command", "")}'
    out = {**meta, "cases": cases, "skipped": skipped, "store_at_scale": s3}
    json.dump(out, open(json_path, "w"), indent=2)
    svg(cases, svg_path)
    # A table for the README
    print("| backend | cells | wall s | first result s | requests/cell | peak req/s | 429s | orch peak RSS MiB | peak fds | overhead ms (median) |", file=sys.stderr)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
    for c in cases:
        g = lambda k: c.get(k, "-")
        print(f"| {c['backend']} | {c['cells']:,} | {g('wall_s')} | {g('first_result_s')} | {g('requests_per_cell')} | {g('peak_requests_per_s')} | {g('throttled')} | {g('orch_peak_rss_mib')} | {g('orch_peak_fds')} | {g('overhead_median_ms')} |", file=sys.stderr)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "sample":
        sample(int(args[0]), args[1])
    elif cmd == "shims":
        shims(args[0], args[1], args[2:])
    elif cmd == "case":
        print(json.dumps(case(args[0]), indent=2))
    elif cmd == "s3fill":
        s3fill(*args)
    elif cmd == "report":
        report(*args)
    else:
        sys.exit(__doc__)
