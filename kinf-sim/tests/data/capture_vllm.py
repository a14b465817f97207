#!/usr/bin/env python3
# Recorded vllm_0.32_serve_captures.json: real vLLM 0.32.0 (CPU build) started with
#   scripts/vllm-cpu/model.sh /tmp/model && scripts/vllm-cpu/serve.sh /tmp/model 18200 18201 18202
# (served name tiny-llama, --enable-prompt-tokens-details, block size 32, max_model_len 2048),
# then `python3 capture_vllm.py vllm_0.32_serve_captures.json`. Each entry: status, content type
# and raw body of one request. kinf-sim/tests/serve_vllm_parity.rs compares kinf-sim with it.
import json, urllib.request, sys
BASE = "http://127.0.0.1:18200"
out = {}
def req(name, method, path, body=None, raw=None, content_type="application/json"):
    data = raw.encode() if raw is not None else (json.dumps(body).encode() if body is not None else None)
    r = urllib.request.Request(BASE + path, data=data, method=method, headers={"content-type": content_type})
    try:
        with urllib.request.urlopen(r, timeout=120) as resp:
            out[name] = {"status": resp.status, "content_type": resp.headers.get("content-type"), "body": resp.read().decode()}
    except urllib.error.HTTPError as e:
        out[name] = {"status": e.code, "content_type": e.headers.get("content-type"), "body": e.read().decode()}
    print(name, out[name]["status"], out[name]["body"][:300].replace("\n", "\\n"))
long = " ".join(f"word{i % 50} and more" for i in range(60))
msg = lambda t: [{"role": "user", "content": t}]
M = "tiny-llama"
req("chat_n2_plain", "POST", "/v1/chat/completions", {"model": M, "messages": msg("hello n two"), "max_tokens": 3, "n": 2, "ignore_eos": True})
req("chat_long_plain_1", "POST", "/v1/chat/completions", {"model": M, "messages": msg(long), "max_tokens": 3, "ignore_eos": True})
req("chat_long_plain_2", "POST", "/v1/chat/completions", {"model": M, "messages": msg(long), "max_tokens": 3, "ignore_eos": True})
req("chat_stream_continuous", "POST", "/v1/chat/completions", {"model": M, "messages": msg(long + " x"), "max_tokens": 3, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
req("chat_stream_no_usage", "POST", "/v1/chat/completions", {"model": M, "messages": msg("no usage please"), "max_tokens": 3, "ignore_eos": True, "stream": True})
req("chat_stream_n2_continuous", "POST", "/v1/chat/completions", {"model": M, "messages": msg("n two continuous"), "max_tokens": 2, "n": 2, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
req("comp_n2_plain", "POST", "/v1/completions", {"model": M, "prompt": long, "max_tokens": 3, "n": 2, "ignore_eos": True})
req("comp_stream_continuous", "POST", "/v1/completions", {"model": M, "prompt": long + " y", "max_tokens": 3, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
req("comp_stream_no_usage", "POST", "/v1/completions", {"model": M, "prompt": "no usage", "max_tokens": 3, "ignore_eos": True, "stream": True})
req("comp_stream_n2_usage", "POST", "/v1/completions", {"model": M, "prompt": "two of them", "max_tokens": 2, "n": 2, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
req("messages_long_plain", "POST", "/v1/messages", {"model": M, "max_tokens": 3, "messages": msg(long + " z")})
req("messages_long_stream", "POST", "/v1/messages", {"model": M, "max_tokens": 3, "stream": True, "messages": msg(long + " w")})
req("err_chat_unknown_model", "POST", "/v1/chat/completions", {"model": "nope", "messages": msg("x")})
req("err_messages_unknown_model", "POST", "/v1/messages", {"model": "nope", "max_tokens": 3, "messages": msg("x")})
req("err_messages_max_tokens_0", "POST", "/v1/messages", {"model": M, "max_tokens": 0, "messages": msg("x")})
req("err_messages_missing_max_tokens", "POST", "/v1/messages", {"model": M, "messages": msg("x")})
req("err_chat_max_tokens_over_model_len", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "max_tokens": 100000})
req("err_chat_max_completion_tokens_over_model_len", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "max_completion_tokens": 100000})
req("ok_chat_max_tokens_clamped", "POST", "/v1/chat/completions", {"model": M, "messages": msg(long), "max_tokens": 2040, "ignore_eos": True})
req("err_comp_prompt_too_long", "POST", "/v1/completions", {"model": M, "prompt": list(range(3, 2103)), "max_tokens": 1})
req("err_comp_prompt_fills_context", "POST", "/v1/completions", {"model": M, "prompt": list(range(3, 2051)), "max_tokens": 1})
req("err_chat_stream_options_without_stream", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "stream_options": {"include_usage": True}})
req("ok_chat_empty_stream_options_without_stream", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "max_tokens": 1, "stream_options": {}})
req("err_chat_n0", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "n": 0})
req("err_chat_max_tokens_0", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "max_tokens": 0})
req("err_chat_max_tokens_negative", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "max_tokens": -3})
req("err_chat_missing_messages", "POST", "/v1/chat/completions", {"model": M})
req("err_chat_invalid_json", "POST", "/v1/chat/completions", raw="{not json")
req("err_comp_missing_prompt", "POST", "/v1/completions", {"model": M})
req("err_comp_empty_prompt", "POST", "/v1/completions", {"model": M, "prompt": ""})
req("err_chat_text_plain", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "max_tokens": 1}, content_type="text/plain")
req("err_messages_text_plain", "POST", "/v1/messages", {"model": M, "max_tokens": 1, "messages": msg("x")}, content_type="text/plain")
req("ok_chat_json_charset", "POST", "/v1/chat/completions", {"model": M, "messages": msg("x"), "max_tokens": 1}, content_type="Application/JSON; charset=utf-8")
req("err_405", "GET", "/v1/chat/completions")
req("err_404", "GET", "/nope")
req("health", "GET", "/health")
json.dump(out, open(sys.argv[1], "w"), indent=1)
