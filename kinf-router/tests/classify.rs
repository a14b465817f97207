//! Built-in classifiers: entity rules, hard negatives, configuration, complexity, and the
//! precision/recall targets on testdata/classify/corpus.jsonl.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use kinf_policy::{ClassifierSpec, ClassifierType, PiiEntity};
use kinf_router::classify::eval::{evaluate, parse_jsonl};
use kinf_router::classify::pii::{iban_checksum, luhn};
use kinf_router::classify::{
    Classifiers, Complexity, ComplexityConfig, ComplexityLevel, Message, Pii, redact,
};

fn pii_tags(text: &str) -> Vec<String> {
    let c = Classifiers::new(Some(Pii::new(&PiiEntity::ALL)), None);
    c.classify(&[Message::new("user", text)])
        .tags
        .iter()
        .map(|t| t.to_string())
        .collect()
}

fn assert_entity(text: &str, entity: &str) {
    let tags = pii_tags(text);
    assert!(
        tags.iter().any(|t| t == &format!("pii-{entity}"))
            && tags.iter().any(|t| t == "pii-detected"),
        "expected pii-{entity} in {text:?}, got {tags:?}"
    );
}

fn assert_clean(text: &str) {
    let tags = pii_tags(text);
    assert!(tags.is_empty(), "expected no PII in {text:?}, got {tags:?}");
}

#[test]
fn all_patterns_compile() {
    assert_eq!(Pii::new(&PiiEntity::ALL).pattern_count(), 14);
}

#[test]
fn emails() {
    assert_entity("write to jane.doe+news@mail.example.org today", "email");
    assert_entity("{\"email\":\"a.b@uni-hamburg.de\"}", "email");
    assert_clean("the retina asset is icon@2x.png");
    assert_clean("@property\ndef name(self): ...");
    assert_clean("npm i left-pad@1.3.0");
}

#[test]
fn phones() {
    for p in [
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "+1 415 555 0132",
        "1-800-555-0199",
        "+44 20 7946 0958",
        "020 7946 0958",
        "07700 900123",
        "+49 30 12345678",
        "030 12345678",
        "0151 23456789",
        "+49 (0)89 1234567",
        "+33 1 23 45 67 89",
        "01 23 45 67 89",
        "06.12.34.56.78",
        "+4915123456789",
    ] {
        assert_entity(&format!("call me at {p} please"), "phone");
    }
    assert_clean("order id 4155550132");
    assert_clean("call 4155550132"); // no separators: documented miss
    assert_clean("SKU 550-123-4567");
    assert_clean("order #555-123-4567");
    assert_clean("2024-01-15 10:30:00");
    assert_clean("am 01.02.2024 10.30 im Raum");
    assert_clean("ISBN 978-3-16-148410-0");
    assert_clean("grew from 1 234 567 to 1 345 678");
    assert_clean("0.5 0.25 0.125 0.0625");
}

#[test]
fn ssns() {
    assert_entity("SSN 123-45-6789", "ssn");
    assert_entity("ssn: 123456789", "ssn");
    assert_entity("id card 078 05 1121 x", "ssn");
    for bad in [
        "000-12-3456",
        "666-12-3456",
        "912-34-5678",
        "123-00-4567",
        "123-45-0000",
    ] {
        assert_clean(&format!("number {bad} here"));
    }
    assert_clean("part no. 123-45-6789");
    assert_clean("uuid 550e8400-e29b-41d4-a716-446655440000");
}

