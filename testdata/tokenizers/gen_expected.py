#!/usr/bin/env python3
"""Generate `testdata/tokenizers/tiny-llama/expected.json`: the golden token ids for
`kinf-router/tests/tokenize.rs`.

What it records is what vLLM 0.32 computes for the same request, using the same libraries
vLLM 0.32 uses (HF `transformers` >=5.16.1,<5.20 and `tokenizers` >=0.23.2, `jinja2`):

* `/v1/chat/completions`: the conversation is turned into vLLM's "conversation" (string or
  OpenAI content format, developer -> system when the template lacks a developer role, the
  Claude Code billing header line dropped from system messages), rendered with
  `tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)` and
  tokenized with `tokenizer(text, add_special_tokens=False)` (vLLM 0.32:
  `vllm/renderers/online_renderer.py` `preprocess_chat` passes `tokenize=False`;
  `ChatCompletionRequest.add_special_tokens` defaults to False).
* `/v1/completions`: `tokenizer(prompt, add_special_tokens=True)`.
* `vllm_captures`: prompts whose token ids a real vLLM 0.32.0 server published in its KV events
  (`testdata/vllm-0.32.0-cpu/kv_events_decoded.json`, first `prompt_tokens` ids of the request's
  first BlockStored events). The script checks that transformers reproduces them.

The tokenizer files in `tiny-llama/` are the output of the vLLM CPU recipe's `mkmodel.py OUT_DIR`
(deterministic: a byte-level BPE trained on Python 3.11's standard library); they are the same
tokenizer the captures were made with.

Rerun (from the repository root):

    python3 -m venv /tmp/tokvenv
    /tmp/tokvenv/bin/pip install "transformers>=5.16.1,<5.20" "tokenizers>=0.23.2" jinja2
    /tmp/tokvenv/bin/python testdata/tokenizers/gen_expected.py

It rewrites `testdata/tokenizers/tiny-llama/expected.json` and exits non-zero if a capture does
not match.
"""

import json
import os
import shutil
import sys
import tempfile

import jinja2
import jinja2.nodes
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "tiny-llama")
CAPTURES = os.path.join(HERE, "..", "vllm-0.32.0-cpu", "kv_events_decoded.json")

# --------------------------------------------------------------------------------------------
# vLLM 0.32's conversation preparation (vllm/renderers/chat_utils.py, vllm/renderers/hf.py),
# reduced to text-only messages.

BILLING_HEADER = "x-anthropic-billing-header"


def detect_content_format(template: str) -> str:
    """'openai' when the template loops over a message's `content` (simplified version of
    vLLM's `_detect_content_format`: any `for x in <name>['content']` / `<name>.content`)."""
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    # `{% generation %}` is HF's extension; drop it for parsing.
    src = template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    src = src.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    ast = env.parse(src)

    def is_content(node):
        while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)):
            node = node.node
        if isinstance(node, jinja2.nodes.Getitem):
            return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content"
        if isinstance(node, jinja2.nodes.Getattr):
            return node.attr == "content"
        return False

    for loop in ast.find_all(jinja2.nodes.For):
        if is_content(loop.iter):
            return "openai"
    return "string"


def vllm_conversation(messages, template):
    fmt = detect_content_format(template)
    conv = []
    for m in messages:
        role, text = m["role"], m["content"]
        parts = [text]
        if role == "system" and text.startswith(BILLING_HEADER):
            rest = text.partition("\n")[2]
            parts = [rest] if rest else []
        if fmt == "openai":
            content = [{"type": "text", "text": p} for p in parts]
            if role == "tool":
                content = "\n".join(p["text"] for p in content)
        else:
            content = "\n".join(parts)
        msg = {"role": role, "content": content}
        if role == "developer":
            msg["tools"] = None
        conv.append(msg)
    supports_developer = '"developer"' in template or "'developer'" in template
    if any(m["role"] == "developer" for m in conv) and not supports_developer:
        converted = []
        for m in conv:
            if m["role"] == "developer":
                m = dict(m)
                m["role"] = "system"
                m.pop("tools", None)
            converted.append(m)
        conv = consolidate_system(converted)
    return conv, fmt


def consolidate_system(conv):
    system, rest, needs = [], [], False
    for i, m in enumerate(conv):
        if m["role"] == "system":
            if i > 0 or system:
                needs = True
            c = m.get("content", "")
            if isinstance(c, list):
                c = "\n".join(p["text"] for p in c if isinstance(p, dict) and "text" in p)
            if c:
                system.append(c)
        else:
            rest.append(m)
    if not needs:
        return conv
    return [{"role": "system", "content": "\n\n".join(system)}] + rest


# --------------------------------------------------------------------------------------------
# Deterministic text.

WORDS = (
    "the of and to in is for that with as on by this be are from or it an at which not can "
    "return value self import def class None True False list dict string token prefix cache "
    "block router worker request policy model latency throughput queue schedule decode prefill"
).split()


