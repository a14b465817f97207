#!/usr/bin/env bash
# The main job on the embedded default: compile the shipped example policies (the five seed
# examples), run their golden decision cases, and explain one decision.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kinference/target}"
cargo build --locked --release -q -p kinfctl
K="$CARGO_TARGET_DIR/release/kinfctl"
for d in testdata/policies/*/; do
  name=$(basename "$d")
  echo "== $name"
  "$K" lint "$d"
  "$K" test "$d" --cases "testdata/cases/$name" | tail -n 1
done
echo
echo "== kinfctl explain: a simple prompt for glm-5.3 while the warm glm worker is busy"
"$K" explain testdata/policies/smart-semantic-routing \
  --request testdata/examples/simple-glm-request.yaml \
  --state testdata/examples/warm-glm-busy-state.yaml
echo
echo "Try: $K graph testdata/policies/burst-to-cloud --format dot | dot -Tsvg > burst.svg"
