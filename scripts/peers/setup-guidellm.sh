#!/usr/bin/env bash
# A cached Python venv with GuideLLM (PyPI `guidellm`), the real load generator `kinf-bench live
# --client guidellm` drives. Separate from the peers venv (scripts/peers/setup.sh) because it is
# much larger and only the live benchmark needs it (not CI). Idempotent; prints the `guidellm`
# executable's path on its last line. Override the location with KINF_GUIDELLM_VENV.
set -euo pipefail
V=${KINF_GUIDELLM_VENV:-$HOME/.cache/kinference/guidellm-venv}
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
STAMP="$V/.kinference-guidellm-$GUIDELLM_VERSION"
if [ ! -f "$STAMP" ] || ! "$V/bin/guidellm" --help >/dev/null 2>&1; then
  rm -rf "$V"
  python3 -m venv "$V"
  "$V/bin/pip" install -q -U pip >&2
  "$V/bin/pip" install -q "guidellm==$GUIDELLM_VERSION" >&2
  touch "$STAMP"
fi
echo "$V/bin/guidellm"