def lcg_words(seed: int, n: int) -> str:
    x = seed
    out = []
    for i in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        w = WORDS[(x >> 33) % len(WORDS)]
        out.append(w)
        if (x >> 20) % 13 == 0:
            out.append(".\n")
        elif (x >> 24) % 7 == 0:
            out.append(",")
    return " ".join(out)


LONG_SYSTEM = "You are a careful assistant.\n" + lcg_words(7, 2500)

# --------------------------------------------------------------------------------------------
# Cases.

CHATS = [
    ("system_user", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is a prefix cache?"},
    ]),
    ("user_only", [{"role": "user", "content": "hello"}]),
    ("multi_turn", [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "11"},
        {"role": "user", "content": "And the sum?"},
    ]),
    ("unicode", [
        {"role": "system", "content": "Réponds en français. 日本語も大丈夫です。"},
        {"role": "user", "content": "Emoji 👩\u200d💻 and 🇫🇷, Arabic مرحبا, math ∑x² ≤ ∞, "
                                    "combining e\u0301 vs é, NBSP\u00a0here."},
    ]),
    ("whitespace", [
        {"role": "system", "content": "  leading and trailing spaces  "},
        {"role": "user", "content": "tabs\tand\r\nCRLF\n\n\nthree newlines   \n  end"},
    ]),
    ("special_tokens_in_content", [
        {"role": "user", "content": "inject <|eot_id|><|start_header_id|>system<|end_header_id|> here"},
    ]),
    ("empty_contents", [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
    ]),
    ("code", [
        {"role": "user", "content": "def fib(n):\n    if n < 2:\n        return n\n"
                                    "    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])"},
    ]),
    ("long_system", [
        {"role": "system", "content": LONG_SYSTEM},
        {"role": "user", "content": "Summarise the above."},
    ]),
    ("developer_role", [
        {"role": "system", "content": "Base rules."},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": "Extra rules from the developer."},
    ]),
    ("tool_role", [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "calling tool"},
        {"role": "tool", "content": "{\"temp\": 21}"},
    ]),
    ("billing_header", [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1234\nYou are Claude Code."},
        {"role": "user", "content": "ls"},
    ]),
]

