#!/usr/bin/env bash
# A cached Python venv with Microsoft Presidio's analyzer (`presidio-analyzer` from PyPI), used by
# scripts/presidio/eval.py to compare its predefined pattern recognizers with Kinference's
# built-in `pii` classifier on testdata/classify/. No spaCy model is downloaded: eval.py calls
# the pattern recognizers directly. Idempotent; prints the venv's python path on its last line.
# Override the location with KINF_PRESIDIO_VENV and the version with PRESIDIO_VERSION.
set -euo pipefail
V=${KINF_PRESIDIO_VENV:-$HOME/.cache/kinference/presidio-venv}
PRESIDIO_VERSION=${PRESIDIO_VERSION:-2.2.366}
STAMP="$V/.kinference-presidio-$PRESIDIO_VERSION"
if [ ! -f "$STAMP" ]; then
  rm -rf "$V"
  python3 -m venv "$V"
  "$V/bin/pip" install -q -U pip >&2
  "$V/bin/pip" install -q "presidio-analyzer==$PRESIDIO_VERSION" >&2
  touch "$STAMP"
fi
echo "$V/bin/python"
