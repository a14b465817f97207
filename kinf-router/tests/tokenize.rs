//! `kinf_router::tokenize` against golden ids from HF transformers (as vLLM 0.32 calls it) and
//! from a real vLLM 0.32.0 server's KV events, plus cached-vs-uncached equality (unit cases and
//! proptest) on tokenizer variants that stress the segment splitting.
//!
//! Golden data: `testdata/tokenizers/tiny-llama/expected.json`, written by
//! `testdata/tokenizers/gen_expected.py` (see its header to regenerate).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use kinf_router::tokenize::{
    ChatMessage, ChatOptions, ChatTokenizer, ContentFormat, TokenizeError,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const TOKENIZER_JSON: &str = include_str!("../../testdata/tokenizers/tiny-llama/tokenizer.json");
const CONFIG_JSON: &str =
    include_str!("../../testdata/tokenizers/tiny-llama/tokenizer_config.json");
const EXPECTED_JSON: &str = include_str!("../../testdata/tokenizers/tiny-llama/expected.json");

fn expected() -> Value {
    serde_json::from_str(EXPECTED_JSON).unwrap()
}

fn tiny() -> ChatTokenizer {
    ChatTokenizer::from_files_content(TOKENIZER_JSON, Some(CONFIG_JSON)).unwrap()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    serde_json::from_value(v.clone()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// `tokenizer.json` with `edit` applied.
fn tokenizer_json_with(edit: impl FnOnce(&mut Value)) -> String {
    let mut v: Value = serde_json::from_str(TOKENIZER_JSON).unwrap();
    edit(&mut v);
    serde_json::to_string(&v).unwrap()
}

/// Renders, encodes cold, encodes warm and encodes without the cache; all must agree with
/// `want_text` / `want_ids`.
fn check_chat(tok: &ChatTokenizer, case: &Value) {
    let name = case["name"].as_str().unwrap();
    let msgs = messages(&case["messages"]);
    let text = tok.render_chat(&msgs).unwrap();
    assert_eq!(
        text,
        case["text"].as_str().unwrap(),
        "{name}: rendered text"
    );
    let want = ids(&case["ids"]);
    assert_eq!(tok.encode_chat(&msgs).unwrap(), want, "{name}: cold");
    assert_eq!(tok.encode_chat(&msgs).unwrap(), want, "{name}: warm");
    assert_eq!(
        tok.encode_text_uncached(&text, false).unwrap(),
        want,
        "{name}: uncached"
    );
}

#[test]
fn golden_chats_match_transformers() {
    let exp = expected();
    let tok = tiny();
    assert_eq!(tok.content_format(), ContentFormat::String);
    let chats = exp["chats"].as_array().unwrap();
    assert!(chats.len() >= 10);
    for case in chats {
        check_chat(&tok, case);
    }
}

#[test]
fn golden_prompts_match_transformers() {
    let exp = expected();
    let tok = tiny();
    for case in exp["prompts"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode_prompt(prompt).unwrap(), want, "{prompt:?}");
        assert_eq!(tok.encode_prompt(prompt).unwrap(), want, "{prompt:?} warm");
        assert_eq!(tok.encode_text_uncached(prompt, true).unwrap(), want);
    }
}

#[test]
fn golden_templates_match_jinja2() {
    let exp = expected();
    for group in exp["templates"].as_array().unwrap() {
        let tok = tiny()
            .with_chat_template(group["template"].as_str().unwrap())
            .unwrap();
        for case in group["chats"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let want_format = match case["content_format"].as_str().unwrap() {
                "openai" => ContentFormat::OpenAi,
                _ => ContentFormat::String,
            };
            assert_eq!(tok.content_format(), want_format, "{name}");
            if let Some(err) = case.get("error") {
                let got = tok.render_chat(&messages(&case["messages"])).unwrap_err();
                match got {
                    TokenizeError::TemplateRaised(msg) => {
                        assert_eq!(msg, err.as_str().unwrap(), "{name}")
                    }
                    other => panic!("{name}: {other}"),
                }
            } else {
                check_chat(&tok, case);
            }
        }
    }
}

#[test]
fn real_vllm_prompt_ids_are_reproduced() {
    let exp = expected();
    let tok = tiny();
    let caps = exp["vllm_captures"].as_array().unwrap();
    assert_eq!(caps.len(), 3);
    for cap in caps {
        let want = ids(&cap["ids"]);
        assert_eq!(want.len() as u64, cap["prompt_tokens"].as_u64().unwrap());
        let got = match cap["endpoint"].as_str().unwrap() {
            "chat" => tok.encode_chat(&messages(&cap["messages"])).unwrap(),
            _ => tok.encode_prompt(cap["prompt"].as_str().unwrap()).unwrap(),
        };
        assert_eq!(got, want, "{}", cap["name"]);
    }
}

#[test]
fn bos_post_processor_variant() {
    let exp = expected();
    let variant = &exp["variants"][0];
    let tj = tokenizer_json_with(|v| v["post_processor"] = variant["post_processor"].clone());
    let tok = ChatTokenizer::from_files_content(&tj, Some(CONFIG_JSON)).unwrap();
    for case in variant["prompts"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode_prompt(prompt).unwrap(),
            ids(&case["ids"]),
            "{prompt:?}"
        );
    }
    for case in variant["chats"].as_array().unwrap() {
        let msgs = messages(&case["messages"]);
        // vLLM's chat default: the template's BOS only.
        assert_eq!(tok.encode_chat(&msgs).unwrap(), ids(&case["ids"]));
        // A client asking for add_special_tokens gets a second BOS, as in vLLM.
        let opts = ChatOptions {
            add_special_tokens: true,
            ..ChatOptions::default()
        };
        let doubled = tok.encode_chat_with(&msgs, &opts).unwrap();
        assert_eq!(doubled, ids(&case["ids_add_special_tokens"]));
        assert_eq!(&doubled[..2], &[0, 0]);
    }
}

