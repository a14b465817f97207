#!/usr/bin/env bash
# The `kinf-bench live` matrix: every workload behind every router, load from the built-in client
# (light Poisson load, and a closed loop for the capacity view) and from GuideLLM (single-turn
# workloads), one JSON file per run in bench/results/:
#
#   bench/results/live-<workload>-<router>-<client>-<light|cN>.json
#   (light: Poisson at the workload's light load; cN: closed loop at concurrency N;
#   e.g. live-hotspot-kinference-builtin-c12.json)
#
# then the Markdown table of all of them on stdout. Release binaries; the peers venv
# (scripts/peers/setup.sh) and the GuideLLM venv (scripts/peers/setup-guidellm.sh) are set up
# first. Environment: LIVE_SPEED (4), LIVE_SCALE (8), LIVE_REQUESTS (120), LIVE_SEED (1),
# LIVE_RATE (requests per simulated second; default: each workload's light load, see
# `kinf-bench live --help`), LIVE_CONCURRENCY (12), LIVE_BASE_PORT (31000),
# LIVE_WORKLOADS, LIVE_ROUTERS, LIVE_CLIENTS, LIVE_GUIDELLM_ROUTERS (space-separated subsets; GuideLLM
# takes ≈30 s to start, so it drives four routers by default), LIVE_SKIP_CAPACITY=1,
# LIVE_OUT (bench/results), LIVE_BIN (a directory with the three binaries: no build),
# LIVE_MAX_LAG (1.0: a run whose client sent a request more than this many wall seconds after its
# scheduled start fell behind its schedule and is run again), LIVE_RETRIES (2: at most this many
# reruns).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(pwd)/target}"
SPEED=${LIVE_SPEED:-4}
SCALE=${LIVE_SCALE:-8}
REQUESTS=${LIVE_REQUESTS:-120}
SEED=${LIVE_SEED:-1}
RATE=${LIVE_RATE:-}
CONC=${LIVE_CONCURRENCY:-12}
BASE=${LIVE_BASE_PORT:-31000}
OUT=${LIVE_OUT:-bench/results}
WORKLOADS=${LIVE_WORKLOADS:-"shared-prefix multiturn independent hotspot"}
ROUTERS=${LIVE_ROUTERS:-"kinference vllm-cache-aware vllm-kv-aware sglang-cache-aware random round-robin"}
CLIENTS=${LIVE_CLIENTS:-"builtin guidellm"}
GUIDELLM_ROUTERS=${LIVE_GUIDELLM_ROUTERS:-"kinference vllm-cache-aware sglang-cache-aware random"}
MAX_LAG=${LIVE_MAX_LAG:-1.0}
RETRIES=${LIVE_RETRIES:-2}
python3 -c 'import sys; float(sys.argv[1]) >= 0 or sys.exit(1)' "$MAX_LAG" 2>/dev/null \
  || { echo "error: LIVE_MAX_LAG must be a number of seconds ≥ 0, got '$MAX_LAG'" >&2; exit 2; }
[[ "$RETRIES" =~ ^[0-9]+$ ]] \
  || { echo "error: LIVE_RETRIES must be a whole number ≥ 0, got '$RETRIES'" >&2; exit 2; }

if [ -n "${LIVE_BIN:-}" ]; then
  BIN=$LIVE_BIN # a directory with kinf-bench, kinference and kinf-sim
else
  echo "== building kinf-bench, kinference, kinf-sim (release)" >&2
  cargo build --locked --release -q -p kinf-bench -p kinf-handler -p kinf-sim
  BIN="$CARGO_TARGET_DIR/release"
fi
PEERS_PY=$(bash scripts/peers/setup.sh | tail -n 1)
VR="$(dirname "$PEERS_PY")/vllm-router"
SMG="$(dirname "$PEERS_PY")/smg"
GUIDELLM=""
case " $CLIENTS " in *" guidellm "*) GUIDELLM=$(bash scripts/peers/setup-guidellm.sh | tail -n 1) ;; esac
mkdir -p "$OUT"

run() { # WORKLOAD ROUTER CLIENT LOAD(or "") TAG
  local f="$OUT/live-$1-$2-$3-$5.json"
  echo "== $1 / $2 / $3 / ${4:-light} -> $f" >&2
  local extra=()
  [ "$3" = guidellm ] && extra+=(--guidellm "$GUIDELLM")
  [ -n "$4" ] && extra+=(--load "$4")
  local try
  for try in $(seq 0 "$RETRIES"); do
    if ! "$BIN/kinf-bench" live --workload "$1" --router "$2" --client "$3" \
        --speed "$SPEED" --scale "$SCALE" --requests "$REQUESTS" --seed "$SEED" \
        --base-port "$BASE" --vllm-router "$VR" --sglang-router "$SMG" "${extra[@]}" \
        --out "$f" --format json >/dev/null; then
      echo "   FAILED: $1 / $2 / $3 / $4 (kept going)" >&2
      return
    fi
    # A GuideLLM run that fell behind its Poisson schedule sent its late requests in a burst
    # (client_info.schedule.lag_max_s, wall seconds): not comparable, so run it again.
    local lag
    lag=$(python3 -c 'import json,sys; s=(json.load(open(sys.argv[1])).get("client_info") or {}).get("schedule") or {}; print(s.get("lag_max_s", 0))' "$f")
    if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$lag" "$MAX_LAG"; then
      return
    fi
    echo "   schedule lag ${lag} s > ${MAX_LAG} s: the client fell behind; run $((try + 1)) of $((RETRIES + 1))" >&2
  done
  echo "   KEPT LAGGING: $1 / $2 / $3 / ${4:-light} (marked † in the report)" >&2
}

for w in $WORKLOADS; do
  for c in $CLIENTS; do
    # GuideLLM sends single-turn prompts only.
    [ "$c" = guidellm ] && [ "$w" = multiturn ] && continue
    rs=$ROUTERS
    [ "$c" = guidellm ] && rs=$GUIDELLM_ROUTERS
    for r in $rs; do
      run "$w" "$r" "$c" "${RATE:+poisson:$RATE}" light
    done
  done
  if [ "${LIVE_SKIP_CAPACITY:-}" != 1 ] && [ "$w" != independent ]; then
    for r in $ROUTERS; do
      run "$w" "$r" builtin "concurrency:$CONC" "c$CONC"
    done
  fi
done

python3 - "$OUT" <<'PY'
import glob, json, sys
rows = [json.load(open(f)) for f in sorted(glob.glob(f"{sys.argv[1]}/live-*.json"))]
def f(x, d=3):
    return "–" if x is None else f"{x:.{d}f}"
print("| workload | router | client | load | TTFT p50 s | TTFT p90 s | e2e p50 s | e2e p90 s | goodput rpm | SLO att. | cache hit | out tok/s | requests | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for v in rows:
    print(f"| {v['workload']} | {v['router']} | {v['client']} | {v['load']} | {f(v['ttft_p50_s'])} | {f(v['ttft_p90_s'])} | "
          f"{f(v['e2e_p50_s'])} | {f(v['e2e_p90_s'])} | {f(v['goodput_rpm'], 1)} | {f(v['slo_attainment'])} | "
          f"{f(v['cache_hit_rate'])} | {f(v['output_tok_s'], 1)} | {v['requests']} | {v['errors']} |")
PY
