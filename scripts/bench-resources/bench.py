"""The host resources of one `orch run` with N cells at once, and the store's
write of many cells ending in the same second (issue 47 item 3).

Driven by scripts/bench-resources.sh (which builds the binaries and starts the
servers); writes the JSON it is given. Two measures:

- resources: `orch run --jobs N` of N cells that each sleep SLEEP s, on the local
  backend and on the fake cluster; the `orch` process sampled every 50 ms from
  /proc: peak RSS (VmHWM), threads, open fds, sockets, pipes; the growth per
  cell is the least-squares slope over N (bytes/cell, fds/cell, ...), and the
  peak cells running at once is read from the records' start and end times.
- store: STORE_CELLS cells on the local backend (`--jobs STORE_CELLS`) that each
  wait on one FIFO; once every cell waits, the FIFO is opened and closed, so
  every workload ends in the same instant. The time from that release (and from
  the first record) to the last record stored, for the folder store (the
  records' `result.json` mtimes) and the S3 store (s3s-fs keeps objects as
  files: the `done/<cell>.json` mtimes).
"""

import errno
import json
import os
import statistics
import subprocess
import sys
import threading
import time


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        return None
    return out


def fd_kinds(pid):
    fds = sockets = pipes = files = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for n in names:
        try:
            t = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        fds += 1
        if t.startswith("socket:"):
            sockets += 1
        elif t.startswith("pipe:"):
            pipes += 1
        elif t.startswith("/"):
            files += 1
    return {"fds": fds, "sockets": sockets, "pipes": pipes, "files": files}


def children(pid):
    n = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                n += len(f.read().split())
    except OSError:
        pass
    return n


class Sampler:
    """Peaks of the process `pid` every `every` seconds until it exits."""

    def __init__(self, pid, every=0.05):
        self.pid, self.every = pid, every
        self.peak = {"vmhwm_kib": 0, "threads": 0, "fds": 0, "sockets": 0, "pipes": 0, "files": 0,
                     "children": 0}
        self.samples = 0
        self.done = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.done:
            st = proc_status(self.pid)
            kinds = fd_kinds(self.pid)
            if st is None or kinds is None or st.get("State", "").startswith("Z"):
                time.sleep(self.every)
                continue
            p = self.peak
            p["vmhwm_kib"] = max(p["vmhwm_kib"], int(st.get("VmHWM", "0 kB").split()[0]))
            p["threads"] = max(p["threads"], int(st.get("Threads", "0")))
            for k, v in kinds.items():
                p[k] = max(p[k], v)
            p["children"] = max(p["children"], children(self.pid))
            self.samples += 1
            time.sleep(self.every)

    def stop(self):
        self.done = True
        self.thread.join()


def run_sampled(cmd, env, out_path):
    with open(out_path, "wb") as out, open(out_path + ".err", "wb") as err:
        t0 = time.time()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        s = Sampler(p.pid)
        rc = p.wait()
        s.stop()
        wall = time.time() - t0
    return rc, wall, s


def suite(path, name, n, workload, image=None):
    values = ", ".join(str(i) for i in range(1, n + 1))
    with open(path, "w") as f:
        f.write(f"name: {name}\n")
        if image:
            f.write(f"image: {image}\n")
        f.write("benchmarks:\n  - name: c\n")
        f.write(f"    workload: {workload}\n")
        f.write(f"    matrix: {{i: [{values}]}}\n")


def parse_time(s):
    # RFC 3339 with nanoseconds and `Z`: seconds since the epoch.
    from datetime import datetime
    s = s.replace("Z", "+00:00")
    if "." in s:
        head, rest = s.split(".", 1)
        frac = rest[: rest.index("+")] if "+" in rest else rest
        tz = rest[len(frac):]
        s = f"{head}.{frac[:6]}{tz}"
    return datetime.fromisoformat(s).timestamp()


def records(store):
    """Every `result.json` under a folder store: (record, mtime)."""
    out = []
    for run in os.listdir(store):
        cells = os.path.join(store, run, "cells")
        if not os.path.isdir(cells):
            continue
        for c in os.listdir(cells):
            p = os.path.join(cells, c, "result.json")
            if os.path.exists(p):
                out.append((json.load(open(p)), os.path.getmtime(p)))
    return out


def peak_running(recs):
    events = []
    for r in recs:
        events.append((parse_time(r["started_at"]), 1))
        events.append((parse_time(r["finished_at"]), -1))
    events.sort()
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def slope(xs, ys):
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def resources(cfg, backend, ns):
    rows = []
    for n in ns:
        work = os.path.join(cfg["work"], f"{backend}-{n}")
        os.makedirs(work, exist_ok=True)
        yaml = os.path.join(work, "suite.yaml")
        image = cfg["image"] if backend == "kubernetes" else None
        suite(yaml, f"res{n}", n, "{shell: 'sleep %s'}" % cfg["sleep"], image)
        store = os.path.join(work, "store")
        cmd = [cfg["orch"], "run", "-f", yaml, "--backend", backend, "--store", store, "--jobs", str(n), "--json"]
        rc, wall, s = run_sampled(cmd, cfg["env"], os.path.join(work, "out.json"))
        recs = [r for r, _ in records(store)]
        ok = sum(1 for r in recs if r["status"] == "succeeded")
        row = {"cells": n, "exit": rc, "succeeded": ok, "wall_s": round(wall, 2),
               "peak_running": peak_running(recs), "samples": s.samples, **s.peak,
               "peak_rss_mib": round(s.peak["vmhwm_kib"] / 1024, 1)}
        print(f"{backend} N={n}: {json.dumps(row)}", file=sys.stderr)
        if rc != 0:
            print(open(os.path.join(work, "out.json.err")).read()[-3000:], file=sys.stderr)
        rows.append(row)
    xs = [r["peak_running"] for r in rows]
    growth = {
        "rss_bytes_per_cell": round(slope(xs, [r["vmhwm_kib"] * 1024 for r in rows])),
        "threads_per_cell": round(slope(xs, [r["threads"] for r in rows]), 3),
        "fds_per_cell": round(slope(xs, [r["fds"] for r in rows]), 3),
        "sockets_per_cell": round(slope(xs, [r["sockets"] for r in rows]), 3),
        "pipes_per_cell": round(slope(xs, [r["pipes"] for r in rows]), 3),
        "files_per_cell": round(slope(xs, [r["files"] for r in rows]), 3),
        "over": "peak cells running at once (least squares over the sizes)",
    }
    return {"runs": rows, "growth": growth}