#[test]
fn cards() {
    assert!(luhn(&[4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]));
    assert_entity("card 4111 1111 1111 1111", "credit-card");
    assert_entity("card 4111-1111-1111-1111 exp 09/27", "credit-card");
    assert_entity("amex 3782 822463 10005", "credit-card");
    assert_entity("pan=5555555555554444;", "credit-card");
    assert_entity("card 4111 1111 1111 1111 2027", "credit-card");
    assert_clean("card 4111 1111 1111 1112");
    assert_clean("order 4111111111111111");
    assert_clean("ts 1700000000000 and 1700000000000000000");
    assert_clean("sha e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

#[test]
fn ibans() {
    assert!(iban_checksum("DE89370400440532013000"));
    assert!(!iban_checksum("DE88370400440532013000"));
    assert_entity("IBAN DE89 3704 0044 0532 0130 00 AND more", "iban");
    assert_entity("GB82WEST12345698765432", "iban");
    assert_entity("NL91ABNA0417164300.", "iban");
    assert_clean("DE88 3704 0044 0532 0130 00");
    assert_clean("NL91ABNA04171643001"); // too long for NL
}

#[test]
fn ip_addresses() {
    assert_entity("from 203.0.113.45 port 22", "ip-address");
    assert_entity("1.2.3.4", "ip-address");
    assert_entity("host: 10.0.12.7", "ip-address");
    assert_entity("addr 2001:db8:85a3::8a2e:370:7334.", "ip-address");
    assert_entity("fe80::1ff:fe23:4567:890a", "ip-address");
    assert_clean("version 1.2.3.4");
    assert_clean("pin v1.2.3.4");
    assert_clean("release 10.0.0.1 notes");
    assert_clean("999.1.1.1 and 1.02.3.4");
    assert_clean("OID 1.3.6.1.4.1.311");
    assert_clean("127.0.0.1 0.0.0.0 255.255.255.0 ::1");
    assert_clean("at 10:30:45 the MAC 00:1A:2B:3C:4D:5E and std::vector and a::b");
    assert_clean("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

#[test]
fn credentials() {
    assert_entity("key AKIAZ7VRSQ5ABCD2EFGH", "credential");
    assert_entity("ASIAQWERTYUIOPASDF23", "credential");
    assert_entity(
        "token = \"ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6\"",
        "credential",
    );
    assert_entity(
        "xoxb-123456789012-123456789012-abcDEF123ghiJKL456",
        "credential",
    );
    assert_entity("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "credential");
    assert_entity("Authorization: Bearer abc123DEF456ghi789JKL", "credential");
    assert_entity(
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "credential",
    );
    assert_entity(
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq3Zx9Yw1example0keymaterial0000abcdefgh\n-----END RSA PRIVATE KEY-----",
        "credential",
    );
    assert_clean("AKIAIOSFODNN7EXAMPLE");
    assert_clean("Authorization: Bearer <YOUR_TOKEN>");
    assert_clean("Bearer YOUR_ACCESS_TOKEN_HERE");
    assert_clean("sk-your-key-here");
    assert_clean("eyJub3Rqc29uIjp9.eyJ4IjoxfQ.abc"); // header has no alg
    assert_clean(
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
    );
    assert_clean("what is `-----BEGIN PRIVATE KEY-----`?");
}

#[test]
fn matches_are_redacted_and_located() {
    let c = Classifiers::default();
    let msgs = [
        Message::new("system", "be nice"),
        Message::new("user", "mail bob@example.com"),
    ];
    let out = c.classify(&msgs);
    assert_eq!(out.matches.len(), 1);
    let m = &out.matches[0];
    assert_eq!((m.message_index, m.start, m.end), (1, 5, 20));
    assert_eq!(m.redacted, "b*************m");
    assert_eq!(&*m.tag, "pii-email");
    assert!(!out.matches.iter().any(|m| m.redacted.contains("example")));
    assert_eq!(redact("ab"), "**");
    assert_eq!(redact("äbcö"), "ä**ö");
}

#[test]
fn every_message_is_read() {
    let c = Classifiers::default();
    for role in ["system", "assistant", "tool", "user"] {
        let msgs = [
            Message::new(role, "SSN 123-45-6789"),
            Message::new("user", "thanks"),
        ];
        assert!(
            c.classify(&msgs).tags.iter().any(|t| &**t == "pii-ssn"),
            "{role}"
        );
    }
}

#[test]
fn from_specs_respects_entities_and_types() {
    let spec = |t, e: Vec<PiiEntity>| ClassifierSpec {
        name: "c".into(),
        type_: t,
        entities: e,
        url: None,
        tags: vec![],
        timeout: None,
        failure_mode: None,
        failure_tag: None,
        thresholds: None,
    };
    let only_email = Classifiers::from_specs(&[spec(ClassifierType::Pii, vec![PiiEntity::Email])]);
    let out = only_email.classify(&[Message::new("user", "a@b.io SSN 123-45-6789")]);
    let tags: Vec<&str> = out.tags.iter().map(|t| &**t).collect();
    assert_eq!(tags, ["pii-detected", "pii-email"]);
    let none = Classifiers::from_specs(&[spec(ClassifierType::External, vec![])]);
    assert!(none.is_empty());
    assert!(
        none.classify(&[Message::new("user", "a@b.io")])
            .tags
            .is_empty()
    );
    let cx = Classifiers::from_specs(&[spec(ClassifierType::Complexity, vec![])]);
    let tags = cx.classify(&[Message::new("user", "hi a@b.io")]).tags;
    assert_eq!(tags.len(), 1);
    assert_eq!(&*tags[0], "complexity-low");
}

#[test]
fn complexity_levels() {
    let c = Complexity::new(ComplexityConfig::default());
    assert_eq!(
        c.level(&[Message::new("user", "Write a haiku about autumn.")]),
        ComplexityLevel::Low
    );
    let medium = "Explain this code and fix the bug?\n```python\ndef f(x):\n    return x / 0\n```\nWhat happens?";
    assert_eq!(
        c.level(&[Message::new("user", medium)]),
        ComplexityLevel::Medium
    );
    let mut high = String::from(
        "First, prove the theorem. Then derive the integral \\int_0^1 x^2 dx and the derivative.\n",
    );
    for i in 1..=8 {
        high.push_str(&format!(
            "{i}. step {i}: compute the eigenvalue of matrix A_{i}? Then check ≤ bounds.\n"
        ));
    }
    high.push_str(&"context ".repeat(600));
    assert_eq!(
        c.level(&[Message::new("user", &high)]),
        ComplexityLevel::High
    );
    let strict = Complexity::new(ComplexityConfig {
        medium_at: 1,
        high_at: 2,
        ..ComplexityConfig::default()
    });
    assert_eq!(
        strict.level(&[Message::new("user", medium)]),
        ComplexityLevel::High
    );
}

#[test]
fn corpus_meets_targets() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/classify/corpus.jsonl"
    ))
    .unwrap();
    let examples = parse_jsonl(&text).unwrap();
    assert!(examples.len() >= 300);
    let report = evaluate(&Classifiers::default(), &examples);
    let d = report.tag("pii-detected").unwrap();
    assert!(d.recall >= 0.98, "recall {d:?} {:?}", report.mistakes);
    assert!(d.precision >= 0.95, "precision {d:?} {:?}", report.mistakes);
    assert!(
        report.tag("complexity-low").is_none(),
        "complexity is unlabelled, so unscored"
    );
}

/// Complexity thresholds from a GatewayBackend spec move the levels.
#[test]
fn complexity_thresholds_from_the_spec_move_the_levels() {
    use kinf_policy::{ClassifierSpec, ClassifierType, ComplexityThresholds};
    use kinf_router::classify::{Classifiers, Message};
    let spec = |t: Option<ComplexityThresholds>| ClassifierSpec {
        name: "c".into(),
        type_: ClassifierType::Complexity,
        entities: vec![],
        url: None,
        tags: vec![],
        timeout: None,
        failure_mode: None,
        failure_tag: None,
        thresholds: t,
    };
    let msgs = [Message::new("user", "Why? How? When?")];
    let default = Classifiers::from_specs(&[spec(None)]).classify(&msgs).tags;
    assert_eq!(default, vec![std::sync::Arc::<str>::from("complexity-low")]);
    // Three question marks score 2 points with questions [1, 3]; medium from 2.
    let strict = Classifiers::from_specs(&[spec(Some(ComplexityThresholds {
        questions: Some(vec![1, 3]),
        ..Default::default()
    }))])
    .classify(&msgs)
    .tags;
    assert_eq!(
        strict,
        vec![std::sync::Arc::<str>::from("complexity-medium")]
    );
}

/// Inputs built to make a start inside a long run re-scan the run (the `sk-`, `xox`, `glpat-`
/// and JWT patterns, IPv6 runs, PEM headers followed by blank lines): the scan stays linear.
/// Quadratic scans took seconds per 64 KiB here (minutes per MiB); the bound leaves a wide
/// margin for slow debug builds on a busy machine.
#[test]
fn pathological_inputs_scan_in_linear_time() {
    let c = Classifiers::default();
    for unit in [
        "sk-",
        "xoxb-",
        "glpat-",
        "eyJ-",
        ":",
        "a:",
        "1:",
        "::1.",
        "-----BEGIN PRIVATE KEY-----\n\n",
    ] {
        let text = unit.repeat(64 * 1024 / unit.len());
        let t = std::time::Instant::now();
        let out = c.classify(&[Message::new("user", &text)]);
        let took = t.elapsed();
        assert!(out.matches.is_empty(), "{unit:?}");
        assert!(
            took < std::time::Duration::from_secs(2),
            "{unit:?} x {}: {took:?}",
            text.len() / unit.len()
        );
    }
}

/// Letters of scripts written without spaces (CJK, kana, Hangul, Thai) do not glue a value to
/// a word: a value written directly against them is found.
#[test]
fn values_written_against_unspaced_scripts_are_found() {
    assert_entity("请拨打+86 138 0013 8000联系我", "phone");
    assert_entity("邮箱zhang.wei@example.com谢谢", "email");
    assert_entity("メールはtaro@example.jpです", "email");
    assert_entity("カード番号4111 1111 1111 1111です", "credit-card");
    assert_entity("IP地址192.168.1.20", "ip-address");
    assert_entity("이메일은 kim@example.com입니다", "email");
    assert_entity("โทร+66 2 123 4567ครับ", "phone");
    assert_entity(
        "密钥sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z。",
        "credential",
    );
    // Letters of spaced scripts still glue: the digits belong to the word.
    assert_clean("été4111 1111 1111 1111");
    assert_clean("Größe192.168.1.20");
}

/// Every country of the IBAN registry, not only the first 69.
#[test]
fn ibans_of_every_registry_country() {
    for iban in [
        "VA59 0011 2300 0012 3456 78",
        "LC55 HEMM 0001 0001 0012 0012 0002 3015",
        "BY13 NBRB 3600 9000 0000 2Z00 AB00",
        "SC18 SSCB 1101 0000 0000 0000 1497 USD",
        "ST23 0001 0001 0051 8453 1014 6",
        "SV62 CENR 0000 0000 0000 0070 0025",
        "TL38 0080 0123 4567 8910 157",
        "IQ98 NBIQ 8501 2345 6789 012",
        "BI42 1000 0100 0100 0033 2045 181",
        "DJ9012345678901234567890123",
        "FK4912345678901234",
        "HN29ABCD12345678901234567890",
        "LY37123456789012345678901",
        "MN181234567890123456",
        "NI87ABCD12345678901234567890",
        "OM311234567890123456789",
        "RU29ABCD1234567890123456789012345",
        "SD5012345678901234",
        "SO861234567890123456789",
        "YE79ABCD1234567890123456789012",
    ] {
        assert!(iban_checksum(&iban.replace(' ', "")), "{iban}");
        assert_entity(&format!("pay to {iban} today"), "iban");
    }
}

/// `tel:` URIs and labels glued to the number with a colon, and `+CC` followed by the whole
/// national number in one group.
#[test]
fn phones_in_uris_and_with_an_unsplit_national_number() {
    for p in [
        "<a href=\"tel:+14155550132\">call</a>",
        "tel:+1-415-555-0132",
        "phone:+44 20 7946 0958",
        "Mobile:0151 23456789",
        "call +91-9876543210 now",
        "call +91 9876543210 now",
        "call +44 7700900123 now",
        "call +1-4155550132 now",
    ] {
        assert_entity(p, "phone");
    }
    // A colon after a digit is still a time or a ratio; identifiers stay identifiers.
    assert_clean("at 10:30 555 0132 99");
    assert_clean("ISBN:978-3-16-148410-0");
    assert_clean("SKU:550-123-4567");
    assert_clean("scale 1:555-123-4567");
    // A `+` group longer than 14 digits is no phone (E.164 has at most 15 digits).
    assert_clean("value +1 4155550132123456");
}

/// SSH/scp remotes (`user@host:path`) are not e-mail addresses.
#[test]
fn scp_remotes_are_not_emails() {
    assert_clean("git clone git@github.com:org/repo.git");
    assert_clean("scp build.tar deploy@files.example.com:/srv/releases/");
    assert_entity("mail jane@example.com: she answers", "email");
    assert_entity("mail jane@example.com:", "email");
}

/// `kinfctl classify --file` reads a request as the gateway does: Anthropic's top-level
/// `system`, the `content` of `tool_result` blocks, text parts of any type, the function
/// names and arguments of `tool_calls` (after the messages), and completions prompts.
#[test]
fn request_files_are_read_as_the_gateway_reads_them() {
    use kinf_router::classify::eval::messages_from_json;
    let read = |v: serde_json::Value| -> Vec<(String, String)> {
        messages_from_json(&v)
            .unwrap()
            .into_iter()
            .map(|m| (m.role, m.content))
            .collect()
    };
    let pair = |r: &str, c: &str| (r.to_string(), c.to_string());
    let anthropic = serde_json::json!({
        "model": "claude",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "Customer: jane@example.com"}],
        "messages": [
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "SSN 123-45-6789"}
                ]},
                {"type": "image", "source": {"type": "base64", "data": "AAAA"}}
            ]},
            {"role": "assistant", "content": "ok"}
        ]
    });
    assert_eq!(
        read(anthropic),
        [
            pair("system", "Customer: jane@example.com"),
            pair("user", "SSN 123-45-6789"),
            pair("assistant", "ok"),
        ]
    );
    let openai = serde_json::json!({
        "messages": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "lookup", "arguments": "{\"card\":\"4111111111111111\"}"}}
            ]},
            {"role": "tool", "content": "done"}
        ]
    });
    assert_eq!(
        read(openai),
        [
            pair("user", "hi"),
            pair("assistant", ""),
            pair("tool", "done"),
            pair("assistant", "lookup {\"card\":\"4111111111111111\"}"),
        ]
    );
    assert_eq!(
        read(serde_json::json!({"prompt": ["a@b.io", "c"]})),
        [pair("user", "a@b.io"), pair("user", "c")]
    );
    assert_eq!(
        read(serde_json::json!({"prompt": "x"})),
        [pair("user", "x")]
    );
    assert!(read(serde_json::json!({"prompt": [1, 2, 3]})).is_empty());
    assert!(messages_from_json(&serde_json::json!({"model": "m"})).is_err());
}

