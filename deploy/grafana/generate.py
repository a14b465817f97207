#!/usr/bin/env python3
"""Writes the Kinference Grafana dashboards (deploy/grafana/*.json) from the panel lists below.

Run from anywhere: python3 deploy/grafana/generate.py. Metric names: docs/reference/metrics.md.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
DS = {"type": "prometheus", "uid": "${datasource}"}


def var_query(name, query, label=None, multi=True):
    return {
        "name": name,
        "label": label or name,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if multi else {},
        "sort": 1,
    }


def datasource_var():
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
    }


def panel(pid, title, targets, unit="short", x=0, y=0, w=12, h=8, kind="timeseries", desc=""):
    p = {
        "id": pid,
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [
            {"datasource": DS, "expr": e, "legendFormat": l, "refId": chr(ord("A") + i)}
            for i, (e, l) in enumerate(targets)
        ],
    }
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto"}
    return p


def dashboard(uid, title, panels, variables, tags):
    return {
        "uid": uid,
        "title": title,
        "tags": ["kinference"] + tags,
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [datasource_var()] + variables},
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["kinference"], "title": "Kinference", "asDropdown": True}],
        "panels": panels,
    }


def grid(specs):
    """Lays panels out two per row."""
    out = []
    for i, s in enumerate(specs):
        s = dict(s)
        s.setdefault("w", 12)
        s.setdefault("h", 8)
        s["x"] = 0 if i % 2 == 0 else 12
        s["y"] = (i // 2) * 8
        out.append(panel(i + 1, **s))
    return out


T = 'tenant=~"$tenant"'
M = 'model=~"$model"'
TM = f"{T},{M}"

def q(metric, quant, by):
    return f"histogram_quantile({quant}, sum by ({by}, le) (rate({metric}_bucket{{{TM}}}[$__rate_interval])))"

def share(metric):
    """Each tenant's share of a destination's total (as the `tenant:*_share:ratio_rate1h`
    rules): a share of every worker set and provider together is no share of any one's GPUs."""
    return (f"sum by (destination_namespace, destination, tenant) (rate({metric}{{{TM}}}[$__rate_interval]))"
            f" / on (destination_namespace, destination) group_left ()"
            f" sum by (destination_namespace, destination) (rate({metric}[$__rate_interval]))")

tenants = dashboard("kinference-tenants", "Kinference / Tenants", grid([
    dict(title="Requests by tenant and outcome", unit="reqps", targets=[
        (f"sum by (tenant, outcome) (rate(kinference_tenant_requests_total{{{TM}}}[$__rate_interval]))", "{{tenant}} {{outcome}}")]),
    dict(title="Rejections by tenant and code", unit="reqps", targets=[
        (f"sum by (tenant, code) (rate(kinference_tenant_requests_total{{{TM},outcome=~\"rejected|upstream_error\"}}[$__rate_interval]))", "{{tenant}} {{code}}")]),
    dict(title="Tokens/s by tenant and kind", unit="short", targets=[
        (f"sum by (tenant, kind) (rate(kinference_tenant_tokens_total{{{TM}}}[$__rate_interval]))", "{{tenant}} {{kind}}")]),
    dict(title="Cost per hour by tenant", unit="currencyUSD", targets=[
        (f"sum by (tenant) (rate(kinference_tenant_cost_usd_total{{{TM}}}[$__rate_interval])) * 3600", "{{tenant}}")]),
    dict(title="Cost over the range by tenant", unit="currencyUSD", kind="stat", targets=[
        (f"sum by (tenant) (increase(kinference_tenant_cost_usd_total{{{TM}}}[$__range]))", "{{tenant}}")]),
    dict(title="Share of decode-slot time, per destination", unit="percentunit", targets=[
        (share("kinference_tenant_decode_seconds_total"), "{{tenant}} on {{destination_namespace}}/{{destination}}")]),
    dict(title="Share of KV-cache occupancy, per destination", unit="percentunit", targets=[
        (share("kinference_tenant_kv_token_seconds_total"), "{{tenant}} on {{destination_namespace}}/{{destination}}")]),
    dict(title="TTFT p90 by tenant", unit="s", targets=[(q("kinference_ttft_seconds", 0.9, "tenant"), "{{tenant}}")]),
    dict(title="TPOT p90 by tenant", unit="s", targets=[(q("kinference_tpot_seconds", 0.9, "tenant"), "{{tenant}}")]),
    dict(title="Estimated usage (responses cut short)", unit="reqps", targets=[
        (f"sum by (tenant) (rate(kinference_tenant_usage_estimated_total{{{TM}}}[$__rate_interval]))", "{{tenant}}")]),
]), [var_query("tenant", "label_values(kinference_tenant_requests_total, tenant)"),
     var_query("model", "label_values(kinference_tenant_requests_total, model)")], ["tenants"])

