#!/usr/bin/env python3
"""Checks the labels that deploy/'s Prometheus rules and Grafana dashboards use against the
labels docs/reference/metrics.md documents for each kinference_* metric.

- A selector `kinference_x{label=...}` may name only the metric's documented labels (plus `le`
  on a histogram's `_bucket`, and the labels Prometheus adds to every scraped series).
- An aggregation's `by (...)`, `on (...)` and `without (...)` may name only labels that some
  kinference_* metric of the same expression has (or `le`, or a scrape label). Expressions that
  read recorded series (`level:metric:op`) are not checked for these: the recording rule sets
  their labels.

`python3 scripts/e2e/metrics_labels.py` checks deploy/; `--selftest` checks that the checker
finds a wrong label in a selector and in a `by` clause.
"""

import glob
import json
import re
import sys

# Labels Prometheus (and Kubernetes service discovery) add to every scraped series.
SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "service", "container"}
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")
SELECTOR = re.compile(r"\b(kinference_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")
METRIC = re.compile(r"(?<![:\w])(kinference_[a-z0-9_]+)(?![:\w])")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")


def documented_labels(doc_text):
    """metric name -> set of labels, from the tables of metrics.md."""
    out = {}
    for line in doc_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        m = re.fullmatch(r"`(kinference_[a-z0-9_]+)`", cells[0])
        if not m:
            continue
        out[m.group(1)] = set(re.findall(r"`([a-z_][a-z0-9_]*)`", cells[2]))
    return out


def labels_of(metric, docs):
    """The labels a series of `metric` may carry (None when the metric is not documented)."""
    base = HISTOGRAM_SUFFIX.sub("", metric)
    labels = docs.get(metric)
    if labels is None:
        labels = docs.get(base)
        if labels is None:
            return None
        if metric.endswith("_bucket"):
            labels = labels | {"le"}
    return labels | SCRAPE_LABELS


def check_expr(where, expr, docs):
    """Problems with the labels of one PromQL expression."""
    bad = []
    known = set()
    for metric in METRIC.findall(expr):
        labels = labels_of(metric, docs)
        if labels is not None:
            known |= labels
    for metric, matchers in SELECTOR.findall(expr):
        labels = labels_of(metric, docs)
        if labels is None:
            continue  # reported by the "documented" check
        for label, _ in MATCHER.findall(matchers):
            if label not in labels:
                bad.append(
                    f"{where}: `{metric}` has no label `{label}` "
                    f"(documented: {', '.join(sorted(labels - SCRAPE_LABELS)) or 'none'})"
                )
    if RECORDED.search(expr) or not known:
        return bad
    for clause, names in GROUPING.findall(expr):
        for label in [n.strip() for n in names.split(",") if n.strip()]:
            if label not in known:
                bad.append(
                    f"{where}: `{clause} ({names})` names `{label}`, which no metric of the "
                    f"expression has"
                )
    return bad


def exprs_of_deploy():
    """(where, expr) for every dashboard target and every rule."""
    out = []
    for path in sorted(glob.glob("deploy/grafana/*.json")):
        d = json.load(open(path))
        for p in d.get("panels", []):
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"{path}: panel `{p.get('title')}`", t["expr"]))
    for path in sorted(glob.glob("deploy/prometheus/*.yaml")):
        import yaml  # PyYAML, from the Debian packages the tests install

        doc = yaml.safe_load(open(path))
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("record") or rule.get("alert")
                out.append((f"{path}: rule `{name}`", str(rule.get("expr", ""))))
    return out


def selftest(docs):
    cases = [
        ('sum(rate(kinference_tenant_requests_total{tenants="a"}[5m]))', "no label `tenants`"),
        ("sum by (tenant, modle) (rate(kinference_tenant_tokens_total[5m]))", "names `modle`"),
        ("histogram_quantile(0.9, sum by (model, le) (rate(kinference_ttft_seconds_bucket[5m])))", None),
    ]
    for expr, want in cases:
        got = check_expr("selftest", expr, docs)
        if want is None and got:
            sys.exit(f"selftest: a correct expression was refused: {got}")
        if want is not None and not any(want in g for g in got):
            sys.exit(f"selftest: `{expr}` was not refused for {want!r} (got {got})")
    print(f"metrics_labels selftest: ok ({len(cases)} cases)")


def main():
    docs = documented_labels(open("docs/reference/metrics.md").read())
    if "--selftest" in sys.argv:
        selftest(docs)
        return
    bad = []
    exprs = exprs_of_deploy()
    for where, expr in exprs:
        bad += check_expr(where, expr, docs)
    if bad:
        print("\n".join(bad), file=sys.stderr)
        sys.exit(1)
    print(f"ok: the labels of {len(exprs)} expressions are documented")


if __name__ == "__main__":
    main()
