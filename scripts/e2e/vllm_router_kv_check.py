#!/usr/bin/env python3
"""A third-party consumer of kinf-sim's KV events: vllm-router's `kv_aware` policy.

Starts two `kinf-sim serve` workers with ZMQ KV events (vLLM 0.32 wire format), starts
`vllm-router --policy kv_aware` subscribed to their publishers (`--kv-event-source
WORKER_URL=tcp://…`, `--kv-event-replay-source`), and checks that requests land on the worker
that holds their prompt's blocks (the worker's `usage.prompt_tokens_details.cached_tokens`).

The discriminating checks seed a prompt on a chosen worker *directly* (not through the router),
so that only the KV events tell the router where its blocks are: a router that ignored them
(vllm-router falls back to least-load, which picks the first idle worker) would miss.

vllm-router 0.1.17 needs two things from a worker (references are to its sdist), which kinf-sim
gives as vLLM does:

- the ZMQ topic: static `--kv-event-source` subscriptions use topic "" (vLLM's default,
  `KVEventsConfig.topic`; src/kv_index/discovery.rs, `topic: String::new()`) and drop every
  frame whose topic is not exactly that (src/kv_index/subscriber.rs); kinf-sim's default topic is
  also "" (`--topic kv-events` reproduces the miss);
- token ids: for HTTP workers vllm-router asks the worker, `POST /v1/chat/completions/render`
  first, then `POST /tokenize` (src/backend/preprocess.rs, `http_kv_input` and the
  `render_unavailable` fallback); kinf-sim serves `/tokenize` like vLLM 0.32. Against a worker
  without it, this script puts a small stand-in in front that answers `POST /tokenize` (chat
  template + the `tokenizers` package) after checking its token count against the worker's
  `usage.prompt_tokens`; `--no-shim` runs without it (the directed checks then fail).

Run with the peers venv (scripts/peers/setup.sh):
    $(bash scripts/peers/setup.sh) scripts/e2e/vllm_router_kv_check.py
Prints `vllm_router_kv_check: N passed, M failed` last; exits 1 on any failure.
"""

import argparse
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
BLOCK = 16

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        return e.code, None


def chat(base, content):
    st, j = http_json(f"{base}/v1/chat/completions",
                      {"model": MODEL, "messages": [{"role": "user", "content": content}],
                       "max_tokens": 1})
    if st != 200 or j is None:
        raise RuntimeError(f"POST {base}/v1/chat/completions: HTTP {st}")
    return j["usage"]


def metric(base, name):
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def document(tag, words=1500):
    """A prompt of ≈2k tokens whose first words differ per tag."""
    vocab = ("river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "thunder",
             "garden", "silver", "orchard", "canyon", "ember", "glacier", "willow", "quartz")
    x = sum(ord(c) * 131 ** i for i, c in enumerate(tag)) | 1
    out = [f"Document {tag}."]
    for _ in range(words):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(vocab[(x >> 33) % len(vocab)])
    return " ".join(out)


class Tokenize:
    """vLLM's `POST /tokenize` for chat messages: the tokenizer directory's chat template,
    rendered for this template's shape (bos, header-wrapped messages, generation prompt), then
    `tokenizers` without extra special tokens (as vLLM and kinf-sim do for chat)."""

    def __init__(self, tok_dir):
        from tokenizers import Tokenizer  # peers venv
        self.tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
        cfg = json.loads((Path(tok_dir) / "tokenizer_config.json").read_text())
        self.bos = cfg.get("bos_token", "")
        tpl = cfg.get("chat_template", "")
        if "<|start_header_id|>" not in tpl:
            raise RuntimeError("stand-in /tokenize only knows the Llama-3 style template")

    def render(self, messages, add_generation_prompt=True):
        s = self.bos
        for m in messages:
            c = m.get("content")
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
            s += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{c}<|eot_id|>"
        if add_generation_prompt:
            s += "<|start_header_id|>assistant<|end_header_id|>\n\n"
        return s

    def ids(self, body):
        if "messages" in body:
            text = self.render(body["messages"], body.get("add_generation_prompt", True))
            return self.tok.encode(text, add_special_tokens=False).ids
        return self.tok.encode(body.get("prompt", ""),
                               add_special_tokens=body.get("add_special_tokens", True)).ids