models = dashboard("kinference-models", "Kinference / Models", grid([
    dict(title="Requests/s by model", unit="reqps", targets=[
        (f"sum by (model) (rate(kinference_tenant_requests_total{{{TM}}}[$__rate_interval]))", "{{model}}")]),
    dict(title="Output tokens/s by model", unit="short", targets=[
        (f"sum by (model) (rate(kinference_tenant_tokens_total{{{TM},kind=\"output\"}}[$__rate_interval]))", "{{model}}")]),
    dict(title="TTFT p50 / p90 / p99", unit="s", targets=[
        (q("kinference_ttft_seconds", 0.5, "model"), "p50 {{model}}"),
        (q("kinference_ttft_seconds", 0.9, "model"), "p90 {{model}}"),
        (q("kinference_ttft_seconds", 0.99, "model"), "p99 {{model}}")]),
    dict(title="ITL p50 / p90 / p99", unit="s", targets=[
        (q("kinference_itl_seconds", 0.5, "model"), "p50 {{model}}"),
        (q("kinference_itl_seconds", 0.9, "model"), "p90 {{model}}"),
        (q("kinference_itl_seconds", 0.99, "model"), "p99 {{model}}")]),
    dict(title="TPOT p50 / p90 / p99", unit="s", targets=[
        (q("kinference_tpot_seconds", 0.5, "model"), "p50 {{model}}"),
        (q("kinference_tpot_seconds", 0.9, "model"), "p90 {{model}}"),
        (q("kinference_tpot_seconds", 0.99, "model"), "p99 {{model}}")]),
    dict(title="End-to-end p50 / p90 / p99", unit="s", targets=[
        (q("kinference_e2e_latency_seconds", 0.5, "model"), "p50 {{model}}"),
        (q("kinference_e2e_latency_seconds", 0.9, "model"), "p90 {{model}}"),
        (q("kinference_e2e_latency_seconds", 0.99, "model"), "p99 {{model}}")]),
    dict(title="Prefix-cache hit ratio by model", unit="percentunit", targets=[
        (f"sum by (model) (rate(kinference_tenant_tokens_total{{{TM},kind=\"cached_prompt\"}}[$__rate_interval])) / sum by (model) (rate(kinference_tenant_tokens_total{{{TM},kind=~\".*prompt\"}}[$__rate_interval]))", "{{model}}")]),
    dict(title="Incomplete and failed responses by model", unit="reqps", targets=[
        (f"sum by (model, outcome) (rate(kinference_tenant_requests_total{{{TM},outcome!=\"completed\"}}[$__rate_interval]))", "{{model}} {{outcome}}")]),
]), [var_query("tenant", "label_values(kinference_tenant_requests_total, tenant)"),
     var_query("model", "label_values(kinference_tenant_requests_total, model)")], ["models"])

D = 'destination=~"$destination"'
pools = dashboard("kinference-pools", "Kinference / Pools and destinations", grid([
    dict(title="Decisions by rule", unit="reqps", targets=[
        (f"sum by (rule) (rate(kinference_decisions_total{{{D}}}[$__rate_interval]))", "{{rule}}")]),
    dict(title="Decisions by destination", unit="reqps", targets=[
        (f"sum by (destination_namespace, destination) (rate(kinference_decisions_total{{{D}}}[$__rate_interval]))", "{{destination_namespace}}/{{destination}}")]),
    dict(title="Responses by destination and outcome", unit="reqps", targets=[
        (f"sum by (destination_namespace, destination, outcome, status) (rate(kinference_responses_total{{{D}}}[$__rate_interval]))", "{{destination_namespace}}/{{destination}} {{status}} {{outcome}}")]),
    dict(title="Upstream TTFT p90 by endpoint", unit="s", targets=[
        (f"histogram_quantile(0.9, sum by (endpoint, le) (rate(kinference_upstream_ttft_seconds_bucket{{{D}}}[$__rate_interval])))", "{{endpoint}}")]),
    dict(title="TTFT prediction error p90", unit="s", targets=[
        (f"histogram_quantile(0.9, sum by (destination_namespace, destination, le) (rate(kinference_ttft_prediction_error_seconds_bucket{{{D}}}[$__rate_interval])))", "{{destination_namespace}}/{{destination}}")]),
    dict(title="Decision time p99", unit="s", targets=[
        ("histogram_quantile(0.99, sum by (le) (rate(kinference_decision_seconds_bucket[$__rate_interval])))", "p99")]),
    dict(title="Retries by endpoint", unit="reqps", targets=[
        ("sum by (endpoint) (rate(kinference_upstream_retries_total[$__rate_interval]))", "{{endpoint}}")]),
    dict(title="Cost per hour by destination", unit="currencyUSD", targets=[
        (f"sum by (destination_namespace, destination) (rate(kinference_tenant_cost_usd_total{{{D}}}[$__rate_interval])) * 3600", "{{destination_namespace}}/{{destination}}")]),
    dict(title="Policy generation", unit="none", kind="stat", targets=[("max(kinference_policy_generation)", "generation")]),
    dict(title="Policy refused", unit="none", kind="stat", targets=[("max(kinference_policy_refused)", "refused")]),
]), [var_query("destination", "label_values(kinference_decisions_total, destination)")], ["pools"])

