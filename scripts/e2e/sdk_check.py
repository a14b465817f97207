#!/usr/bin/env python3
"""End-to-end checks of a running Kinference gateway with the official OpenAI and Anthropic
Python SDKs. Expects the quick-start configuration (deploy/quickstart): `standard-model`,
`qwen` and `glm` served by kinf-sim workers, a PII classifier, a 1 MiB body limit, and the rule
`no-pii-on-glm` that refuses PII prompts for `glm`.

Usage: sdk_check.py BASE_URL     (e.g. http://127.0.0.1:8080)
Prints one line per check and exits non-zero when any fails.
"""
import json
import sys
import traceback
import urllib.request

import anthropic
import openai

BASE = sys.argv[1].rstrip("/")
QWEN = "Qwen/Qwen3.6-27B"
GLM = "zai-org/GLM-5.3"
oa = openai.OpenAI(base_url=BASE + "/v1", api_key="sk-test", max_retries=0, timeout=60)
an = anthropic.Anthropic(base_url=BASE, api_key="sk-test", max_retries=0, timeout=60)
MSG = [{"role": "user", "content": "Explain prefix caching in one sentence."}]
with urllib.request.urlopen(BASE + "/admin/status") as r:
    ENDPOINTS = {e["endpoint"] for e in json.load(r)["endpoints"]}
results = []