def start_shim(upstream, tokenize, max_model_len):
    """An HTTP server answering POST /tokenize and forwarding every other request upstream."""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, code, body, ctype="application/json"):
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def handle_any(self):
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else None
            if self.command == "POST" and self.path == "/tokenize":
                ids = tokenize.ids(json.loads(raw or b"{}"))
                H.tokenize_calls += 1
                return self.reply(200, json.dumps({"count": len(ids), "max_model_len": max_model_len,
                                                   "tokens": ids, "token_strs": None}).encode())
            req = urllib.request.Request(upstream + self.path, raw, method=self.command)
            if self.headers.get("content-type"):
                req.add_header("content-type", self.headers["content-type"])
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    self.reply(r.status, r.read(), r.headers.get("content-type", "application/json"))
            except urllib.error.HTTPError as e:
                self.reply(e.code, e.read(), e.headers.get("content-type", "application/json"))

        do_GET = do_POST = handle_any

    H.tokenize_calls = 0
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, H


def default_sim():
    tgt = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    for p in (tgt / "release/kinf-sim", tgt / "debug/kinf-sim"):
        if p.exists():
            return str(p)
    return "kinf-sim"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinf-sim", default=default_sim())
    ap.add_argument("--vllm-router", default=str(Path(sys.executable).parent / "vllm-router"))
    ap.add_argument("--tokenizer", default=str(ROOT / "testdata/tokenizers/tiny-llama"))
    ap.add_argument("--speed", default="1000")
    ap.add_argument("--prompts", type=int, default=6, help="prompts of the directed check")
    ap.add_argument("--topic", default="",
                    help="kinf-sim --topic; vllm-router's static sources only accept vLLM's default, ''")
    ap.add_argument("--no-shim", action="store_true",
                    help="never put the /tokenize stand-in in front of the workers")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vllm-router-kv-"))
    procs = []
    try:
        # Two kinf-sim workers with KV events.
        sims = []
        for i in range(2):
            err = open(work / f"sim-{i}.log", "w")
            p = subprocess.Popen(
                [a.kinf_sim, "serve", "--port", "0", "--model", MODEL, "--profile", "tiny",
                 "--speed", a.speed, "--kv-events-port", "0", "--replay-port", "0",
                 "--block-size", str(BLOCK), "--max-model-len", "8192", "--num-gpu-blocks", "4096",
                 "--tokenizer", a.tokenizer, "--seed", str(i), "--topic", a.topic],
                stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, "RUST_LOG": "warn"})
            procs.append(p)
            line = json.loads(p.stdout.readline())
            sims.append(line)
        direct = [f"http://{s['http']}" for s in sims]

        # vllm-router asks the worker for token ids; does kinf-sim answer?
        st, _ = http_json(f"{direct[0]}/tokenize", {"model": MODEL, "messages": [
            {"role": "user", "content": "hi"}]})
        sim_tokenizes = st == 200
        print(f"kinf-sim POST /tokenize: HTTP {st}", flush=True)
        shims = []
        if sim_tokenizes or a.no_shim:
            urls = direct
        else:
            tok = Tokenize(a.tokenizer)
            urls = []
            for d in direct:
                srv, h = start_shim(d, tok, 8192)
                shims.append((srv, h))
                urls.append(f"http://127.0.0.1:{srv.server_address[1]}")
            sample = document("calibration", 300)
            ids = tok.ids({"messages": [{"role": "user", "content": sample}]})
            usage = chat(direct[0], sample)
            check("/tokenize stand-in agrees with kinf-sim's token count",
                  len(ids) == usage["prompt_tokens"],
                  f"{len(ids)} vs {usage['prompt_tokens']}")
            http_json(f"{direct[0]}/reset_prefix_cache", {})

        # vllm-router, kv_aware, subscribed to both publishers.
        port, prom_port = free_port(), free_port()
        cmd = [a.vllm_router, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
               "--policy", "kv_aware", "--kv-event-block-size", str(BLOCK),
               "--kv-event-model", MODEL, "--disable-retries", "--disable-circuit-breaker",
               "--prometheus-port", str(prom_port), "--worker-startup-check-interval", "1",
               "--log-level", "debug"]
        for u, s in zip(urls, sims):
            cmd += ["--kv-event-source", f"{u}={s['kv_events']}"]
            cmd += ["--kv-event-replay-source", f"{u}={s['replay']}"]
        log = open(work / "vllm-router.log", "w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        router = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                chat(router, "ping")
                break
            except Exception:
                if time.time() > deadline or procs[-1].poll() is not None:
                    raise RuntimeError(f"vllm-router did not start; log: {work / 'vllm-router.log'}")
                time.sleep(0.2)
        # Both ZMQ subscribers up (then a moment for the SUB sockets to join).
        deadline = time.time() + 20
        while len(re.findall(r"kv_index subscriber for \S+ rank0 on tcp",
                             (work / "vllm-router.log").read_text())) < 2 and time.time() < deadline:
            time.sleep(0.2)
        subs = len(re.findall(r"kv_index subscriber for \S+ rank0 on tcp",
                              (work / "vllm-router.log").read_text()))
        check("vllm-router subscribed to both kinf-sim publishers", subs >= 2, f"{subs} subscribers")
        time.sleep(1.0)
        for d in direct:
            http_json(f"{d}/reset_prefix_cache", {})
        time.sleep(0.3)

        def served(before):
            after = [metric(d, "vllm:request_success_total") for d in direct]
            return [i for i in range(2) if after[i] > before[i]]

        # 1. The same long prompt twice through the router: the repeat is a prefix-cache hit.
        doc = document("repeat")
        b = [metric(d, "vllm:request_success_total") for d in direct]
        u1 = chat(router, doc)
        w1 = served(b)
        time.sleep(0.3)  # KV events reach the router
        b = [metric(d, "vllm:request_success_total") for d in direct]
        u2 = chat(router, doc)
        w2 = served(b)
        check("repeat of a long prompt lands on the worker holding its blocks",
              u2["prompt_tokens_details"]["cached_tokens"] > 0 and w1 == w2,
              f"{u1['prompt_tokens']} prompt tokens, cached first {u1['prompt_tokens_details']['cached_tokens']}, "
              f"repeat {u2['prompt_tokens_details']['cached_tokens']}; workers {w1} then {w2}")

        # 2. Directed: seed prompt k directly on worker k % 2 (the router does not see it), then
        # send it through the router. Only the KV events say where its blocks are; the load-only
        # fallback would pick the first idle worker and miss every prompt seeded on worker 1.
        hits, to_holder = 0, 0
        for k in range(a.prompts):
            d = document(f"directed-{k}")
            holder = k % 2
            chat(direct[holder], d)
            time.sleep(0.3)
            b = [metric(x, "vllm:request_success_total") for x in direct]
            u = chat(router, d)
            w = served(b)
            cached = u["prompt_tokens_details"]["cached_tokens"]
            hits += cached >= u["prompt_tokens"] // 2
            to_holder += w == [holder]
            print(f"  directed {k}: seeded on worker {holder}, routed to {w}, cached {cached}/{u['prompt_tokens']}",
                  flush=True)
        check("prompts seeded directly on a worker are routed to it (KV events only)",
              to_holder == a.prompts and hits == a.prompts, f"{to_holder}/{a.prompts} to holder, {hits} cache hits")

        # 3. Different prompts through the router, each then repeated: every repeat is a hit.
        fresh = [document(f"fresh-{k}") for k in range(4)]
        for d in fresh:
            chat(router, d)
        time.sleep(0.3)
        rep = [chat(router, d)["prompt_tokens_details"]["cached_tokens"] for d in fresh]
        check("repeats of different prompts all hit", all(c > 0 for c in rep), f"cached {rep}")

        # 4. Workers' own view: prefix-cache hits counted on /metrics.
        hits_total = [metric(d, "vllm:prefix_cache_hits_total") for d in direct]
        check("workers count prefix-cache hits", sum(hits_total) > 0, f"hit tokens per worker {hits_total}")

        text = (work / "vllm-router.log").read_text()
        outcomes = {}
        for m in re.finditer(r'KV prefix decision \S*outcome\S*="(\w+)"', re.sub(r"\x1b\[[0-9;]*m", "", text)):
            outcomes[m.group(1)] = outcomes.get(m.group(1), 0) + 1
        print(f"vllm-router KV prefix decisions: {outcomes}", flush=True)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/metrics", timeout=10) as r:
                kv = [l for l in r.read().decode().splitlines()
                      if l.startswith("vllm_router_kv_") and not l.startswith("#")]
            print("vllm-router KV metrics:\n  " + "\n  ".join(kv), flush=True)
            hit = sum(float(l.rsplit(" ", 1)[1]) for l in kv
                      if l.startswith('vllm_router_kv_placement_lookups_total{result="hit"}'))
            check("vllm-router's KV index (fed by kinf-sim's events) answered hits", hit > 0,
                  f"{hit:.0f} placement lookups hit")
        except Exception as e:
            check("vllm-router's KV index answered hits", False, f"metrics unavailable: {e}")
        if shims:
            print(f"/tokenize stand-in calls: {[h.tokenize_calls for _, h in shims]}", flush=True)
    except Exception as e:  # a setup failure is a failed check, with the logs kept
        check("setup", False, f"{e} (logs in {work})")
        a.keep_logs = True
    finally:
        for p in reversed(procs):
            p.kill()
            p.wait()
    failed = RESULTS.count(False)
    if not a.keep_logs and failed == 0:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"logs: {work}")
    print(f"vllm_router_kv_check: {RESULTS.count(True)} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