/// A tool call's name and arguments, read as a message of its own (`Message::also_seen`), is
/// text of the message that made the call, not a conversation turn: an assistant message with
/// three parallel tool calls is one turn, not four. Tool results are messages, and count.
#[test]
fn tool_calls_are_no_turns_of_their_own() {
    let c = Complexity::new(ComplexityConfig::default());
    let call = r#"lookup {"id": 1}"#;
    let mut msgs = vec![
        Message::new("system", "be brief"),
        Message::new("user", "look these up"),
        Message::new("assistant", ""),
        Message::new("tool", "a"),
        Message::new("tool", "b"),
        Message::new("tool", "c"),
        Message::new("user", "thanks"),
    ];
    assert_eq!(c.features(&msgs).turns, 6);
    let tokens = c.features(&msgs).tokens;
    msgs.extend([Message::also_seen("assistant", call); 3]);
    let f = c.features(&msgs);
    assert_eq!(f.turns, 6, "the calls' text is no turn");
    // ...but it is read: its bytes count, as every other feature does.
    assert_eq!(f.tokens, tokens + 3 * call.len() / 4);
    assert!(Message::also_seen("assistant", "x").also_seen);
    assert!(!Message::new("assistant", "x").also_seen);
}

/// `kinfctl classify --file` reads an Anthropic `tool_use` block's `name` and `input` as the
/// gateway does, after the messages, like an OpenAI tool call; `tool_result` content is part
/// of its message. Tool calls and later batch prompts are marked `also_seen` (no turns).
#[test]
fn request_files_read_anthropic_tool_use_blocks() {
    use kinf_router::classify::eval::messages_from_json;
    let anthropic = serde_json::json!({
        "model": "claude",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "What is on my card?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "lookup",
                 "input": {"card": "4111 1111 1111 1111"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "holder jane@example.com"}
            ]}
        ]
    });
    let msgs = messages_from_json(&anthropic).unwrap();
    let read: Vec<(&str, &str, bool)> = msgs
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str(), m.also_seen))
        .collect();
    assert_eq!(
        read,
        [
            ("user", "What is on my card?", false),
            ("assistant", "Let me look.", false),
            ("user", "holder jane@example.com", false),
            (
                "assistant",
                r#"lookup {"card":"4111 1111 1111 1111"}"#,
                true
            ),
        ]
    );
    let borrowed: Vec<Message<'_>> = msgs.iter().map(|m| m.as_message()).collect();
    let out = Classifiers::default().classify(&borrowed);
    let found: Vec<(usize, &str)> = out
        .matches
        .iter()
        .map(|m| (m.message_index, &*m.tag))
        .collect();
    assert_eq!(found, [(2, "pii-email"), (3, "pii-credit-card")]);
    let c = Complexity::new(ComplexityConfig::default());
    assert_eq!(c.features(&borrowed).turns, 3);

    let openai = serde_json::json!({"messages": [
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]}
    ]});
    let msgs = messages_from_json(&openai).unwrap();
    assert_eq!(
        msgs.iter().map(|m| m.also_seen).collect::<Vec<_>>(),
        [false, true]
    );
    // The deprecated single `function_call` is read like a `tool_calls` entry.
    let legacy = serde_json::json!({"messages": [
        {"role": "assistant", "content": null,
         "function_call": {"name": "send", "arguments": "{\"card\":\"4111 1111 1111 1111\"}"}}
    ]});
    let msgs = messages_from_json(&legacy).unwrap();
    assert_eq!(msgs.len(), 2);
    assert!(msgs[1].also_seen);
    let borrowed: Vec<_> = msgs.iter().map(|m| m.as_message()).collect();
    let out = Classifiers::default().classify(&borrowed);
    assert!(
        out.tags.iter().any(|t| &**t == "pii-credit-card"),
        "{:?}",
        out.tags
    );
    let batch = messages_from_json(&serde_json::json!({"prompt": ["a", "b", "c"]})).unwrap();
    assert_eq!(
        batch.iter().map(|m| m.also_seen).collect::<Vec<_>>(),
        [false, true, true]
    );
}

