#!/usr/bin/env bash
# A cached Python venv with the clients the end-to-end tests use: the official OpenAI and
# Anthropic SDKs. Idempotent; prints the venv's python path on its last line.
set -euo pipefail
V=${KINF_PY_VENV:-$HOME/.cache/kinference/py-venv}
STAMP="$V/.kinference-py-1"
if [ ! -f "$STAMP" ]; then
  rm -rf "$V"
  python3 -m venv "$V"
  "$V/bin/pip" install -q -U pip
  "$V/bin/pip" install -q "openai>=1.60,<3" "anthropic>=0.40,<1" >&2
  touch "$STAMP"
fi
echo "$V/bin/python"
