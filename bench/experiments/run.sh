#!/usr/bin/env bash
# Runs the cells of bench/analysis.md's "What is still open" tables for one variant of the
# hot-prefix experiment (KINF_EXPERIMENT, see README.md in this folder) and prints them as
# markdown rows: TTFT p50 / p90 s, e2e p50 s, cache hits. Seed 1, chat workload, 10 req/s per
# worker on the h100-llama70b profile.
#
#   KINF_EXPERIMENT=second-copy bench/experiments/run.sh [BIN] [CELL...]
#
# BIN: the kinf-bench binary (default target/release/kinf-bench). CELL: any of w3 w30-steady
# w100-steady w300-steady w30-cold w100-cold w1000-cold (default: w3 w30-steady w100-steady
# w30-cold w100-cold), or light: the report's light-load runs of shared-prefix, multiturn and
# independent (l40s-qwen27b-fp8, 3 workers), means over seeds 1-3 of TTFT p50 / p90, cache
# hits and the busiest worker's share (load_imbalance); or capacity: the report's capacity runs
# (closed loop for 900 s, the first 120 s unmeasured) of hotspot and mixed-tenants at
# concurrency 4-32 (peak of the means over seeds 1-3, goodput req/min) and of shared-prefix
# on 8 workers at concurrency 85.
set -euo pipefail
# The patched build reads an unknown KINF_EXPERIMENT as unset (main's decisions): refuse it
# here, so that a typo cannot print main's figures under a variant's name.
case ${KINF_EXPERIMENT:-} in
  "" | hot-prefix | second-copy | credit | credit-second-copy) ;;
  cold-tiebreak=*)
    [[ ${KINF_EXPERIMENT#cold-tiebreak=} =~ ^[0-9]+([.][0-9]+)?$ ]] || {
      echo "KINF_EXPERIMENT=$KINF_EXPERIMENT: K must be a number, e.g. cold-tiebreak=0.5" >&2
      exit 2
    } ;;
  *)
    echo "KINF_EXPERIMENT=$KINF_EXPERIMENT is not a variant: hot-prefix, second-copy, credit, credit-second-copy or cold-tiebreak=K (bench/experiments/README.md)" >&2
    exit 2 ;;
esac
[[ ${KINF_EXPERIMENT_MIN_REUSE:-0} =~ ^[0-9]+([.][0-9]+)?$ ]] || {
  echo "KINF_EXPERIMENT_MIN_REUSE=$KINF_EXPERIMENT_MIN_REUSE: must be a number" >&2
  exit 2
}
bin=${1:-target/release/kinf-bench}
shift || true
cells=("$@")
[ ${#cells[@]} -gt 0 ] || cells=(w3 w30-steady w100-steady w30-cold w100-cold)
for c in "${cells[@]}"; do
  case $c in
    w3 | w30-steady | w100-steady | w300-steady | w30-cold | w100-cold | w1000-cold | light | capacity) ;;
    *) echo "unknown cell: $c (w3 w30-steady w100-steady w300-steady w30-cold w100-cold w1000-cold light capacity)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "$bin: no such executable (cargo build --release -p kinf-bench)" >&2; exit 2; }
# An unpatched build ignores KINF_EXPERIMENT and would print main's figures.
if [ -n "${KINF_EXPERIMENT:-}" ] && ! grep -qa KINF_EXPERIMENT "$bin"; then
  echo "$bin was not built with bench/experiments/hot-prefix.patch applied" >&2
  exit 2
fi
run() { # label workers duration warmup
  "$bin" sim --workload chat --router kinference --workers "$2" --profile h100-llama70b \
    --load "poisson:$(( $2 * 10 ))" --duration "$3" --warmup "$4" --seed 1 --format json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("| %s | %.3f / %.3f, %.2f, %.1f %% | wall %.1f s |" % (sys.argv[1], d["ttft_p50_s"], d["ttft_p90_s"], d["e2e_p50_s"], 100*d["cache_hit_rate"], d["wall_s"]))' "$1"
}
light() { # workload
  for seed in 1 2 3; do
    "$bin" sim --workload "$1" --router kinference --seed "$seed" --format json
  done | python3 -c '
import json, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]  # one JSON object per run and line
m = lambda k: sum(r[k] for r in runs) / len(runs)
print("| %s, light load | %.3f / %.3f, %.1f %%, busiest %.2f |" % (sys.argv[1], m("ttft_p50_s"), m("ttft_p90_s"), 100 * m("cache_hit_rate"), m("load_imbalance")))' "$1"
}
goodput() { # label workload workers concurrency...; prints the best mean goodput over seeds 1-3
  local label=$1 w=$2 n=$3 best="" c; shift 3
  for c in "$@"; do
    for seed in 1 2 3; do
      "$bin" sim --workload "$w" --router kinference --workers "$n" --load "concurrency:$c" \
        --duration 900 --warmup 120 --seed "$seed" --format json
    done | python3 -c '
import json, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]  # one JSON object per run and line
print(sum(r["goodput_rpm"] for r in runs) / len(runs))'
  done | python3 -c 'import sys; v = [float(l) for l in sys.stdin]; print("| %s | peak goodput %.1f req/min |" % (sys.argv[1], max(v)))' "$label"
}
echo "variant: ${KINF_EXPERIMENT:-main}${KINF_EXPERIMENT_MIN_REUSE:+, min reuse $KINF_EXPERIMENT_MIN_REUSE}"
for c in "${cells[@]}"; do
  case $c in
    w3) run "3 workers, 600 s" 3 600 0 ;;
    w30-steady) run "30 workers, steady" 30 200 60 ;;
    w100-steady) run "100 workers, steady" 100 300 60 ;;
    w300-steady) run "300 workers, steady" 300 200 60 ;;
    w30-cold) run "30 workers, 67 s from cold" 30 66.66666666666667 0 ;;
    w100-cold) run "100 workers, 20 s from cold" 100 20 0 ;;
    w1000-cold) run "1,000 workers, 10 s from cold" 1000 10 0 ;;
    light) for w in shared-prefix multiturn independent; do light "$w"; done ;;
    capacity)
      goodput "hotspot, 3 workers" hotspot 3 4 8 16 24 32
      goodput "mixed-tenants, 3 workers" mixed-tenants 3 4 8 16 24 32
      goodput "shared-prefix, 8 workers, c=85" shared-prefix 8 85 ;;
  esac
done