/// The tags lint assumes for a bundle without any GatewayBackend (so that KINF0502 does not
/// warn about them) are those of the classifiers the gateway runs there,
/// `Classifiers::default()`: `Pii` with every entity, and `Complexity`.
#[test]
fn lint_knows_the_tags_of_the_default_classifiers() {
    let c = Classifiers::default();
    let mut produced: Vec<String> = vec!["pii-detected".into()];
    produced.extend(
        c.pii()
            .unwrap()
            .entities()
            .iter()
            .map(|e| format!("pii-{}", e.as_str())),
    );
    assert!(c.complexity().is_some());
    produced.extend(["complexity-low", "complexity-medium", "complexity-high"].map(String::from));
    produced.sort();
    let lint: Vec<String> = kinf_lang::check::default_classifier_tags()
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(lint, produced);
    // And they are what the classifiers say.
    let out = c.classify(&[Message::new(
        "user",
        "SSN 123-45-6789, mail jane@example.com, card 4111 1111 1111 1111",
    )]);
    for t in &out.tags {
        assert!(lint.contains(&t.to_string()), "{t} is unknown to lint");
    }
}

/// Overlaps between candidates were resolved by comparing each with every value kept so far:
/// a text of many values (a pasted access log, a contact list) took quadratic time (128 KiB
/// of IP addresses 0.8 s in a debug build, 1 MiB about a minute).
#[test]
fn many_values_resolve_in_linear_time() {
    let c = Classifiers::default();
    for (unit, entity) in [
        ("1.2.3.4 ", "ip-address"),
        ("x@y.co ", "email"),
        ("SSN 123-45-6789\n", "ssn"),
    ] {
        let text = unit.repeat(1024 * 1024 / unit.len());
        let t = std::time::Instant::now();
        let out = c.classify(&[Message::new("user", &text)]);
        let took = t.elapsed();
        assert_eq!(out.matches.len(), text.len() / unit.len(), "{unit:?}");
        assert!(out.matches.iter().all(|m| m.entity.as_str() == entity));
        assert!(
            out.matches.windows(2).all(|w| w[0].end <= w[1].start),
            "{unit:?}: matches out of order"
        );
        assert!(
            took < std::time::Duration::from_secs(4),
            "{unit:?} x {}: {took:?}",
            text.len() / unit.len()
        );
    }
}