#[test]
fn long_system_prompt_is_tokenized_once() {
    let exp = expected();
    let long = exp["chats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "long_system")
        .unwrap();
    let tok = tiny();
    let mut msgs = messages(&long["messages"]);
    let first = tok.encode_chat(&msgs).unwrap();
    assert_eq!(first, ids(&long["ids"]));
    let after_first = tok.cache_stats();
    msgs[1].content = "A different question this time?".into();
    let second = tok.encode_chat(&msgs).unwrap();
    let after_second = tok.cache_stats();
    // Only the new user text missed; the 4.6k-token system segment and the fixed template
    // pieces were hits.
    assert_eq!(after_second.misses - after_first.misses, 1);
    assert!(after_second.hits > after_first.hits);
    let text = tok.render_chat(&msgs).unwrap();
    assert_eq!(second, tok.encode_text_uncached(&text, false).unwrap());
    let common = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(common > 4590, "shared prefix {common}");
}

#[test]
fn chat_options_and_kwargs() {
    let tok = tiny()
        .with_chat_template(
            "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\
             {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}\
             {% if enable_thinking is defined %} think={{ enable_thinking }}{% endif %}",
        )
        .unwrap();
    let msgs = [ChatMessage::new("user", "hi")];
    assert_eq!(
        tok.render_chat(&msgs).unwrap(),
        "<|begin_of_text|>user: hi<|eot_id|>assistant:"
    );
    let mut opts = ChatOptions {
        add_generation_prompt: false,
        ..ChatOptions::default()
    };
    opts.template_kwargs
        .insert("enable_thinking".into(), json!(false));
    assert_eq!(
        tok.render_chat_with(&msgs, &opts).unwrap(),
        "<|begin_of_text|>user: hi<|eot_id|> think=False"
    );
    assert_eq!(tok.special_token("bos_token"), Some("<|begin_of_text|>"));
    assert_eq!(tok.special_token("pad_token"), Some("<|pad|>"));
    assert_eq!(tok.token_to_id("<|eot_id|>"), Some(4));
    assert_eq!(tok.tokenizer_class(), Some("PreTrainedTokenizerFast"));
}

#[test]
fn strftime_now_uses_the_clock() {
    fn fixed() -> i64 {
        1_722_000_309 // 2024-07-26 13:25:09 UTC
    }
    let tok = tiny()
        .with_chat_template("Today Date: {{ strftime_now('%d %b %Y') }}")
        .unwrap()
        .with_clock(fixed)
        .unwrap();
    assert_eq!(
        tok.render_chat(&[ChatMessage::new("user", "x")]).unwrap(),
        "Today Date: 26 Jul 2024"
    );
}

#[test]
fn errors() {
    let no_template = ChatTokenizer::from_files_content(TOKENIZER_JSON, None).unwrap();
    assert!(!no_template.has_chat_template());
    assert!(matches!(
        no_template.encode_chat(&[ChatMessage::new("user", "x")]),
        Err(TokenizeError::NoChatTemplate)
    ));
    // Prompts work without a config.
    assert_eq!(
        no_template.encode_prompt("def foo(): return 1").unwrap(),
        vec![321, 286, 1555, 821, 325, 395]
    );
    assert!(matches!(
        tiny().encode_chat(&[]),
        Err(TokenizeError::EmptyConversation)
    ));
    assert!(matches!(
        ChatTokenizer::from_files_content("{", None),
        Err(TokenizeError::InvalidTokenizer(_))
    ));
    assert!(matches!(
        ChatTokenizer::from_files_content(TOKENIZER_JSON, Some("[1]")),
        Err(TokenizeError::InvalidConfig(_))
    ));
    assert!(matches!(
        tiny().with_chat_template("{% for %}"),
        Err(TokenizeError::InvalidTemplate(_))
    ));
    let e = tiny()
        .with_chat_template("{{ messages[0].content.nope() }}")
        .unwrap()
        .render_chat(&[ChatMessage::new("user", "x")])
        .unwrap_err();
    assert!(matches!(e, TokenizeError::Render(_)), "{e}");
}

#[test]
fn named_templates_and_missing_special_tokens() {
    let mut cfg: Value = serde_json::from_str(CONFIG_JSON).unwrap();
    let own = cfg["chat_template"].clone();
    cfg["chat_template"] = json!([
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": own},
    ]);
    // A named special token the tokenizer does not list as added becomes an atomic token.
    cfg["unk_token"] = json!({"content": "<unk>", "lstrip": false, "normalized": false,
                              "rstrip": false, "single_word": false, "special": true});
    let tok = ChatTokenizer::from_files_content(TOKENIZER_JSON, Some(&cfg.to_string())).unwrap();
    let msgs = [ChatMessage::new("user", "a<unk>b")];
    let text = tok.render_chat(&msgs).unwrap();
    assert!(text.starts_with("<|begin_of_text|><|start_header_id|>user"));
    let unk = tok.token_to_id("<unk>").unwrap();
    let got = tok.encode_chat(&msgs).unwrap();
    assert!(got.contains(&unk));
    assert_eq!(got, tok.encode_text_uncached(&text, false).unwrap());
}

const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[test]
fn fast_path_applies_where_expected() {
    let by_name: std::collections::HashMap<_, _> = variants().into_iter().collect();
    for (name, fast) in [
        ("tiny", true),
        ("tiny_no_cache", true),
        ("strip_only", true),
        ("llama3_split", true),
        ("prefix_space", true),
        ("strip", false),             // a normalized added token
        ("metaspace_first", false),   // not byte-level
        ("prepend_lowercase", false), // a normalizer
    ] {
        assert_eq!(by_name[name].uses_fast_path(), fast, "{name}");
    }
}

/// Tokenizer variants whose splitting is easy to get wrong.
fn variants() -> Vec<(&'static str, ChatTokenizer)> {
    let strip = tokenizer_json_with(|v| {
        let added = v["added_tokens"].as_array_mut().unwrap();
        for t in added.iter_mut() {
            match t["content"].as_str().unwrap() {
                "<|end_header_id|>" => t["rstrip"] = json!(true),
                "<|eot_id|>" => t["lstrip"] = json!(true),
                "<|start_header_id|>" => {
                    t["lstrip"] = json!(true);
                    t["rstrip"] = json!(true);
                }
                _ => {}
            }
        }
        // A normalized (non-special) added token: matched inside segments.
        added.push(
            json!({"id": 2048, "content": "cache", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": true, "special": false}),
        );
    });
    let metaspace = tokenizer_json_with(|v| {
        v["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "Ġ",
                                    "prepend_scheme": "first", "split": true});
    });
    let prepend = tokenizer_json_with(|v| {
        v["normalizer"] = json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "Ġ"}, {"type": "Lowercase"}]});
    });
    let single_word = tokenizer_json_with(|v| {
        v["added_tokens"][4]["single_word"] = json!(true);
    });
    let strip_only = tokenizer_json_with(|v| {
        for t in v["added_tokens"].as_array_mut().unwrap() {
            t["lstrip"] = json!(true);
            t["rstrip"] = json!(true);
        }
    });
    // Llama 3's pre-tokenizer on the tiny vocabulary.
    let llama3 = tokenizer_json_with(|v| {
        v["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
             "use_regex": false}]});
    });
    let prefix_space = tokenizer_json_with(|v| {
        v["pre_tokenizer"]["add_prefix_space"] = json!(true);
    });
    let build = |tj: &str| ChatTokenizer::from_files_content(tj, Some(CONFIG_JSON)).unwrap();
    vec![
        ("tiny", tiny()),
        ("tiny_no_cache", tiny().with_cache_bytes(0)),
        ("strip_only", build(&strip_only)),
        ("llama3_split", build(&llama3)),
        ("prefix_space", build(&prefix_space)),
        ("strip", build(&strip)),
        ("metaspace_first", build(&metaspace)),
        ("prepend_lowercase", build(&prepend)),
        ("single_word", build(&single_word)),
    ]
}

