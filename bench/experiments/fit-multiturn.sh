#!/usr/bin/env bash
# Fits the multiturn workload's conversation sizes to the published medians (NOTES.md §4:
# 1.70 s under random routing, 0.59 s under Kinference) and prints every grid point, then the
# best eight. For each FIRST,USER pair of the grid (256 output tokens, as in the other
# workloads) it runs the report's light-load simulations (l40s-qwen27b-fp8, 3 workers,
# 0.025 conversations/s, seeds 1-3) under `random` and `kinference` and scores the pair by
# ln(random / 1.70)^2 + ln(kinference / 0.59)^2 over the means of the runs' median TTFTs.
# The default of `--multiturn-sizes` (bench/src/sim/workload.rs) is its best pair.
#
#   bench/experiments/fit-multiturn.sh [BIN]      # ≈ 1 min on an idle 2-core VM
#
# BIN: the kinf-bench binary (default target/release/kinf-bench).
set -euo pipefail
BIN=${1:-target/release/kinf-bench}
[[ -x $BIN ]] || { echo "$BIN: not found; cargo build --release -p kinf-bench" >&2; exit 2; }
exec python3 - "$BIN" <<'PY'
import json, math, subprocess, sys

BIN = sys.argv[1]
PUBLISHED = {"random": 1.70, "kinference": 0.59}

def median_ttft(router, first, user, seed):
    out = subprocess.run(
        [BIN, "sim", "--workload", "multiturn", "--router", router, "--seed", str(seed),
         "--multiturn-sizes", f"{first},{user},256", "--format", "json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ttft_p50_s"]

rows = []
print("| FIRST | USER | random p50 s | kinference p50 s | reduction | error |")
print("|---|---|---|---|---|---|")
for first in range(4000, 6001, 250):
    for user in range(950, 1151, 25):
        m = {r: sum(median_ttft(r, first, user, s) for s in (1, 2, 3)) / 3 for r in PUBLISHED}
        err = sum(math.log(m[r] / PUBLISHED[r]) ** 2 for r in PUBLISHED)
        row = (err, first, user, m["random"], m["kinference"])
        rows.append(row)
        print("| %d | %d | %.3f | %.3f | %.1f %% | %.5f |"
              % (first, user, m["random"], m["kinference"], 100 * (1 - m["kinference"] / m["random"]), err),
              flush=True)
rows.sort()
print("\nBest eight (published: random 1.70 s, kinference 0.59 s, -65 %):")
for err, first, user, rnd, kinf in rows[:8]:
    print("  --multiturn-sizes %d,%d,256: random %.3f s, kinference %.3f s, %.1f %%, error %.5f"
          % (first, user, rnd, kinf, 100 * (1 - kinf / rnd), err))
PY