/// A `Name/1.2.3.4` product token (a browser's user agent, pasted from a log) is a version,
/// not an address; an address in a URL still is one.
#[test]
fn user_agent_versions_are_not_ip_addresses() {
    assert_clean(
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) \
         Chrome/120.0.0.0 Safari/537.36",
    );
    assert_clean("curl/8.4.0.1 and Edg/120.0.2210.91");
    assert_entity("GET http://10.0.0.5/health", "ip-address");
    assert_entity("route 10.0.0.0/8 via 10.1.2.3", "ip-address");
    for (text, n) in [
        ("peers: 10.1.2.3/10.1.2.4", 2),
        ("GET /v1/nodes/10.0.0.5/status", 1),
        ("https://example.com/10.0.0.5", 1),
    ] {
        let out = Classifiers::default().classify(&[Message::new("user", text)]);
        assert_eq!(out.matches.len(), n, "{text:?}: {:?}", out.matches);
    }
}

/// A phone's label may be written in any script (`Телефон:`, `Τηλ:`), or abbreviated with a
/// dot (`Tel.:`), with no space before the number; a colon after a digit still is a time.
#[test]
fn phones_after_labels_in_any_script() {
    assert_entity("Телефон:+7 495 123-45-67", "phone");
    assert_entity("Τηλέφωνο:+30 21 0123 4567", "phone");
    assert_entity("Tel.:+49 30 12345678", "phone");
    assert_entity("Tel.:030 12345678", "phone");
    assert_clean("um 10:30 12 34 56 78");
    assert_clean("ratio 1.:20 12 34 56 78");
}

/// `My SSN is 123456789`: a few filler words (`is`, `number`, `no`, ...) may come between the
/// label and nine unseparated digits.
#[test]
fn ssn_label_with_filler_words() {
    for text in [
        "My SSN is 123456789.",
        "SSN number: 123456789",
        "social security number is 078051120",
        "Social Security No. is 078051120",
        "ssn was: 078-05-1120",
    ] {
        assert_entity(text, "ssn");
    }
    assert_clean("my SSN is 000123456"); // area 000
    assert_clean("SSN is a 9-digit number; order 123456789");
    assert_clean("ssn isbn 123456789");
}

/// A local part may hold letters of any spaced script (`jörg.müller@`, `émile@`, `андрей@`),
/// as RFC 6531 allows: the whole address is found, not only the ASCII tail after the last
/// non-ASCII letter (which was glued to it, so nothing was found). Letters of unspaced scripts
/// still end it (`メールはtaro@example.jp`).
#[test]
fn emails_with_non_ascii_local_parts() {
    let c = Classifiers::new(Some(Pii::new(&PiiEntity::ALL)), None);
    for (text, value) in [
        ("write jörg.müller@example.de now", "jörg.müller@example.de"),
        ("émile@example.fr", "émile@example.fr"),
        (
            "José <josé.garcía@correo.example.es>",
            "josé.garcía@correo.example.es",
        ),
        ("почта: андрей@example.ru.", "андрей@example.ru"),
        ("メールはtaro@example.jpです", "taro@example.jp"),
        ("Grüße, müller+news@example.de", "müller+news@example.de"),
    ] {
        let out = c.classify(&[Message::new("user", text)]);
        let found: Vec<&str> = out.matches.iter().map(|m| &text[m.start..m.end]).collect();
        assert_eq!(found, [value], "{text:?}");
        assert_eq!(out.matches[0].entity.as_str(), "email");
        let first = value.chars().next().unwrap();
        let last = value.chars().last().unwrap();
        let masked = value.chars().count() - 2;
        assert_eq!(
            out.matches[0].redacted,
            format!("{first}{}{last}", "*".repeat(masked))
        );
    }
    assert_clean("Größe@ 42");
    assert_clean("été@2x.png");
}

/// Offsets are byte offsets into the message: in text with multi-byte characters before the
/// value they still slice it out exactly.
#[test]
fn offsets_are_byte_offsets_in_multibyte_text() {
    let c = Classifiers::default();
    let text = "Ünïcödé 😀 — 电话 +86 138 0013 8000，邮箱 zhang@example.cn；IP 10.1.2.3 ✓";
    let out = c.classify(&[Message::new("user", text)]);
    let found: Vec<&str> = out.matches.iter().map(|m| &text[m.start..m.end]).collect();
    assert_eq!(found, ["+86 138 0013 8000", "zhang@example.cn", "10.1.2.3"]);
}

