#!/usr/bin/env bash
# Sizing of one Kinference replica per tracked worker (docs/install.md, "Sizing").
#
# Starts W kinf-sim workers (vLLM HTTP API, /metrics, ZMQ KV events with replay) and a gateway
# whose S worker sets each list all W workers: it tracks S*W endpoints, each with its own 1 s
# metrics scrape + health check and its own KV-event subscription — exactly what a replica does
# for pods discovered in Kubernetes mode (the ingestion path is the same). Measures the gateway's
# RSS and CPU time over T seconds for S=1 and S=S, and prints JSON with the per-endpoint slope and
# the extrapolation to 100 workers. Idle workers: no requests are sent (request-path CPU is in
# docs/capacity.md and the kinf-bench figures).
#
# Usage: scripts/kube-sizing.sh [WORKERS=20] [SETS=5] [SECONDS=60]   (release binaries in
# target/release: cargo build --release -p kinf-handler --bin kinference -p kinf-sim)
set -euo pipefail
W=${1:-20}
S=${2:-5}
T=${3:-60}
BIN=${BIN:-target/release}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for i in $(seq 1 "$W"); do
  "$BIN/kinf-sim" serve --port $((19000 + i)) --model sim-model \
    --kv-events-port $((20000 + i)) --replay-port $((21000 + i)) >/dev/null 2>&1 &
  pids+=($!)
done
sleep 2

measure() { # $1 = number of worker sets
  local sets=$1 cfg="$work/cfg-$1"
  mkdir -p "$cfg"
  local eps
  eps=$(for i in $(seq 1 "$W"); do printf '"127.0.0.1:%d",' $((19000 + i)); done)
  eps=${eps%,}
  {
    for s in $(seq 1 "$sets"); do
      cat <<EOF
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: set-$s, namespace: sizing }
spec:
  endpoints: [$eps]
  models: [ { name: sim-model, aliases: [m$s] } ]
  kvEvents: {}
  metrics: { interval: 1s }
  blockSize: 16
EOF
    done
    echo "---"
    echo "apiVersion: kinference.buoyant.io/v1alpha1"
    echo "kind: InferencePool"
    echo "metadata: { name: pool, namespace: sizing }"
    echo "spec:"
    echo "  destinations:"
    for s in $(seq 1 "$sets"); do echo "  - { kind: InferenceWorkerSet, name: set-$s }"; done
  } >"$cfg/bundle.yaml"
  "$BIN/kinference" serve --config "$cfg" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    >"$work/out-$sets" 2>"$work/err-$sets" &
  local gp=$!
  pids+=("$gp")
  sleep 10 # connect, discover, first scrapes
  local admin
  admin=$(head -1 "$work/out-$sets" | sed 's/.*"admin":"\([^"]*\)".*/\1/')
  local connected
  connected=$(curl -s "http://$admin/admin/status" | grep -o '"connected":true' | wc -l)
  local tick c0 c1 rss
  tick=$(getconf CLK_TCK)
  c0=$(awk '{print $14 + $15}' "/proc/$gp/stat")
  sleep "$T"
  c1=$(awk '{print $14 + $15}' "/proc/$gp/stat")
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$gp/status")
  kill "$gp"
  wait "$gp" 2>/dev/null || true
  local cores
  cores=$(awk -v a="$c0" -v b="$c1" -v t="$T" -v k="$tick" 'BEGIN { printf "%.4f", (b - a) / k / t }')
  echo "$((sets * W)) $rss $cores $connected"
}

read -r n1 rss1 cpu1 kv1 < <(measure 1)
read -r n2 rss2 cpu2 kv2 < <(measure "$S")
awk -v n1="$n1" -v r1="$rss1" -v c1="$cpu1" -v k1="$kv1" -v n2="$n2" -v r2="$rss2" -v c2="$cpu2" -v k2="$kv2" -v t="$T" 'BEGIN {
  mib_per = (r2 - r1) / 1024 / (n2 - n1); core_per = (c2 - c1) / (n2 - n1);
  base_mib = r1 / 1024 - mib_per * n1; base_core = c1 - core_per * n1;
  printf "{\"seconds\": %d, \"runs\": [{\"endpoints\": %d, \"kvConnected\": %d, \"rssMiB\": %.1f, \"cores\": %.4f}, {\"endpoints\": %d, \"kvConnected\": %d, \"rssMiB\": %.1f, \"cores\": %.4f}], ", t, n1, k1, r1/1024, c1, n2, k2, r2/1024, c2;
  printf "\"perEndpoint\": {\"MiB\": %.3f, \"cores\": %.5f}, \"baseline\": {\"MiB\": %.1f, \"cores\": %.4f}, ", mib_per, core_per, base_mib, base_core;
  printf "\"per100Workers\": {\"MiB\": %.1f, \"cores\": %.3f}, \"replicaWith100Workers\": {\"MiB\": %.1f, \"cores\": %.3f}}\n", mib_per * 100, core_per * 100, base_mib + mib_per * 100, base_core + core_per * 100;
}'
