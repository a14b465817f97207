#!/usr/bin/env python3
"""Checks the labels that deploy/'s Prometheus rules and Grafana dashboards use against the
labels docs/reference/metrics.md documents for each kinference_* metric.

- A selector `kinference_x{label=...}` may name only the metric's documented labels (plus `le`
  on a histogram's `_bucket`, and the labels Prometheus adds to every scraped series).
- An aggregation's `by (...)`, `on (...)` and `without (...)` may name only labels that some
  kinference_* metric of the same expression has (or `le`, or a scrape label). Expressions that
  read recorded series (`level:metric:op`) are not checked for these: the recording rule sets
  their labels.

The PromQL of docs/capacity.md and docs/reference/metrics.md (their ```promql blocks, `<...>`
placeholders read as numbers) is checked the same way, and the recorded series it reads must be
recorded by deploy/prometheus/rules.yaml.

The tables of metrics.md must match the families kinf-handler/src/metrics.rs registers, both
ways: every registered family is in a table with its type and exactly its labels, and every
family in a table is registered.

`python3 scripts/e2e/metrics_labels.py` checks deploy/ and the docs; `--selftest` checks that
the checker finds a wrong label in a selector and in a `by` clause, a recorded series that no
rule records, and a family whose labels differ from metrics.rs'; `--rules-file` prints every
expression of the dashboards and the docs as a rule file for `promtool check rules` (Grafana's
variables replaced), so that their syntax is checked too.
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


DOCS_WITH_PROMQL = ["docs/capacity.md", "docs/reference/metrics.md"]
PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>")


def promql_blocks(where, text):
    """(where, expr) of each expression of the ```promql blocks of a Markdown text: comment and
    blank lines separate expressions, an indented line continues the one before."""
    out = []
    for block in re.findall(r"```promql\n(.*?)```", text, re.S):
        cur = None
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                if cur:
                    out.append(cur)
                cur = None
            elif line[0].isspace() and cur is not None:
                cur += "\n" + line
            else:
                if cur:
                    out.append(cur)
                cur = line.strip()
        if cur:
            out.append(cur)
    # `<C>`, `<N * G>`, `"<ns>"`: numbers (or label values) the reader fills in.
    return [(f"{where}: `{e.splitlines()[0]}`", PLACEHOLDER.sub("1", e)) for e in out]


def exprs_of_docs():
    out = []
    for path in DOCS_WITH_PROMQL:
        out += promql_blocks(path, open(path).read())
    return out


def recorded_names():
    """The series deploy/prometheus/*.yaml record."""
    import yaml

    names = set()
    for path in sorted(glob.glob("deploy/prometheus/*.yaml")):
        for group in yaml.safe_load(open(path)).get("groups", []):
            for rule in group.get("rules", []):
                if rule.get("record"):
                    names.add(rule["record"])
    return names


def check_recorded(where, expr, recorded):
    return [
        f"{where}: reads `{name}`, which no rule of deploy/prometheus/ records"
        for name in RECORDED.findall(expr)
        if name not in recorded
    ]


def check_documented(where, expr, docs):
    return [
        f"{where}: `{m}` is not documented in docs/reference/metrics.md"
        for m in METRIC.findall(expr)
        if labels_of(m, docs) is None
    ]


def registered_families(src):
    """metric name (as exposed: counters with `_total`) -> (type, labels), from metrics.rs."""
    label_sets = {}
    for m in re.finditer(r"label_set!\(\s*(?:///[^\n]*\n\s*)*(\w+)\s*\{(.*?)\}\s*\);", src, re.S):
        body = re.sub(r"/\*\*.*?\*/", "", m.group(2), flags=re.S)
        label_sets[m.group(1)] = {f.strip() for f in body.split(",") if f.strip()}
    fields = dict(re.findall(r"pub\(crate\) (\w+): (.+),\n", src))
    out = {}
    registered = re.findall(
        r'r\.register\(\s*"([a-z0-9_]+)",\s*"(?:[^"\\]|\\.)*",\s*self\.(\w+)\.clone\(\),?\s*\)', src
    )
    for name, field in registered:
        ty = fields.get(field, "")
        m = re.match(r"(?:Family<(\w+),\s*(\w+)(?:,\s*\w+)?>|HistFamily<(\w+)>|(\w+))$", ty)
        if not m:
            out[name] = (f"unknown type `{ty}` of field `{field}`", set())
            continue
        labels = label_sets.get(m.group(1) or m.group(3) or "", set())
        kind = m.group(2) or ("Histogram" if m.group(3) else m.group(4))
        if kind in ("Counter", "FCounter"):
            out[name + "_total"] = ("counter", labels)
        elif kind in ("Gauge", "FGauge"):
            out[name] = ("gauge", labels)
        elif kind == "Histogram":
            out[name] = ("histogram", labels)
        else:
            out[name] = (f"unknown type `{ty}` of field `{field}`", labels)
    return out


def documented_families(doc_text):
    """metric name -> (type, labels) of the rows of metrics.md's tables."""
    out = {}
    for line in doc_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        m = re.fullmatch(r"`(kinference_[a-z0-9_]+)`", cells[0])
        if m:
            out[m.group(1)] = (cells[1], set(re.findall(r"`([a-z_][a-z0-9_]*)`", cells[2])))
    return out


def check_families(registered, documented):
    bad = []
    for name, (kind, labels) in sorted(registered.items()):
        if name not in documented:
            bad.append(f"metrics.rs registers `{name}` ({kind}), which no table of docs/reference/metrics.md has")
            continue
        dkind, dlabels = documented[name]
        if dkind != kind:
            bad.append(f"`{name}` is a {kind} in metrics.rs, a {dkind} in metrics.md")
        if dlabels != labels:
            bad.append(
                f"`{name}` has labels {sorted(labels)} in metrics.rs, {sorted(dlabels)} in metrics.md"
            )
    for name in sorted(set(documented) - set(registered)):
        bad.append(f"metrics.md documents `{name}`, which metrics.rs does not register")
    return bad


def grafana_to_promql(expr):
    """A dashboard expression as Prometheus would get it from Grafana."""
    for var, value in [("$__rate_interval", "5m"), ("$__range", "6h"), ("$__interval", "1m")]:
        expr = expr.replace(var, value)
    return re.sub(r"\$\w+", ".*", expr)


def rules_file(exprs):
    """A rule file with one recording rule per expression (for `promtool check rules`)."""
    import yaml

    rules = [{"record": f"check:expr_{i}:any", "expr": grafana_to_promql(e)} for i, (_, e) in enumerate(exprs)]
    return yaml.safe_dump({"groups": [{"name": "dashboards-and-docs", "rules": rules}]}, sort_keys=False)


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
    doc = "```promql\n# a\nsum by (tenant) (rate(kinference_tenant_cost_usd_total[5m]))\n  / 2\n<C> - tenant:kinference_nope:rate5m\n```\n"
    exprs = promql_blocks("selftest", doc)
    if [e for _, e in exprs] != [
        "sum by (tenant) (rate(kinference_tenant_cost_usd_total[5m]))\n  / 2",
        "1 - tenant:kinference_nope:rate5m",
    ]:
        sys.exit(f"selftest: promql blocks read as {exprs}")
    got = check_recorded("selftest", exprs[1][1], {"tenant:kinference_tokens:rate5m"})
    if not any("tenant:kinference_nope:rate5m" in g for g in got):
        sys.exit(f"selftest: an unknown recorded series was not refused (got {got})")
    src = (
        "label_set!(\n    /// `a`.\n    ALabels { /** A. */ a, /** B. */ b }\n);\n"
        "    pub(crate) x: Family<ALabels, Counter>,\n"
        '        r.register(\n            "kinference_x",\n            "X",\n            self.x.clone(),\n        );\n'
    )
    reg = registered_families(src)
    if reg != {"kinference_x_total": ("counter", {"a", "b"})}:
        sys.exit(f"selftest: metrics.rs read as {reg}")
    got = check_families(reg, {"kinference_x_total": ("counter", {"a"})})
    if not any("labels ['a', 'b'] in metrics.rs" in g for g in got):
        sys.exit(f"selftest: a label missing from metrics.md was not found (got {got})")
    print(f"metrics_labels selftest: ok ({len(cases) + 4} cases)")


def main():
    docs = documented_labels(open("docs/reference/metrics.md").read())
    if "--selftest" in sys.argv:
        selftest(docs)
        return
    exprs = exprs_of_deploy()
    doc_exprs = exprs_of_docs()
    if "--rules-file" in sys.argv:
        dashboards = [(w, e) for w, e in exprs if w.startswith("deploy/grafana/")]
        print(rules_file(dashboards + doc_exprs))
        return
    bad = []
    for where, expr in exprs:
        bad += check_expr(where, expr, docs)
    recorded = recorded_names()
    for where, expr in doc_exprs:
        bad += check_expr(where, expr, docs)
        bad += check_recorded(where, expr, recorded)
        bad += check_documented(where, expr, docs)
    doc_text = open("docs/reference/metrics.md").read()
    registered = registered_families(open("kinf-handler/src/metrics.rs").read())
    bad += check_families(registered, documented_families(doc_text))
    if bad:
        print("\n".join(bad), file=sys.stderr)
        sys.exit(1)
    print(
        f"ok: the labels of {len(exprs)} expressions of deploy/ and {len(doc_exprs)} of the docs "
        f"are documented; metrics.md's tables match the {len(registered)} families of metrics.rs"
    )


if __name__ == "__main__":
    main()