/// Tool-call arguments are JSON text (an OpenAI `arguments` string as sent, an Anthropic
/// `input` written as compact JSON), where a line break inside a string is the escape `\n`: a
/// value at the start of a line followed the letter `n` and was glued to it, so a card, phone,
/// SSN or IBAN on a line of its own went unseen.
#[test]
fn values_after_escaped_line_breaks_are_found() {
    let anthropic = serde_json::json!({"messages": [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "send_email", "input": {
                "body": "Hello,\nCard:\n4111 1111 1111 1111\nthanks"
            }}
        ]}
    ]});
    let msgs = kinf_router::classify::eval::messages_from_json(&anthropic).unwrap();
    let borrowed: Vec<Message<'_>> = msgs.iter().map(|m| m.as_message()).collect();
    let out = Classifiers::default().classify(&borrowed);
    let found: Vec<&str> = out
        .matches
        .iter()
        .map(|m| &borrowed[m.message_index].content[m.start..m.end])
        .collect();
    assert_eq!(found, ["4111 1111 1111 1111"]);

    let c = Classifiers::new(Some(Pii::new(&PiiEntity::ALL)), None);
    let args = r#"{"note":"Phone:\n+1 415 555 2671\r\n078-05-1120\tDE89 3704 0044 0532 0130 00\n\njane@example.com\n10.1.2.3"}"#;
    let out = c.classify(&[Message::also_seen("assistant", args)]);
    let found: Vec<(&str, &str)> = out
        .matches
        .iter()
        .map(|m| (m.entity.as_str(), &args[m.start..m.end]))
        .collect();
    assert_eq!(
        found,
        [
            ("phone", "+1 415 555 2671"),
            ("ssn", "078-05-1120"),
            ("iban", "DE89 3704 0044 0532 0130 00"),
            ("email", "jane@example.com"),
            ("ip-address", "10.1.2.3"),
        ]
    );
    // Identifier context still reads through the escape.
    assert_clean(r#"{"text":"Order no.\n4111111111111111"}"#);
}

/// Every PII value in `text`, as (entity, the slice of `text` its offsets give, redacted).
fn pii_values(text: &str) -> Vec<(&'static str, &str, String)> {
    let c = Classifiers::new(Some(Pii::new(&PiiEntity::ALL)), None);
    c.classify(&[Message::new("user", text)])
        .matches
        .into_iter()
        .map(|m| (m.entity.as_str(), &text[m.start..m.end], m.redacted))
        .collect()
}

/// Asserts that `text` holds exactly one PII value, of `entity`, written `value`.
fn assert_single_value(text: &str, entity: &str, value: &str) {
    let found = pii_values(text);
    assert_eq!(found.len(), 1, "{text:?}: {found:?}");
    assert_eq!((found[0].0, found[0].1), (entity, value), "{text:?}");
}

/// Full-width digits and hyphens (U+FF10..U+FF19, U+FF0D, as an IME types them) read as their
/// ASCII forms; the offsets and the redaction are those of the text as written.
#[test]
fn pii_in_full_width_digits_is_found() {
    for (text, entity, value) in [
        (
            "カード番号は４１１１ １１１１ １１１１ １１１１です",
            "credit-card",
            "４１１１ １１１１ １１１１ １１１１",
        ),
        (
            "card ４１１１－１１１１－１１１１－１１１１ ok",
            "credit-card",
            "４１１１－１１１１－１１１１－１１１１",
        ),
        ("SSN ０７８-０５-１１２０.", "ssn", "０７８-０５-１１２０"),
        (
            "ssn: ０７８－０５－１１２０",
            "ssn",
            "０７８－０５－１１２０",
        ),
        (
            "電話 ０３０ １２３４５６７８",
            "phone",
            "０３０ １２３４５６７８",
        ),
        ("from １０.１.２.３ port", "ip-address", "１０.１.２.３"),
    ] {
        let found = pii_values(text);
        assert_eq!(found.len(), 1, "{text:?}: {found:?}");
        let (e, v, redacted) = &found[0];
        assert_eq!((*e, *v), (entity, value), "{text:?}");
        let first = value.chars().next().unwrap();
        let last = value.chars().last().unwrap();
        let masked = value.chars().count() - 2;
        assert_eq!(redacted, &format!("{first}{}{last}", "*".repeat(masked)));
    }
    // Values after a full-width one keep their offsets too.
    let text = "ＳＳＮ ０７８-０５-１１２０ and jane@example.com, card 4111 1111 1111 1111";
    let found: Vec<(&str, &str)> = pii_values(text).iter().map(|(e, v, _)| (*e, *v)).collect();
    assert_eq!(
        found,
        [
            ("ssn", "０７８-０５-１１２０"),
            ("email", "jane@example.com"),
            ("credit-card", "4111 1111 1111 1111"),
        ]
    );
    // The rules are those of ASCII digits: no checksum, identifier context, dates, versions.
    assert_clean("カード ４１１１ １１１１ １１１１ １１１２");
    assert_clean("注文 order ４１１１１１１１１１１１１１１１");
    assert_clean("日付 ２０２４-０１-１５ と バージョン v１.２.３.４ と ￥１２，８００");
    assert_clean("ｖｅｒｓｉｏｎ １.２.３ ＡＢＣ－１２３");
}

