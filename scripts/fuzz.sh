#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS_PER_TARGET (default 60), one at a time,
# and prints a summary: target, seconds, runs, crashes (new files in fuzz/artifacts/TARGET/).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]            # all targets
#   FUZZ_TARGETS="kv_events sse_tap" scripts/fuzz.sh 300
#   FUZZ_SANITIZER=address scripts/fuzz.sh 60       # default: none (the code has no unsafe)
#
# Needs a nightly toolchain for libFuzzer's flags. Without one, it uses the installed stable
# toolchain with RUSTC_BOOTSTRAP=1 (which lets stable accept the -Z flags cargo-fuzz passes).
# The seed corpora come from testdata/ (scripts/fuzz-seed.py); corpora and crash artifacts stay
# out of git (fuzz/.gitignore). Reproduce a crash: cargo +nightly fuzz run TARGET ARTIFACT.
# FUZZ_NO_BUILD=1 runs the binaries already in fuzz/target (built by an earlier run).
# Exit status: 0 when no target crashed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-60}"
SANITIZER="${FUZZ_SANITIZER:-none}"
TARGETS="${FUZZ_TARGETS:-policy_compile when_expr kv_events metrics_text openai_request anthropic_request sse_tap provider_stream}"
unset CARGO_TARGET_DIR

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  FUZZ=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  FUZZ=(cargo fuzz)
fi
python3 scripts/fuzz-seed.py

LOGS=fuzz/logs
mkdir -p "$LOGS"
# One build for every target (libFuzzer, debug assertions on, release optimizations).
[ "${FUZZ_NO_BUILD:-0}" = 1 ] || "${FUZZ[@]}" build --sanitizer "$SANITIZER" || exit 2
BIN="fuzz/target/$(rustc -vV | sed -n 's/^host: //p')/release"

declare -a rows
failed=0
for t in $TARGETS; do
  mkdir -p "fuzz/artifacts/$t" "fuzz/corpus/$t"
  before=$(ls "fuzz/artifacts/$t" | wc -l)
  log="$LOGS/$t.log"
  # The binary built above, run directly (no rebuild between targets).
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: an allocation blow-up.
  "$BIN/$t" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
  if [ -z "$runs" ]; then
    runs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
  fi
  after=$(ls "fuzz/artifacts/$t" | wc -l)
  crashes=$((after - before))
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    crashes="error(rc=$rc, see $log)"
  fi
  [ "$crashes" != 0 ] && failed=1
  rows+=("$(printf '%-18s %8s %12s  %s' "$t" "$SECS" "${runs:-?}" "$crashes")")
  echo "fuzz: $t done (runs ${runs:-?}, crashes $crashes)" >&2
done

printf '%-18s %8s %12s  %s\n' target seconds runs crashes
printf '%s\n' "${rows[@]}"
exit "$failed"