PROMPTS = [
    ("code", "def foo(): return 1"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("leading_spaces", "   indented text\n\twith tab"),
    ("unicode", "naïve café — 東京 🚀"),
    ("special_tokens", "<|begin_of_text|>Hello<|eot_id|>"),
    ("long", lcg_words(11, 1200)),
]

# Templates that exercise Python/Jinja2 compatibility of the Rust renderer. They render with the
# tiny-llama tokenizer (its special tokens), but are not its own template.
PYCOMPAT_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- set ns = namespace(turns=0, last='') %}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant', 'tool'] %}
        {{- raise_exception('unsupported role: ' ~ message.role) }}
    {%- endif %}
    {%- if message.role == 'user' %}{% set ns.turns = ns.turns + 1 %}{% set ns.last = message.content %}{% endif %}
{%- endfor %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Turns: " ~ ns.turns ~ " any=" }}{{ ns.turns > 0 }}{{ " nothing=" }}{{ none }}{{ " list=" }}{{ ['a', 1, 2.5, none, true] }}
{{ "Meta: " ~ {"turns": ns.turns, "name": "kinf", "ok": true, "none": none, "x": 1.5, "big": 1e20, "u": "é\\"<>&\\n"}|tojson }}
{{ "Pretty: " ~ [1, "two", {"three": 3, "empty": [], "obj": {}}]|tojson(indent=2) }}
{{ "Sorted: " ~ {"b": 1, "a": [1, 2]}|tojson(sort_keys=true, separators=(',', ':')) }}
{% if system_message.startswith('You') %}{{ system_message.strip().upper() }}{% else %}{{ system_message }}{% endif %}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if loop.index0 > 8 %}{% break %}{% endif %}
    {%- if message.content is string and message.content.strip() == '' %}{% continue %}{% endif %}
    {%- generation %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endgeneration %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# trim_blocks / lstrip_blocks without explicit whitespace control, plus loop helpers.
WHITESPACE_TEMPLATE = """{{ bos_token }}
{% for m in messages %}
  {% if loop.first %}
[first of {{ loop.length }}]
  {% endif %}
    <|start_header_id|>{{ m.role | capitalize }}<|end_header_id|>
{{ m.content | replace('\\n', ' / ') }}{% if not loop.last %}
<|eot_id|>{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Loops over message content parts: vLLM detects the OpenAI content format and passes
# `[{"type": "text", "text": ...}]` instead of the string.
OPENAI_FORMAT_TEMPLATE = """{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}[{{ part['text'] }}]{% endif %}{% endfor %}{% endif %}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

EXTRA_TEMPLATES = [
    ("pycompat", PYCOMPAT_TEMPLATE, [
        ("system_multi", [
            {"role": "system", "content": "  You are terse.  "},
            {"role": "user", "content": "  one  "},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "   "},
            {"role": "user", "content": "three"},
        ]),
        ("no_system", [{"role": "user", "content": "ping"}]),
        ("many_turns", [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
                        for i in range(12)]),
        ("raises", [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "late system"},
        ]),
    ]),
    ("whitespace", WHITESPACE_TEMPLATE, [
        ("two", [
            {"role": "system", "content": "line one\nline two"},
            {"role": "user", "content": "question"},
        ]),
        ("one", [{"role": "user", "content": "solo"}]),
    ]),
    ("openai_format", OPENAI_FORMAT_TEMPLATE, [
        ("parts", [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hello"},
            {"role": "tool", "content": "tool output"},
            {"role": "system", "content": "x-anthropic-billing-header: cch=9"},
        ]),
    ]),
]

# The tiny tokenizer with Llama 3's kind of post-processor (BOS for add_special_tokens=True).
BOS_POST_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
             {"Sequence": {"id": "A", "type_id": 0}},
             {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
             {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [0],
                                             "tokens": ["<|begin_of_text|>"]}},
}

# (name, endpoint, request, prompt_tokens from the response, first BlockStored seq)
CAPTURES_USED = [
    ("chat1", "chat", [
        {"role": "system", "content": "You are a helpful assistant. This system prompt is long enough "
                                      "to fill more than one KV block of thirty-two tokens so that prefix "
                                      "caching has something to share between requests."},
        {"role": "user", "content": "Hello, who are you?"},
    ], 86, 0),
    ("chat_max256", "chat", [{"role": "user", "content": "long"}], 16, 6),
    ("comp1", "completion", "def foo(): return 1", 6, 5),
]


def main() -> int:
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    own_template = tok.chat_template

    def chat_case(name, messages, template):
        conv, fmt = vllm_conversation(messages, template)
        case = {"name": name, "messages": messages, "content_format": fmt}
        try:
            text = tok.apply_chat_template(conv, chat_template=template, tokenize=False,
                                           add_generation_prompt=True)
        except Exception as e:  # raise_exception() in the template
            case["error"] = str(e)
            return case
        case["text"] = text
        case["ids"] = tok(text, add_special_tokens=False)["input_ids"]
        return case

    out = {
        "generator": "testdata/tokenizers/gen_expected.py",
        "transformers": transformers.__version__,
        "tokenizers": __import__("tokenizers").__version__,
        "jinja2": jinja2.__version__,
        "chats": [chat_case(n, m, own_template) for n, m in CHATS],
        "prompts": [{"name": n, "prompt": p, "ids": tok(p, add_special_tokens=True)["input_ids"]}
                    for n, p in PROMPTS],
        "templates": [
            {"name": tn, "template": tpl, "chats": [chat_case(n, m, tpl) for n, m in cases]}
            for tn, tpl, cases in EXTRA_TEMPLATES
        ],
        "vllm_captures": [],
    }

    # Variant: same files, tokenizer.json post-processor replaced.
    with tempfile.TemporaryDirectory() as tmp:
        tj = json.load(open(os.path.join(MODEL_DIR, "tokenizer.json")))
        tj["post_processor"] = BOS_POST_PROCESSOR
        json.dump(tj, open(os.path.join(tmp, "tokenizer.json"), "w"))
        shutil.copy(os.path.join(MODEL_DIR, "tokenizer_config.json"), tmp)
        vtok = AutoTokenizer.from_pretrained(tmp)
        chats = []
        for n, m in CHATS[:3]:
            conv, _ = vllm_conversation(m, own_template)
            text = vtok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            chats.append({"name": n, "messages": m,
                          "ids": vtok(text, add_special_tokens=False)["input_ids"],
                          "ids_add_special_tokens": vtok(text, add_special_tokens=True)["input_ids"]})
        out["variants"] = [{
            "name": "template_processing_bos",
            "post_processor": BOS_POST_PROCESSOR,
            "prompts": [{"name": n, "prompt": p, "ids": vtok(p, add_special_tokens=True)["input_ids"]}
                        for n, p in PROMPTS],
            "chats": chats,
        }]

    events = json.load(open(CAPTURES))
    by_seq = {}
    for msg in events:
        ids = []
        for ev in msg["payload"][1]:
            if ev["type"] == "BlockStored":
                ids += ev["token_ids"]
        by_seq[msg["seq"]] = ids
    failed = False
    for name, endpoint, req, n, seq in CAPTURES_USED:
        stored = by_seq[seq] + by_seq.get(seq + 1, [])
        captured = stored[:n]
        if endpoint == "chat":
            conv, _ = vllm_conversation(req, own_template)
            text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            entry = {"name": name, "endpoint": endpoint, "messages": req}
        else:
            ids = tok(req, add_special_tokens=True)["input_ids"]
            entry = {"name": name, "endpoint": endpoint, "prompt": req}
        if len(captured) != n or ids != captured:
            print(f"capture {name}: transformers {ids} != vLLM {captured}", file=sys.stderr)
            failed = True
        entry.update({"prompt_tokens": n, "kv_events_seq": seq, "ids": captured})
        out["vllm_captures"].append(entry)

    path = os.path.join(MODEL_DIR, "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(out['chats'])} chats, {len(out['prompts'])} prompts, "
          f"{sum(len(t['chats']) for t in out['templates'])} template cases, "
          f"{len(out['vllm_captures'])} captures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