/// Card numbers grouped with dots (`4111.1111.1111.1111`) are cards when the groups look like a
/// card's (a first group of 4 digits, then groups of 3 to 6) and pass the Luhn check; decimal
/// numbers, thousands separators, OIDs and version strings stay clean.
#[test]
fn cards_grouped_with_dots() {
    for (text, value) in [
        ("card 4111.1111.1111.1111 exp 09/27", "4111.1111.1111.1111"),
        ("pan: 5555.5555.5555.4444.", "5555.5555.5555.4444"),
        ("amex 3782.822463.10005", "3782.822463.10005"),
    ] {
        assert_single_value(text, "credit-card", value);
    }
    assert_clean("card 4111.1111.1111.1112"); // Luhn
    assert_clean("total 4.111.111.111.111 EUR"); // thousands separators
    assert_clean("pi 3.14159265358979323 and 4111.111111111111");
    assert_clean("OID 2.16.840.1.113730.3.1.2 and 1.3.6.1.4.1.311.21.8");
    assert_clean("version 4111.1111.1111.1111.2");
    assert_clean("v1.27.3, 2024.01.15, $4,111.11, 4111.11 EUR, 1234.5678.9012");
    let ips: Vec<(&str, &str)> = pii_values("from 10.0.0.1 to 192.168.100.200.")
        .iter()
        .map(|(e, v, _)| (*e, *v))
        .collect();
    assert_eq!(
        ips,
        [
            ("ip-address", "10.0.0.1"),
            ("ip-address", "192.168.100.200")
        ]
    );
    assert_clean("4111.1111 1111-1111");
}

/// Lower-case (and mixed-case) IBANs are read as their upper-case forms, with the same length
/// and mod-97 checks; a lower-case one must be unspaced or grouped by four.
#[test]
fn lower_case_ibans() {
    for (text, value) in [
        (
            "iban gb82 west 1234 5698 7654 32 thanks",
            "gb82 west 1234 5698 7654 32",
        ),
        ("de89370400440532013000", "de89370400440532013000"),
        (
            "IBAN: Gb82 West 1234 5698 7654 32.",
            "Gb82 West 1234 5698 7654 32",
        ),
    ] {
        assert_single_value(text, "iban", value);
    }
    assert_clean("gb82 west 1234 5698 7654 33"); // checksum
    assert_clean("de88370400440532013000");
    assert_clean("es2015 modules and classes with some more words");
    assert_clean("use at10 for it and de12 then fr76 or gb82 west as a label");
    assert_clean("gb82 w est1 2345 6987 6543 2");
}

/// SSNs written with en dashes or em dashes (`078–05–1120`), the same dash twice.
#[test]
fn ssns_with_en_and_em_dashes() {
    for (text, value) in [
        ("SSN 078–05–1120", "078–05–1120"),
        ("my ssn is 078—05—1120.", "078—05—1120"),
        ("(078–05–1120)", "078–05–1120"),
    ] {
        assert_single_value(text, "ssn", value);
    }
    assert_clean("078–05—1120"); // two different dashes
    assert_clean("pages 123–45–0000 and 000–12–3456");
    assert_clean("part no. 078–05–1120");
    assert_clean("the 2019–2020 season, pages 123–456, 1999—2005");
}

/// A phone number followed by an extension (`ext. 42`, `x42`, `;ext=42`) is still found; the
/// match is the number.
#[test]
fn phones_with_extensions() {
    for (text, value) in [
        ("call +1 (415) 555-0132 ext. 42 today", "+1 (415) 555-0132"),
        ("call +1 (415) 555-0132 x42", "+1 (415) 555-0132"),
        ("call +1 (415) 555-0132x42", "+1 (415) 555-0132"),
        ("call (415) 555-0132 ext 4200", "(415) 555-0132"),
        ("call 415-555-0132x7.", "415-555-0132"),
        ("call 415-555-0132ext.42 or", "415-555-0132"),
        ("call 415.555.0132 EXT:42", "415.555.0132"),
        ("tel:+1-415-555-0132;ext=42", "+1-415-555-0132"),
        ("+44 20 7946 0958 extn. 3", "+44 20 7946 0958"),
    ] {
        assert_single_value(text, "phone", value);
    }
    assert_clean("SKU 550-123-4567x42");
    assert_clean("size 415-555-0132xl and 415-555-0132x4a");
    assert_clean("build 415-555-0132x12345678");
}

/// `Tax ID: 078-05-1120`: `id` is identifier context, but not after `tax` or `taxpayer`.
#[test]
fn ssn_after_tax_id() {
    for (text, value) in [
        ("Tax ID: 078-05-1120", "078-05-1120"),
        ("taxpayer id number 078-05-1120", "078-05-1120"),
        ("tax_id=078 05 1120", "078 05 1120"),
        ("Tax ID no. 078–05–1120", "078–05–1120"),
    ] {
        assert_single_value(text, "ssn", value);
    }
    assert_clean("ID: 078-05-1120");
    assert_clean("employee id 078-05-1120");
    assert_clean("tax order id 078-05-1120");
}

/// The questions the default complexity classifier counts in one user message.
fn questions(text: &str) -> usize {
    Complexity::new(ComplexityConfig::default())
        .features(&[Message::new("user", text)])
        .questions
}

/// A `?` that starts a URL's query string (`https://x.com/a?b=1&c=2`) is no question; one that
/// ends a URL (`... https://x.com/a?`) or follows it is.
#[test]
fn complexity_does_not_count_url_query_strings() {
    assert_eq!(questions("see https://x.com/a?b=1&c=2"), 0);
    assert_eq!(
        questions("GET http://api.example.com/v1/items?id=3&q=a?b and https://x.com/?utm=1"),
        0
    );
    assert_eq!(questions("[docs](https://x.com/search?q=rust) ok"), 0);
    assert_eq!(
        questions("Is it https://x.com/a?b=1? Or https://x.com/b?"),
        2
    );
    assert_eq!(questions("why?\nhttps://x.com/a?b=1\nhow?"), 2);
    assert_eq!(questions("what?why ftp:/x?y a?b=1 x ://?q"), 4);
    let urls = "Summarise https://x.com/a?b=1&c=2 and https://y.org/p?q=1&r=2 and \
                https://z.net/s?t=1 and https://w.io/?u=1&v=2 and https://v.dev/?x=1.";
    let c = Complexity::new(ComplexityConfig::default());
    assert_eq!(c.level(&[Message::new("user", urls)]), ComplexityLevel::Low);
}

