#!/usr/bin/env bash
# The main job on the embedded default: the Kinference gateway with the quick-start policies
# (deploy/quickstart) in front of three simulated vLLM 0.32 workers (`kinf-sim serve`, real
# HTTP, /metrics and ZMQ KV events), all in one process tree. Ctrl-C stops everything.
#
# Environment: KINF_LISTEN (default 127.0.0.1:8080), KINF_DEMO_SECONDS (stop after N seconds
# instead of waiting for Ctrl-C), KINF_SPEED (simulated GPU speed-up, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
source scripts/target-dir.sh
LISTEN=${KINF_LISTEN:-127.0.0.1:8080}
SPEED=${KINF_SPEED:-1}
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)" >&2; exit 1; }
echo "== building kinference, kinf-sim and kinfctl (release)"
cargo build --locked --release -q -p kinf-handler -p kinf-sim -p kinfctl
BIN="$CARGO_TARGET_DIR/release"
LOGS=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

echo "== kinfctl lint deploy/quickstart"
"$BIN/kinfctl" lint deploy/quickstart

# The worker addresses are fixed in deploy/quickstart/workers.yaml.
TOK="$ROOT/testdata/tokenizers/tiny-llama"
start_sim() { # PORT SERVED-NAME SEED
  "$BIN/kinf-sim" serve --port "$1" --model "$2" --served-model-name "$2" \
    --kv-events-port 0 --replay-port 0 --profile l40s-qwen27b-fp8 --speed "$SPEED" \
    --tokenizer "$TOK" --block-size 32 --seed "$3" >"$LOGS/sim-$1.out" 2>"$LOGS/sim-$1.err" &
  PIDS+=($!)
}
start_sim 18001 Qwen/Qwen3.6-27B 1
start_sim 18002 Qwen/Qwen3.6-27B 2
start_sim 18003 zai-org/GLM-5.3 3
for p in 18001 18002 18003; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$p/health" >/dev/null && break; sleep 0.1; done
  curl -sf "http://127.0.0.1:$p/health" >/dev/null || { echo "kinf-sim on :$p did not start:" >&2; cat "$LOGS/sim-$p.err" >&2; exit 1; }
done
echo "== 3 kinf-sim workers (profile l40s-qwen27b-fp8, speed ${SPEED}x) on :18001 :18002 (qwen) :18003 (glm)"

"$BIN/kinference" serve --config deploy/quickstart --listen "$LISTEN" >"$LOGS/kinference.out" 2>"$LOGS/kinference.err" &
PIDS+=($!)
for _ in $(seq 100); do curl -sf "http://$LISTEN/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "http://$LISTEN/readyz" >/dev/null || { echo "kinference did not become ready:" >&2; cat "$LOGS/kinference.err" >&2; exit 1; }
echo "== kinference is serving on http://$LISTEN (logs: $LOGS)"
echo
echo "A first request:"
curl -s -D - "http://$LISTEN/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"standard-model","messages":[{"role":"user","content":"Hello!"}],"max_tokens":8}' \
  | grep -iE '^x-kinference|"content"' | sed 's/^/  /'
cat <<TRY

Try it:
  curl -s http://$LISTEN/v1/models
  curl -s -i http://$LISTEN/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"standard-model","messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"stream":true}'
  curl -s http://$LISTEN/admin/status      # policy, endpoints, KV-event streams
  curl -s http://$LISTEN/metrics | grep kinference_

With the OpenAI SDK (pip install openai):
  python3 -c 'import openai; c = openai.OpenAI(base_url="http://$LISTEN/v1", api_key="none");
print(c.chat.completions.create(model="standard-model", max_tokens=16,
      messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content)'

With the Anthropic SDK (pip install anthropic):
  python3 -c 'import anthropic; c = anthropic.Anthropic(base_url="http://$LISTEN", api_key="none");
print(c.messages.create(model="qwen", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]).content[0].text)'

Edit deploy/quickstart/*.yaml while it runs: a bundle that compiles is applied live; one that
does not is refused (see /readyz) and the last good policy stays in force.
TRY
if [ -n "${KINF_DEMO_SECONDS:-}" ]; then
  sleep "$KINF_DEMO_SECONDS"
else
  echo "Ctrl-C to stop."
  wait
fi
