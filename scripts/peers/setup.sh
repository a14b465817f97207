#!/usr/bin/env bash
# A cached Python venv with third-party routers to compare Kinference against (`kinf-bench proxy`,
# `kinf-bench live`) and to consume kinf-sim's KV events (scripts/e2e/vllm_router_kv_check.py):
# the `vllm-router` PyPI package (a Rust binary in a wheel), the `sglang-router` package (binary
# `smg` / `sglang-router`), plus pyzmq/msgpack/tokenizers for the checks. Idempotent; prints the
# venv's python path on its last line. Override the location with KINF_PEERS_VENV.
# GuideLLM (a heavier client) has its own venv: scripts/peers/setup-guidellm.sh.
set -euo pipefail
V=${KINF_PEERS_VENV:-$HOME/.cache/kinference/peers-venv}
VLLM_ROUTER_VERSION=${VLLM_ROUTER_VERSION:-0.1.17}
SGLANG_ROUTER_VERSION=${SGLANG_ROUTER_VERSION:-0.3.2}
STAMP="$V/.kinference-peers-2-$VLLM_ROUTER_VERSION"
if [ ! -f "$STAMP" ] || ! "$V/bin/vllm-router" --help >/dev/null 2>&1; then
  rm -rf "$V"
  python3 -m venv "$V"
  "$V/bin/pip" install -q -U pip >&2
  "$V/bin/pip" install -q "vllm-router==$VLLM_ROUTER_VERSION" pyzmq msgpack "tokenizers>=0.20,<1" >&2
  touch "$STAMP"
fi
# Added later, into the same venv (an existing venv is not rebuilt).
SG_STAMP="$V/.kinference-sglang-router-$SGLANG_ROUTER_VERSION"
if [ ! -f "$SG_STAMP" ]; then
  "$V/bin/pip" install -q "sglang-router==$SGLANG_ROUTER_VERSION" >&2
  touch "$SG_STAMP"
fi
echo "$V/bin/python"
