#!/usr/bin/env bash
# Checks the Prometheus rules and Grafana dashboards in deploy/:
#   - promtool check rules deploy/prometheus/*.yaml
#   - promtool test rules deploy/prometheus/tests/*.yaml (the queries of docs/capacity.md, on
#     synthetic series)
#   - deploy/grafana/*.json are what deploy/grafana/generate.py writes
#   - every deploy/grafana/*.json parses as JSON and has uid, title, schemaVersion and panels
#     whose targets have an expression
#   - every kinference_* metric the rules and dashboards use is documented in
#     docs/reference/metrics.md (recording-rule names aside)
#   - every label a rule or dashboard selects or groups by is one metrics.md documents for
#     the metric (scripts/e2e/metrics_labels.py, which first checks itself with --selftest); the
#     same for the PromQL of docs/capacity.md and docs/reference/metrics.md, whose recorded
#     series must be ones rules.yaml records; metrics.md's tables match the families
#     kinf-handler/src/metrics.rs registers (names, types, labels), both ways
#   - the PromQL of every dashboard panel and of those docs parses (promtool check rules on
#     them as recording rules)
#   - with KINF_METRICS_FILE=path (a saved /metrics body): promtool check metrics on it
# Needs promtool (Debian: apt-get install -y prometheus), python3 and PyYAML (python3-yaml).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool not found: apt-get install -y prometheus" >&2
  exit 1
fi

promtool check rules deploy/prometheus/*.yaml
promtool test rules deploy/prometheus/tests/*.yaml

# The committed dashboards are the generator's output (edits go into generate.py).
gen=$(mktemp -d)
KINF_GRAFANA_OUT="$gen" python3 deploy/grafana/generate.py
for f in "$gen"/*.json; do
  if ! diff -q "$f" "deploy/grafana/$(basename "$f")" >/dev/null; then
    echo "deploy/grafana/$(basename "$f") differs from deploy/grafana/generate.py's output: edit the generator and run it" >&2
    diff -u "deploy/grafana/$(basename "$f")" "$f" | head -20 >&2
    exit 1
  fi
done
rm -rf "$gen"

python3 - <<'PY'
import glob, json, re, sys

doc = open("docs/reference/metrics.md").read()
documented = set(re.findall(r"`(kinference_[a-z0-9_]+)`", doc))
suffix = re.compile(r"_(bucket|sum|count)$")
bad = []
used = set()
for path in sorted(glob.glob("deploy/grafana/*.json")):
    try:
        d = json.load(open(path))
    except json.JSONDecodeError as e:
        bad.append(f"{path}: not JSON: {e}")
        continue
    for key in ("uid", "title", "schemaVersion", "panels"):
        if key not in d:
            bad.append(f"{path}: no `{key}`")
    for p in d.get("panels", []):
        for t in p.get("targets", []):
            if not t.get("expr"):
                bad.append(f"{path}: panel `{p.get('title')}` has a target without expr")
            used.update(re.findall(r"\b(kinference_[a-z0-9_]+)", t.get("expr", "")))
    print(f"ok {path} ({len(d.get('panels', []))} panels)")
for path in sorted(glob.glob("deploy/prometheus/*.yaml")):
    text = open(path).read()
    # Recording-rule names (`level:kinference_...:op`) are not exposed by the gateway.
    used.update(m for m in re.findall(r"(?<![:\w])(kinference_[a-z0-9_]+)(?![:\w])", text))
for m in sorted(used):
    if m not in documented and suffix.sub("", m) not in documented:
        bad.append(f"metric `{m}` is used but not documented in docs/reference/metrics.md")
if bad:
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"ok: {len(used)} metric names used, all documented")
PY

python3 scripts/e2e/metrics_labels.py --selftest
python3 scripts/e2e/metrics_labels.py

# The dashboards' and the docs' PromQL parses (the rules' is checked above).
exprs=$(mktemp -d)
python3 scripts/e2e/metrics_labels.py --rules-file >"$exprs/dashboards_and_docs.yaml"
promtool check rules "$exprs/dashboards_and_docs.yaml"
rm -rf "$exprs"

if [[ -n "${KINF_METRICS_FILE:-}" ]]; then
  promtool check metrics <"$KINF_METRICS_FILE"
fi
echo "prometheus_check: ok"
