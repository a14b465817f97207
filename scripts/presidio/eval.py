#!/usr/bin/env python3
"""Scores Microsoft Presidio's predefined pattern recognizers on a labelled JSONL corpus.

Usage (the venv comes from scripts/presidio/setup.sh):

    PY=$(bash scripts/presidio/setup.sh | tail -1)
    "$PY" scripts/presidio/eval.py testdata/classify/corpus.jsonl [--threshold 0.0]

Reads the same file as `kinfctl classify --eval FILE --format json` (one object per line,
`{"text": ...}` or `{"messages": [...]}`, with `"tags"` the expected tags) and prints the same
JSON shape: {"examples", "tags": [{"tag", "tp", "fp", "fn", "precision", "recall"}],
"mistakes": [{"line", "tag", "kind"}]}, plus "latency_us" (p50 and p99 per prompt, every
recognizer over every message) and "recognizers".

Only the `pii-*` family is scored (Presidio has no complexity classifier). Every message of a
request is analysed, like Kinference does, and a prompt is tagged `pii-<entity>` when any
recognizer of that entity returns a result with score >= --threshold (default 0: every match
counts; Presidio's own AnalyzerEngine default is also 0). No spaCy model and no NLP engine are
used: the pattern recognizers are called directly with nlp_artifacts=None, so there is no
context-word score boost. Presidio has no recognizer for credentials (cloud keys, JWTs, private
keys): `pii-credential` is never produced. tldextract (used by the e-mail recognizer) is pinned
to its bundled public-suffix snapshot so the run is offline and repeatable.
"""

import argparse
import json
import statistics
import sys
import time

import tldextract

# Offline and repeatable: the bundled suffix list, no download.
tldextract.extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

from presidio_analyzer.predefined_recognizers import (  # noqa: E402
    CreditCardRecognizer,
    EmailRecognizer,
    IbanRecognizer,
    IpRecognizer,
    PhoneRecognizer,
    UsSsnRecognizer,
)

# Kinference tag -> the Presidio recognizers standing for it.
RECOGNIZERS = {
    "pii-email": [EmailRecognizer()],
    "pii-phone": [PhoneRecognizer()],
    "pii-ssn": [UsSsnRecognizer()],
    "pii-credit-card": [CreditCardRecognizer()],
    "pii-iban": [IbanRecognizer()],
    "pii-ip-address": [IpRecognizer()],
}


def messages(obj):
    """The message texts, as kinf_router::classify::eval::messages_from_json reads them."""
    if isinstance(obj.get("text"), str):
        return [obj["text"]]
    out = []
    for m in obj.get("messages", []):
        c = m.get("content")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out.append(
                "\n".join(
                    p["text"]
                    for p in c
                    if isinstance(p, dict)
                    and p.get("type", "text") == "text"
                    and isinstance(p.get("text"), str)
                )
            )
    return out


def classify(texts, threshold):
    tags = set()
    for tag, recs in RECOGNIZERS.items():
        for rec in recs:
            for t in texts:
                if not t:
                    continue
                results = rec.analyze(t, rec.supported_entities, nlp_artifacts=None) or []
                if any(r.score >= threshold for r in results):
                    tags.add(tag)
                    break
            if tag in tags:
                break
    if tags:
        tags.add("pii-detected")
    return tags


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--threshold", type=float, default=0.0)
    args = ap.parse_args()
    examples = []
    for f in args.files:
        with open(f, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if line.strip():
                    examples.append((i, json.loads(line)))
    stats = {}
    mistakes = []
    lat = []
    # Warm-up: compile patterns, load phone metadata.
    classify(["warm up +1 202 555 0143 a@b.example 10.1.2.3"], args.threshold)
    for line, obj in examples:
        texts = messages(obj)
        t0 = time.perf_counter()
        got = classify(texts, args.threshold)
        lat.append((time.perf_counter() - t0) * 1e6)
        want = {t for t in obj.get("tags", []) if t.startswith("pii-")}
        for t in sorted(got):
            s = stats.setdefault(t, [0, 0, 0])
            if t in want:
                s[0] += 1
            else:
                s[1] += 1
                mistakes.append({"line": line, "tag": t, "kind": "fp"})
        for t in sorted(want - got):
            stats.setdefault(t, [0, 0, 0])[2] += 1
            mistakes.append({"line": line, "tag": t, "kind": "fn"})

    def ratio(a, b):
        return 1.0 if b == 0 else a / b

    lat.sort()
    report = {
        "examples": len(examples),
        "tags": [
            {
                "tag": t,
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "precision": ratio(tp, tp + fp),
                "recall": ratio(tp, tp + fn),
            }
            for t, (tp, fp, fn) in sorted(stats.items())
        ],
        "mistakes": mistakes,
        "latency_us": {
            "p50": round(statistics.median(lat), 1) if lat else 0.0,
            "p99": round(lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))], 1) if lat else 0.0,
        },
        "threshold": args.threshold,
        "recognizers": {
            t: [type(r).__name__ for r in rs] for t, rs in RECOGNIZERS.items()
        },
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
