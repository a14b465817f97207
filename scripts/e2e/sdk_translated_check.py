#!/usr/bin/env python3
"""End-to-end checks of the official Anthropic Python SDK against a Kinference gateway whose
model `cloud` is served by an OpenAI-type provider (the tests' fake provider: "Hello world",
usage of 12 prompt tokens, 4 of them cached, and 2 output tokens), so that every answer is
translated from OpenAI's protocol; `cloud` has no other provider.

Usage: sdk_translated_check.py BASE_URL     (e.g. http://127.0.0.1:8080)
Prints one line per check and exits non-zero when any fails.
"""
import sys
import traceback

import anthropic

BASE = sys.argv[1].rstrip("/")
an = anthropic.Anthropic(base_url=BASE, api_key="sk-test", max_retries=0, timeout=60)
MSG = [{"role": "user", "content": "Explain prefix caching in one sentence."}]
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


def usage(u):
    return (u.input_tokens, u.cache_read_input_tokens, u.output_tokens)


@check("anthropic: translated stream, final message has the provider's usage")
def _():
    with an.messages.stream(model="cloud", max_tokens=20, messages=MSG) as s:
        events = list(s)
        final = s.get_final_message()
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == "Hello world", text
    start = next(e for e in events if e.type == "message_start")
    # The gateway's estimate of the prompt, before the provider's counts arrive.
    assert start.message.usage.input_tokens > 0, start.message.usage
    # The provider's counts, from message_delta: 12 prompt tokens, 4 of them cached.
    assert usage(final.usage) == (8, 4, 2), final.usage


@check("anthropic: translated plain answer has the provider's usage")
def _():
    m = an.messages.create(model="cloud", max_tokens=20, messages=MSG)
    assert m.content[0].text == "Hello world", m
    assert usage(m.usage) == (8, 4, 2), m.usage


@check("anthropic: more stop_sequences than OpenAI takes, refused naming the field")
def _():
    try:
        an.messages.create(model="cloud", max_tokens=20, messages=MSG,
                           stop_sequences=["A", "B", "C", "D", "E"])
    except anthropic.BadRequestError as e:
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert e.body["error"]["message"].startswith("`stop_sequences`"), e.body
        return
    raise AssertionError("expected BadRequestError (400)")


failed = [n for n, e in results if e is not None]
print(f"sdk_translated_check: {len(results) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
