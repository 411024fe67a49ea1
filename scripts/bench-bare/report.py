"""The JSON of scripts/bench-kubernetes.sh and scripts/bench-modal.sh: orch's
per-cell overhead on BACKEND beside the local backend's and the bare
platform's, and the log throughput of both backends, from the work folder
the script filled.

    python3 report.py BACKEND WORK CELLS LOG_MIB PROFILE ROUNDS LOAD_START OUT DESC SHAPE:SUFFIX...

WORK holds `noop-{local,BACKEND}-R.json` (`orch run --json` of CELLS noop
cells, round R), `bare-SHAPE-R.json` (the bare platform's milliseconds per
cell, from scripts/bench-bare/) and `logs-{local,BACKEND}.json` with their
stores `WORK/{local,BACKEND}`. DESC: a JSON object of what the script says of
its server, measure and bare shapes. Each SHAPE:SUFFIX[:VARIANT] names
`BACKEND_bare{SUFFIX}_ms` and `VARIANT_overhead_over_bare{SUFFIX}_ms` (VARIANT
default BACKEND). VARIANTS (environment, space-separated): more orch runs
measured like BACKEND's, from `noop-VARIANT-R.json`.
"""

import json
import os
import statistics
import sys


def p90(ds):
    return round(ds[int(0.9 * (len(ds) - 1))], 1)


def main(backend, work, cells, mib, profile, rounds, load_start, path, desc, *shapes):
    cells, mib, rounds = int(cells), int(mib), int(rounds)
    out = {"cells": cells, "rounds": rounds, "log_mib": mib, "build": profile, "cpus": os.cpu_count(),
           "load_1m": [float(load_start), os.getloadavg()[0]]}
    out.update(json.loads(desc))
    variants = os.environ.get("VARIANTS", "").split()
    for b in ("local", backend, *variants):
        ds, per_round = [], []
        for r in range(1, rounds + 1):
            rec = json.load(open(f"{work}/noop-{b}-{r}.json"))
            assert all(c["status"] == "succeeded" for c in rec["cells"]), (b, rec)
            got = [c["duration_s"] * 1000 for c in rec["cells"]]
            per_round.append(round(statistics.median(got), 1))
            ds += got
        ds.sort()
        out[f"{b}_overhead_ms"] = round(statistics.median(ds), 1)
        out[f"{b}_overhead_p90_ms"] = p90(ds)
        out[f"{b}_overhead_ms_by_round"] = per_round
    for spec in shapes:
        shape, suffix, *variant = spec.split(":")
        orch = variant[0] if variant else backend
        key = f"{backend}_bare{suffix}"
        rs = [json.load(open(f"{work}/bare-{shape}-{r}.json"))["ms"] for r in range(1, rounds + 1)]
        ds = sorted(t for r in rs for t in r)
        out[f"{key}_ms"] = round(statistics.median(ds), 1)
        out[f"{key}_p90_ms"] = p90(ds)
        out[f"{key}_ms_by_round"] = [round(statistics.median(r), 1) for r in rs]
        out[f"{orch}_overhead_over_bare{suffix}_ms"] = round(out[f"{orch}_overhead_ms"] - out[f"{key}_ms"], 1)
    for b in ("local", backend):
        rec = json.load(open(f"{work}/logs-{b}.json"))
        c = rec["cells"][0]
        assert c["status"] == "succeeded", (b, c)
        size = os.path.getsize(f"{work}/{b}/{rec['id']}/cells/{c['id']}/stdout.log")
        out[f"{b}_log_bytes"] = size
        out[f"{b}_log_s"] = round(c["duration_s"], 3)
        out[f"{b}_log_mib_per_s"] = round(size / 1048576 / c["duration_s"], 1)
    out["command"] = f"bash scripts/bench-{backend}.sh"
    json.dump(out, open(path, "w"), indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:])
