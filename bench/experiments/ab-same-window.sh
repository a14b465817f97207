#!/usr/bin/env bash
# Compares two kinf-bench builds on the fleet-sized chat run in the same time window.
#
#   bench/experiments/ab-same-window.sh BIN_A BIN_B [SIM_SECONDS] [WORKERS]
#
# Runs A and B at the same time, each pinned to one core, then again with the cores swapped,
# and prints each run's wall seconds and its wall_breakdown per request sent (µs), with the
# simulated results that must be equal. On a shared VM whose speed drifts by a third between
# hours, alternating runs one after the other mixes the drift into the difference; running
# both at once exposes them to the same drift (they also share the memory bandwidth, equally).
# Needs 2 cores and about 2 × 6 GB of memory at 1,000 workers and 30 s.
set -euo pipefail
a=${1:?usage: ab-same-window.sh BIN_A BIN_B [SIM_SECONDS] [WORKERS]}
b=${2:?usage: ab-same-window.sh BIN_A BIN_B [SIM_SECONDS] [WORKERS]}
dur=${3:-30}
workers=${4:-1000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # core bin file
    taskset -c "$1" "$2" sim --workload chat --router kinference --workers "$workers" \
        --profile h100-llama70b --load "poisson:$((10 * workers))" --duration "$dur" \
        --warmup 0 --format json >"$3"
}

show() { # label file
    python3 - "$1" "$2" <<'EOF'
import json, sys
label, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
w, n = d["wall_breakdown"], d["submitted"]
parts = " ".join(f"{k.removesuffix('_s')} {w[k] / n * 1e6:.1f}" for k in
                 ("engine_s", "decide_s", "observe_s", "workload_s", "other_s"))
print(f"{label:<28} wall {d['wall_s']:6.1f} s | µs/request: {parts} | "
      f"TTFT p50 {d['ttft_p50_s']:.4f} p90 {d['ttft_p90_s']:.4f} hits {d['cache_hit_rate']:.4f}")
EOF
}

for round in 1 2; do
    if [ "$round" = 1 ]; then ca=0 cb=1; else ca=1 cb=0; fi
    run "$ca" "$a" "$out/a.json" &
    run "$cb" "$b" "$out/b.json" &
    wait
    show "A $(basename "$a") (core $ca)" "$out/a.json"
    show "B $(basename "$b") (core $cb)" "$out/b.json"
done