def cats_waiting(fifo):
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"cat") and fifo.encode() in args:
            n += 1
    return n


def store_burst(cfg, kind):
    """STORE_CELLS cells ending at once, recorded in a folder or S3 store."""
    n = cfg["store_cells"]
    work = os.path.join(cfg["work"], f"store-{kind}")
    os.makedirs(work, exist_ok=True)
    fifo = os.path.join(work, "release.fifo")
    os.mkfifo(fifo)
    yaml = os.path.join(work, "suite.yaml")
    suite(yaml, "burst", n, "{shell: 'cat %s >/dev/null'}" % fifo)
    env = dict(cfg["env"])
    if kind == "folder":
        store = os.path.join(work, "store")
    else:
        # A prefix per build: the records are read back from the server's folder.
        store = f'{cfg["s3_url"]}-{os.path.basename(cfg["work"])}'
    cmd = [cfg["orch"], "run", "-f", yaml, "--backend", "local", "--store", store, "--jobs", str(n), "--json"]
    with open(os.path.join(work, "out.json"), "wb") as out, open(os.path.join(work, "err.txt"), "wb") as err:
        t0 = time.time()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        s = Sampler(p.pid)
        deadline = time.time() + 600
        while cats_waiting(fifo) < n and time.time() < deadline and p.poll() is None:
            time.sleep(0.5)
        waiting = cats_waiting(fifo)
        released = time.time()
        # Every reader blocked in open() is let through by one writer; one that
        # opens later while the writer is open gets EOF when it closes.
        while cats_waiting(fifo) > 0 and p.poll() is None:
            # Not blocking: a reader counted above may be gone by now, and a
            # blocking open with no reader left would wait forever.
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                time.sleep(0.5)
                continue
            time.sleep(0.5)
            os.close(fd)
            time.sleep(0.5)
        try:
            rc = p.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        s.stop()
        wall = time.time() - t0
    if kind == "folder":
        times = [m for _, m in records(store)]
    else:
        times = s3_done_times(cfg, store)
    times.sort()
    row = {"store": kind, "cells": n, "exit": rc, "waiting_at_release": waiting, "recorded": len(times),
           "release_to_last_record_s": round(times[-1] - released, 3) if times else None,
           "first_to_last_record_s": round(times[-1] - times[0], 3) if times else None,
           "release_to_first_record_s": round(times[0] - released, 3) if times else None,
           "wall_s": round(wall, 2), **s.peak, "peak_rss_mib": round(s.peak["vmhwm_kib"] / 1024, 1)}
    print(f"store {kind}: {json.dumps(row)}", file=sys.stderr)
    if rc != 0:
        print(open(os.path.join(work, "err.txt")).read()[-3000:], file=sys.stderr)
    return row


def s3_done_times(cfg, url):
    # s3://bucket/prefix -> <s3 root>/bucket/prefix/<run>/done/*.json
    bucket, _, prefix = url[len("s3://"):].partition("/")
    base = os.path.join(cfg["s3_root"], bucket, prefix)
    out = []
    for run in os.listdir(base):
        d = os.path.join(base, run, "done")
        if os.path.isdir(d):
            out.extend(os.path.getmtime(os.path.join(d, f)) for f in os.listdir(d))
    return out


def measure(cfg):
    out = {}
    for b in cfg["backends"]:
        env = cfg["env"]
        if b == "kubernetes":
            env = dict(env, KUBECONFIG=cfg["kubeconfig"], ORCH_AGENT_IMAGE=cfg["agent_image"],
                       **cfg.get("kube_env", {}))
        saved, cfg["env"] = cfg["env"], env
        out[b] = resources(cfg, b, cfg["kube_ns"] if b == "kubernetes" else cfg["ns"])
        cfg["env"] = saved
    out["store_burst"] = [store_burst(cfg, k) for k in cfg["stores"]]
    return out


def main():
    cfg = json.loads(sys.argv[1])
    cfg["env"] = dict(os.environ)
    out = {
        "what": "host resources of one `orch run --jobs N` (N cells of `sleep` at once) and the store's write of "
                "cells ending in the same instant (issue 47 item 3)",
        "machine": {"cpus": os.cpu_count()},
        "build": cfg["profile"],
        "sleep_s": cfg["sleep"],
        "note": cfg.get("note", ""),
        "command": "bash scripts/bench-resources.sh",
    }
    # With an earlier `orch` (BEFORE_BIN), each measure is made with it, then
    # with this build, in one invocation: "before" and "after".
    builds = [("after", cfg["orch"])]
    if cfg.get("before"):
        builds.insert(0, ("before", cfg["before"]))
        out["before_build"] = cfg.get("before_note", "")
    base = cfg["work"]
    for name, orch in builds:
        cfg["orch"], cfg["work"] = orch, os.path.join(base, name)
        print(f"== {name}: {orch}", file=sys.stderr)
        out[name] = measure(cfg)
    with open(cfg["out"], "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