#[test]
fn cached_equals_uncached_on_variants() {
    let exp = expected();
    let mut texts: Vec<String> = exp["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["prompt"].as_str().unwrap().to_owned())
        .collect();
    texts.extend(
        [
            " <|eot_id|>  <|start_header_id|>\n x <|end_header_id|>\t\ty",
            "<|start_header_id|><|start_header_id|>  ",
            "  leading",
            "a cache, Cache and caches",
            "",
        ]
        .map(str::to_owned),
    );
    for (name, tok) in variants() {
        for case in exp["chats"].as_array().unwrap() {
            let msgs = messages(&case["messages"]);
            let text = tok.render_chat(&msgs).unwrap();
            let want = tok.encode_text_uncached(&text, false).unwrap();
            assert_eq!(
                tok.encode_chat(&msgs).unwrap(),
                want,
                "{name} {}",
                case["name"]
            );
            assert_eq!(tok.encode_chat(&msgs).unwrap(), want, "{name} warm");
        }
        for text in &texts {
            for special in [false, true] {
                let want = tok.encode_text_uncached(text, special).unwrap();
                assert_eq!(
                    tok.encode_text(text, special).unwrap(),
                    want,
                    "{name} {text:?}"
                );
            }
        }
    }
}

#[test]
fn concurrent_use_agrees() {
    let exp = expected();
    let tok = Arc::new(tiny().with_cache_bytes(1 << 20));
    let cases: Arc<Vec<(Vec<ChatMessage>, Vec<u32>)>> = Arc::new(
        exp["chats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (messages(&c["messages"]), ids(&c["ids"])))
            .collect(),
    );
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let tok = Arc::clone(&tok);
            let cases = Arc::clone(&cases);
            std::thread::spawn(move || {
                for round in 0..3 {
                    for (i, (msgs, want)) in cases.iter().enumerate() {
                        if (i + t + round) % 2 == 0 {
                            assert_eq!(&tok.encode_chat(msgs).unwrap(), want);
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = tok.cache_stats();
    assert!(s.hits > 0 && s.bytes <= s.budget);
}

#[test]
fn tiny_cache_budget_still_correct() {
    let exp = expected();
    // Room for a few small segments only: constant eviction.
    let tok = tiny().with_cache_bytes(16 * 200);
    for _ in 0..2 {
        for case in exp["chats"].as_array().unwrap() {
            assert_eq!(
                tok.encode_chat(&messages(&case["messages"])).unwrap(),
                ids(&case["ids"])
            );
        }
    }
    let s = tok.cache_stats();
    assert!(s.evictions > 0);
    assert!(s.bytes <= s.budget);
    let off = tiny().with_cache_bytes(0);
    let case = &exp["chats"][0];
    assert_eq!(
        off.encode_chat(&messages(&case["messages"])).unwrap(),
        ids(&case["ids"])
    );
    assert_eq!(off.cache_stats().entries, 0);
}

fn content_strategy() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        4 => "[a-zA-Z]{1,12}",
        2 => "[ \t\n]{1,4}",
        1 => Just("<|eot_id|>".to_owned()),
        1 => Just("<|start_header_id|>".to_owned()),
        1 => Just("<|end_header_id|>".to_owned()),
        1 => Just("<|begin_of_text|>".to_owned()),
        1 => Just("cache".to_owned()),
        1 => "[0-9]{1,5}",
        1 => "[.,;:!?'\"(){}\\[\\]]{1,3}",
        1 => "\\PC{1,4}",
        1 => Just("日本語 👩‍💻 é".to_owned()),
        2 => "[ \t\n\r\u{a0}\u{3000}\u{2028}]{1,5}",
        1 => "'(s|t|re|ve|m|ll|d|S|LL|Re)",
    ];
    prop::collection::vec(atom, 0..24).prop_map(|v| v.concat())
}

fn chat_strategy() -> impl Strategy<Value = Vec<ChatMessage>> {
    let role = prop_oneof![
        Just("system"),
        Just("user"),
        Just("assistant"),
        Just("tool"),
        Just("developer"),
    ];
    prop::collection::vec((role, content_strategy()), 1..6)
        .prop_map(|v| v.into_iter().map(|(r, c)| ChatMessage::new(r, c)).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn prop_cached_chat_equals_uncached(chat in chat_strategy()) {
        // Shared across cases through a thread-local so the cache warms up over the run.
        thread_local! {
            static TOKS: Vec<(&'static str, ChatTokenizer)> = variants();
        }
        TOKS.with(|toks| {
            for (name, tok) in toks {
                let text = tok.render_chat(&chat).unwrap();
                let want = tok.encode_text_uncached(&text, false).unwrap();
                prop_assert_eq!(&tok.encode_chat(&chat).unwrap(), &want, "{}", name);
                prop_assert_eq!(&tok.encode_chat(&chat).unwrap(), &want, "{} warm", name);
            }
            Ok(())
        })?;
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn prop_cached_text_equals_uncached(text in content_strategy(), special: bool) {
        thread_local! {
            static TOKS: Vec<(&'static str, ChatTokenizer)> = variants();
        }
        TOKS.with(|toks| {
            for (name, tok) in toks {
                let want = tok.encode_text_uncached(&text, special).unwrap();
                prop_assert_eq!(&tok.encode_text(&text, special).unwrap(), &want, "{}", name);
            }
            Ok(())
        })?;
    }
}