slos = dashboard("kinference-slos", "Kinference / Service objectives", grid([
    dict(title="Attainment (5m) vs objective", unit="percentunit", targets=[
        ('sum by (slo) (rate(kinference_slo_good_total{slo=~"$slo"}[5m])) / sum by (slo) (rate(kinference_slo_requests_total{slo=~"$slo"}[5m]))', "{{slo}}"),
        ('max by (slo) (kinference_slo_objective{slo=~"$slo"})', "objective {{slo}}")]),
    dict(title="Attainment over the range", unit="percentunit", kind="stat", targets=[
        ('sum by (slo) (increase(kinference_slo_good_total{slo=~"$slo"}[$__range])) / sum by (slo) (increase(kinference_slo_requests_total{slo=~"$slo"}[$__range]))', "{{slo}}")]),
    dict(title="Burn rate (1h)", unit="none", targets=[
        ('(1 - sum by (slo) (rate(kinference_slo_good_total{slo=~"$slo"}[1h])) / sum by (slo) (rate(kinference_slo_requests_total{slo=~"$slo"}[1h]))) / on (slo) group_left () (1 - max by (slo) (kinference_slo_objective{slo=~"$slo"}))', "{{slo}}")]),
    dict(title="Attainment by tenant (5m)", unit="percentunit", targets=[
        ('sum by (slo, tenant) (rate(kinference_slo_good_total{slo=~"$slo"}[5m])) / sum by (slo, tenant) (rate(kinference_slo_requests_total{slo=~"$slo"}[5m]))', "{{slo}} {{tenant}}")]),
    dict(title="Gateway rolling attainment (5m)", unit="percentunit", targets=[
        ('kinference_slo_attainment_5m{slo=~"$slo"}', "{{slo}} {{instance}}")]),
    dict(title="Bad requests/s", unit="reqps", targets=[
        ('sum by (slo) (rate(kinference_slo_requests_total{slo=~"$slo"}[$__rate_interval])) - sum by (slo) (rate(kinference_slo_good_total{slo=~"$slo"}[$__rate_interval]))', "{{slo}}")]),
]), [var_query("slo", "label_values(kinference_slo_objective, slo)")], ["slo"])

W = 'worker_set=~"$worker_set"'
# Every gateway replica exports the same load gauges: `max by (worker_set, endpoint)` counts each
# endpoint once (a sum over replicas would multiply by their number).
capacity = dashboard("kinference-capacity", "Kinference / Capacity", grid([
    dict(title="KV-cache usage by endpoint", unit="percentunit", targets=[
        (f"max by (worker_set, endpoint) (kinference_endpoint_kv_usage_ratio{{{W}}})", "{{endpoint}}")]),
    dict(title="Queued and running requests", unit="short", targets=[
        (f"sum by (worker_set) (max by (worker_set, endpoint) (kinference_endpoint_queued_requests{{{W}}}))", "queued {{worker_set}}"),
        (f"sum by (worker_set) (max by (worker_set, endpoint) (kinference_endpoint_running_requests{{{W}}}))", "running {{worker_set}}")]),
    dict(title="Busy fraction (1h)", unit="percentunit", targets=[
        (f"avg_over_time((max by (worker_set, endpoint) (kinference_endpoint_running_requests{{{W}}}) > bool 0)[1h:1m])", "{{endpoint}}")]),
    dict(title="Routable endpoints", unit="none", targets=[
        (f"sum by (worker_set) (max by (worker_set, endpoint) (kinference_endpoint_routable{{{W}}}))", "{{worker_set}}")]),
    dict(title="Tokens/s per endpoint", unit="short", targets=[
        ("sum by (endpoint, kind) (rate(kinference_endpoint_tokens_total[$__rate_interval]))", "{{endpoint}} {{kind}}")]),
    dict(title="Requests in flight per endpoint (gateway view)", unit="short", targets=[
        ("sum by (endpoint) (rate(kinference_endpoint_request_seconds_total[$__rate_interval]))", "{{endpoint}}")]),
    dict(title="Headroom: KV-cache free by worker set", unit="percentunit", targets=[
        (f"1 - avg by (worker_set) (max by (worker_set, endpoint) (kinference_endpoint_kv_usage_ratio{{{W}}}))", "{{worker_set}}")]),
    dict(title="Load sample age", unit="s", targets=[
        (f"max by (worker_set, endpoint) (kinference_endpoint_load_age_seconds{{{W}}})", "{{endpoint}}")]),
]), [var_query("worker_set", "label_values(kinference_endpoint_routable, worker_set)")], ["capacity"])

# KINF_GRAFANA_OUT=DIR writes there instead (scripts/e2e/prometheus_check.sh compares the
# output with the committed dashboards).
OUT = os.environ.get("KINF_GRAFANA_OUT", HERE)
for name, d in [("tenants", tenants), ("models", models), ("pools", pools), ("slos", slos), ("capacity", capacity)]:
    with open(os.path.join(OUT, f"kinference-{name}.json"), "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")
