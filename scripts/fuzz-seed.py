#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/TARGET/ from testdata/ and the
vLLM 0.32.0 captures (testdata/vllm-0.32.0-cpu). Generated, not committed (fuzz/.gitignore).

Input formats follow the targets in fuzz/fuzz_targets/: kv_events takes a mode byte and frames
separated by `|FR|`; openai_request takes a mode byte (even: chat, odd: completions);
sse_tap and provider_stream take a mode byte and a chunk-size byte before the stream bytes.
"""
import glob
import hashlib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
VLLM = os.path.join(ROOT, "testdata", "vllm-0.32.0-cpu")
SEP = b"|FR|"
counts = {}


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    counts[target] = counts.get(target, 0) + 1


def read(path):
    with open(path, "rb") as f:
        return f.read()


yamls = sorted(
    p
    for pat in ("testdata/**/*.yaml", "testdata/**/*.yml", "deploy/**/*.yaml", "docs/**/*.yaml")
    for p in glob.glob(os.path.join(ROOT, pat), recursive=True)
)

# policy_compile: every YAML bundle and example.
for p in yamls:
    put("policy_compile", read(p))

# when_expr: every `when:` condition in the YAML and the docs, plus a few hand-written ones.
when_re = re.compile(r"when:\s*(.+)$")
for p in yamls + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)):
    for line in read(p).decode("utf-8", "replace").splitlines():
        m = when_re.search(line)
        if m:
            e = m.group(1).strip().rstrip("`").strip()
            if len(e) >= 2 and e[0] == e[-1] and e[0] in "\"'":
                e = e[1:-1]
            if e and not e.startswith("|") and not e.startswith(">"):
                put("when_expr", e)
for e in [
    "promptTokens > 8000",
    'tenant == "acme" && qos in ["batch", "deferrable"]',
    '!(stream) || model matches "glm-*"',
    "queuedPrompts < 4 && kvCacheUsage < 0.8",
    '"pii-email" in tags',
]:
    put("when_expr", e)

# kv_events: payloads alone, live messages, replay replies.
for p in sorted(glob.glob(os.path.join(VLLM, "**", "*.jsonl"), recursive=True)):
    for line in read(p).decode().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        payload = bytes.fromhex(r.get("payload_hex", ""))
        seq = bytes.fromhex(r.get("seq_hex", "")) or int(r.get("seq", 0)).to_bytes(8, "big")
        topic = r.get("topic", "").encode()
        put("kv_events", b"\x00" + payload)
        put("kv_events", b"\x01" + SEP.join([topic, seq, payload]))
for p in sorted(glob.glob(os.path.join(VLLM, "**", "*frames*.txt"), recursive=True)):
    frames = []
    replay = "replay" in os.path.basename(p)
    for line in read(p).decode().splitlines() + ["#"]:
        m = re.match(r"frame\[\d+\]\s*([0-9a-fA-F]*)", line)
        if m:
            frames.append(bytes.fromhex(m.group(1)))
        elif frames:
            put("kv_events", (b"\x02" if replay else b"\x01") + SEP.join(frames))
            frames = []

# metrics_text: the real /metrics pages.
for p in sorted(glob.glob(os.path.join(VLLM, "**", "metrics*.txt"), recursive=True)):
    put("metrics_text", read(p))

# Request parsers.
chat = [
    {"model": "m", "messages": [{"role": "user", "content": "hello"}]},
    {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": [{"type": "text", "text": "a"}]}],
     "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 5},
    {"model": "m", "messages": [{"role": "tool", "content": [{"type": "tool_result", "content": "x"}]}],
     "max_tokens": 7},
]
completions = [
    {"model": "m", "prompt": "hello", "max_tokens": 3},
    {"model": "m", "prompt": ["a", "b"], "stream": True},
    {"model": "m", "prompt": [1, 2, 3]},
]
anthropic = [
    {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "be brief"}], "stream": True,
     "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]},
                  {"role": "assistant", "content": "b"}]},
]
for b in chat:
    put("openai_request", b"\x00" + json.dumps(b).encode())
for b in completions:
    put("openai_request", b"\x01" + json.dumps(b).encode())
for b in anthropic:
    put("anthropic_request", json.dumps(b))

# Streams: the captured SSE responses, chunked at a few sizes.
streams = {
    "chat_stream.txt": 0,
    "completion_stream.txt": 1,
    "messages_stream.txt": 2,
}
for name, api in streams.items():
    body = read(os.path.join(VLLM, name))
    for cut in (0, 7, 255):
        put("sse_tap", bytes([api, cut]) + body)
        put("sse_tap", bytes([api | 4, cut]) + body)
    # provider_stream: mode % 3 is the provider protocol, (mode // 3) % 3 the client API.
    protocol = 1 if api == 2 else 0
    for client in range(3):
        put("provider_stream", bytes([protocol + 3 * client, 31]) + body)
for name in ("chat1.json", "comp1.json", "messages_nonstream.json"):
    body = read(os.path.join(VLLM, name))
    protocol = 1 if name.startswith("messages") else 0
    put("provider_stream", bytes([protocol, 255]) + body)
    put("sse_tap", bytes([2 if protocol else 0, 255]) + body)

for t, n in sorted(counts.items()):
    print(f"{t}: {n} seeds", file=sys.stderr)
