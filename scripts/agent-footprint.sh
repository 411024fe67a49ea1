#!/usr/bin/env bash
# Shows that the agent stays small: release binary size, and resident memory
# while it supervises a command. Writes results/agent-footprint.json.
#   bash scripts/agent-footprint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p orch-agent --locked >&2
bin=target/release/orch-agent
size=$(stat -c %s "$bin")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/task.json" <<JSON
{"version": 1, "run_id": "footprint", "cell_id": "sleep", "gpu": "none",
 "workload": {"kind": "command", "argv": ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line \$i; sleep 0.3; done"]},
 "measure": {"warmup": 0, "repetitions": 1, "timeout_s": 60}}
JSON
"$bin" run --task "$work/task.json" --out "$work/out" > "$work/events.jsonl" &
pid=$!
peak_rss_kib=0
samples=0
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
  [ -n "$hwm" ] && [ "$hwm" -gt "$peak_rss_kib" ] && peak_rss_kib=$hwm
  [ -n "$rss" ] && [ "$rss" -gt "$peak_rss_kib" ] && peak_rss_kib=$rss
  samples=$((samples + 1))
  sleep 0.05
done
wait "$pid"
status=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$work/out/result.json")

mkdir -p results
cat > results/agent-footprint.json <<JSON
{
  "binary": "target/release/orch-agent",
  "binary_bytes": $size,
  "binary_mib": $(python3 -c "print(round($size / 1048576, 2))"),
  "supervising_command_peak_rss_kib": $peak_rss_kib,
  "supervising_command_peak_rss_mib": $(python3 -c "print(round($peak_rss_kib / 1024, 2))"),
  "rss_samples": $samples,
  "cell_status": "$status",
  "limits": {"binary_mib": 20, "rss_mib": 30},
  "command": "bash scripts/agent-footprint.sh"
}
JSON
cat results/agent-footprint.json
python3 - <<'PY'
import json
r = json.load(open("results/agent-footprint.json"))
ok = r["binary_mib"] < 20 and r["supervising_command_peak_rss_mib"] < 30 and r["cell_status"] == "succeeded"
print("within limits" if ok else "OVER LIMITS")
raise SystemExit(0 if ok else 1)
PY