/// Phone numbers written with en dashes (`555–123–4567`, as word processors set them) read as
/// with hyphens; years and page ranges stay clean.
#[test]
fn phones_with_en_dashes() {
    for (text, value) in [
        ("call 555–123–4567 now", "555–123–4567"),
        ("call +1 415–555–0132.", "+1 415–555–0132"),
        ("tel (415) 555–0132", "(415) 555–0132"),
    ] {
        assert_single_value(text, "phone", value);
    }
    assert_clean("the 2019–2020 season, pages 123–456 and 1999–2005");
    assert_clean("SKU 550–123–4567");
    assert_clean("from 2024–01–15 to 2024–02–11");
}

/// An extension after a space (`ext 42`, `ext. 42`) glued to the number, or written `#42`, leaves
/// the number found.
#[test]
fn phone_extensions_with_a_space_or_hash() {
    for (text, value) in [
        ("call 415-555-0132ext 42 today", "415-555-0132"),
        ("call 415-555-0132ext. 42 today", "415-555-0132"),
        ("call +1 (415) 555-0132x 7", "+1 (415) 555-0132"),
        ("call 415-555-0132 #42 today", "415-555-0132"),
        ("call (415) 555-0132#42", "(415) 555-0132"),
    ] {
        assert_single_value(text, "phone", value);
    }
    assert_clean("SKU 550-123-4567ext 42");
    assert_clean("call 415-555-0132ext 1234567 or 415-555-0132ext 42a");
    assert_clean("call 415-555-0132ext  42");
}

/// Full-width `＋（）．` and the ideographic space (U+3000) read as their ASCII forms, like
/// full-width digits; offsets and redaction are those of the text as written.
#[test]
fn full_width_punctuation_and_ideographic_spaces() {
    for (text, entity, value) in [
        (
            "電話＋８１\u{3000}９０\u{3000}１２３４\u{3000}５６７８",
            "phone",
            "＋８１\u{3000}９０\u{3000}１２３４\u{3000}５６７８",
        ),
        (
            "電話 （０３） １２３４－５６７８",
            "phone",
            "（０３） １２３４－５６７８",
        ),
        ("IP １０．１．２．３ port", "ip-address", "１０．１．２．３"),
        (
            "カード\u{3000}４１１１\u{3000}１１１１\u{3000}１１１１\u{3000}１１１１",
            "credit-card",
            "４１１１\u{3000}１１１１\u{3000}１１１１\u{3000}１１１１",
        ),
    ] {
        let found = pii_values(text);
        assert_eq!(found.len(), 1, "{text:?}: {found:?}");
        let (e, v, redacted) = &found[0];
        assert_eq!((*e, *v), (entity, value), "{text:?}");
        let first = value.chars().next().unwrap();
        let last = value.chars().last().unwrap();
        let masked = value.chars().count() - 2;
        assert_eq!(redacted, &format!("{first}{}{last}", "*".repeat(masked)));
    }
    assert_clean("バージョン\u{3000}ｖ１．２．３．４ と （１２３） と ＋１");
    assert_clean("カード\u{3000}４１１１\u{3000}１１１１\u{3000}１１１１\u{3000}１１１２");
}

/// Nine digits without separators after a tax-ID label (`Tax ID: 078051120`) are an SSN, with the
/// SSN's ranges; after other labels they are not.
#[test]
fn ssn_nine_digits_after_tax_id() {
    for (text, value) in [
        ("Tax ID: 078051120", "078051120"),
        ("taxpayer id number 078051120.", "078051120"),
        ("tax_id=078051120", "078051120"),
    ] {
        assert_single_value(text, "ssn", value);
    }
    assert_clean("ID: 078051120");
    assert_clean("order id 078051120");
    assert_clean("Tax ID: 0780511201");
    assert_clean("Tax ID: 000051120 and tax id 666051120");
    assert_clean("Tax ID: 07805112");
    assert_clean("Tax ID: 078051120-3");
}

/// A URL without a scheme (`www.x.com/a?b=1`) has a query string too; `?` after other words
/// stays a question.
#[test]
fn complexity_does_not_count_query_strings_of_www_urls() {
    assert_eq!(questions("see www.x.com/a?b=1&c=2"), 0);
    assert_eq!(questions("(WWW.example.org/search?q=rust)"), 0);
    assert_eq!(questions("is it www.x.com/a? or www.x.com/a b?c=1"), 2);
    // `www.` glued to a letter starts no URL (`awww.x/a` is no bare host either: its last
    // label has one letter).
    assert_eq!(questions("awww.x/a?b=1 and swww.y?z"), 2);
    assert_eq!(questions("why?\nwww.x.com/a?b=1\nhow?"), 2);
}

/// A URL written as a bare host and a path (`x.com/a?b=1`) has a query string too; a `?`
/// after a slash that follows no host name stays a question.
#[test]
fn complexity_does_not_count_query_strings_of_bare_host_urls() {
    assert_eq!(questions("see x.com/a?b=1"), 0);
    assert_eq!(questions("(docs.rs/serde?search=derive&x=1)"), 0);
    assert_eq!(
        questions("api.example.org/v1/items?id=7 and a?b.io/x?y=1"),
        1
    );
    // Not hosts: no dot, a numeric or one-letter last label, a dot glued to the slash.
    assert_eq!(questions("and/or?b"), 1);
    assert_eq!(questions("is 1.5/2?x"), 1);
    assert_eq!(questions("e.g./?x"), 1);
    assert_eq!(questions("a.b/c?d"), 1);
    // Still a question when nothing of a query follows.
    assert_eq!(questions("did you read x.com/a?"), 1);
}
