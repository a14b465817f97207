#!/usr/bin/env python3
"""The official OpenAI and Anthropic SDKs straight at one `kinf-sim serve` worker (no gateway):
the simulator must look like vLLM 0.32 to them. Usage: sim_sdk_check.py BASE_URL"""
import sys

import anthropic
import openai

BASE = sys.argv[1].rstrip("/")
oa = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=60)
an = anthropic.Anthropic(base_url=BASE, api_key="none", max_retries=0, timeout=60)
model = oa.models.list().data[0].id
msg = [{"role": "user", "content": "Hello"}]

r = oa.chat.completions.create(model=model, messages=msg, max_tokens=5)
assert r.choices[0].message.content and r.usage.completion_tokens == 5, r
chunks = list(oa.chat.completions.create(model=model, messages=msg, max_tokens=5, stream=True,
                                          stream_options={"include_usage": True}))
assert chunks[-1].usage.completion_tokens == 5, chunks[-1]
c = oa.completions.create(model=model, prompt="Once", max_tokens=3)
assert c.choices[0].text and c.usage.completion_tokens == 3, c
try:
    oa.chat.completions.create(model="no-such-model", messages=msg)
    raise AssertionError("expected 404")
except openai.NotFoundError:
    pass
m = an.messages.create(model=model, max_tokens=4, messages=msg)
assert m.content[0].text and m.usage.output_tokens == 4, m
with an.messages.stream(model=model, max_tokens=4, messages=msg) as s:
    assert "".join(s.text_stream)
    assert s.get_final_message().usage.output_tokens == 4
print("sim_sdk_check: 6 passed, 0 failed")