def check(name):
    def wrap(fn):
        try:
            fn()
            results.append((name, None))
            print(f"ok    {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure
            results.append((name, e))
            print(f"FAIL  {name}: {e!r}", flush=True)
            traceback.print_exc()
        return fn
    return wrap


def expect_status(exc_type, status, fn):
    try:
        fn()
    except exc_type as e:
        assert e.status_code == status, f"status {e.status_code}, expected {status}"
        return e
    raise AssertionError(f"expected {exc_type.__name__} ({status})")


@check("openai: models list names and aliases")
def _():
    ids = {m.id for m in oa.models.list()}
    for want in ("standard-model", "qwen", "glm", QWEN, GLM):
        assert want in ids, (want, ids)


@check("openai: chat, alias resolved and model rewritten")
def _():
    raw = oa.chat.completions.with_raw_response.create(model="qwen", messages=MSG, max_tokens=8)
    r = raw.parse()
    assert r.choices[0].message.content, r
    assert raw.headers["x-kinference-model"] == QWEN, raw.headers
    assert r.model == QWEN, r.model  # the worker saw the rewritten name
    assert raw.headers["x-kinference-endpoint"] in ENDPOINTS, (raw.headers, ENDPOINTS)
    assert raw.headers["x-kinference-rule"], raw.headers
    assert r.usage.completion_tokens == 8, r.usage


@check("openai: abstract model goes to one of both worker sets")
def _():
    raw = oa.chat.completions.with_raw_response.create(
        model="standard-model", messages=MSG, max_tokens=4)
    assert raw.headers["x-kinference-model"] in (QWEN, GLM), raw.headers
    assert raw.headers["x-kinference-rule"] == "quickstart/quickstart/fastest-standard-model"


@check("openai: streaming passes through; no usage chunk unless asked")
def _():
    chunks = list(oa.chat.completions.create(model="glm", messages=MSG, max_tokens=6, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, chunks
    assert all(c.usage is None for c in chunks), [c.usage for c in chunks]


@check("openai: streaming with include_usage keeps the usage chunk")
def _():
    chunks = list(oa.chat.completions.create(
        model="glm", messages=MSG, max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6, chunks[-1]


@check("openai: repeated long prompt is served from the prefix cache")
def _():
    long = [{"role": "system", "content": "You are terse. " * 300}, MSG[0]]
    first = oa.chat.completions.with_raw_response.create(model="qwen", messages=long, max_tokens=2)
    second = oa.chat.completions.with_raw_response.create(model="qwen", messages=long, max_tokens=2)
    assert first.headers["x-kinference-endpoint"] == second.headers["x-kinference-endpoint"]
    details = second.parse().usage.prompt_tokens_details
    assert details is not None and details.cached_tokens > 0, second.parse().usage


@check("openai: completions")
def _():
    r = oa.completions.create(model="qwen", prompt="Once upon a time", max_tokens=5)
    assert r.choices[0].text, r
    s = list(oa.completions.create(model="qwen", prompt="Once upon a time", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in s if c.choices), s


@check("openai: 400 names the field")
def _():
    e = expect_status(openai.BadRequestError, 400,
                      lambda: oa.chat.completions.create(model="qwen", messages=[]))
    assert e.body["param"] == "messages", e.body


@check("openai: 404 unknown model")
def _():
    e = expect_status(openai.NotFoundError, 404,
                      lambda: oa.chat.completions.create(model="gpt-9", messages=MSG))
    assert e.body["code"] == "model_not_found", e.body


@check("openai: 413 body too large")
def _():
    big = [{"role": "user", "content": "x" * (2 << 20)}]
    expect_status(openai.APIStatusError, 413,
                  lambda: oa.chat.completions.create(model="qwen", messages=big))


@check("openai: 503 rejected by policy, naming the rule")
def _():
    pii = [{"role": "user", "content": "My card is 4111 1111 1111 1111, mail me at a@b.example"}]
    e = expect_status(openai.InternalServerError, 503,
                      lambda: oa.chat.completions.create(model="glm", messages=pii, max_tokens=4))
    assert e.body["code"] == "policy_rejected", e.body
    assert "no-pii-on-glm" in e.body["message"], e.body
    # The same prompt for `qwen` is served locally.
    r = oa.chat.completions.with_raw_response.create(model="qwen", messages=pii, max_tokens=4)
    assert r.headers["x-kinference-model"] == QWEN


@check("anthropic: messages, plain")
def _():
    raw = an.messages.with_raw_response.create(model="qwen", max_tokens=8, messages=MSG)
    m = raw.parse()
    assert m.content and m.content[0].text, m
    assert raw.headers["x-kinference-model"] == QWEN
    assert m.usage.output_tokens == 8, m.usage


@check("anthropic: messages, streaming")
def _():
    with an.messages.stream(model="standard-model", max_tokens=6, messages=MSG) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text, final
    assert final.usage.output_tokens == 6, final.usage


@check("anthropic: errors in Anthropic's shape")
def _():
    e = expect_status(anthropic.NotFoundError, 404,
                      lambda: an.messages.create(model="claude-9", max_tokens=4, messages=MSG))
    assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body
    e = expect_status(anthropic.BadRequestError, 400,
                      lambda: an.messages.create(model="qwen", max_tokens=4, messages=[]))
    assert e.body["error"]["type"] == "invalid_request_error", e.body


@check("anthropic: a worker's own 400 reaches the SDK in Anthropic's shape")
def _():
    # More output than the worker's context: refused by the worker (vLLM's message kept), or by
    # the gateway itself when it counts the prompt exactly; Anthropic's shape either way.
    e = expect_status(anthropic.BadRequestError, 400,
                      lambda: an.messages.create(model="qwen", max_tokens=10**7, messages=MSG))
    assert e.body["type"] == "error", e.body
    assert e.body["error"]["type"] == "invalid_request_error", e.body
    assert "max_tokens" in e.body["error"]["message"] or "context" in e.body["error"]["message"], e.body


@check("anthropic: models list in Anthropic's shape")
def _():
    page = an.models.list(limit=100)
    ids = {m.id for m in page.data}
    for want in ("standard-model", "qwen", QWEN):
        assert want in ids, (want, ids)
    assert all(m.type == "model" and m.display_name for m in page.data), page.data
    one = an.models.retrieve("qwen")
    assert one.id == "qwen" and one.type == "model", one


failed = [n for n, e in results if e is not None]
print(f"sdk_check: {len(results) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
