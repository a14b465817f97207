//! The fast YAML front end builds the same tree, with the same spans and diagnostics, as the
//! `saphyr-parser` path: on every YAML file of the repository (and the YAML blocks of the docs),
//! on generated YAML in many styles, and on random edits of it (which mostly fall back).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};

use kinf_lang::source::{FileId, SourceFile};
use kinf_lang::yaml;
use proptest::prelude::*;

/// Both paths' trees and diagnostics, printed (floats and NaN compare by their text).
fn both(text: &str) -> (String, String) {
    let file = SourceFile::new("t.yaml", text);
    let mut d1 = Vec::new();
    let t1 = yaml::parse_documents(FileId(0), &file, &mut d1);
    let mut d2 = Vec::new();
    let t2 = yaml::parse_documents_full(FileId(0), &file, &mut d2);
    (format!("{t1:#?}\n{d1:#?}"), format!("{t2:#?}\n{d2:#?}"))
}

fn fast_accepts(text: &str) -> bool {
    kinf_lang::yaml_fast::parse(text, &mut |_, _, _| {}).is_ok()
}

fn assert_same(text: &str, what: &str) {
    let (fast, full) = both(text);
    if fast == full {
        return;
    }
    // The first differing line of the two printed trees, with some context.
    let a: Vec<&str> = fast.lines().collect();
    let b: Vec<&str> = full.lines().collect();
    let i = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let from = i.saturating_sub(12);
    panic!(
        "{what}: fast and full YAML paths differ at line {i}\n--- fast ---\n{}\n--- full ---\n{}\n--- text ---\n{text}",
        a[from..(i + 3).min(a.len())].join("\n"),
        b[from..(i + 3).min(b.len())].join("\n"),
    );
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
}

/// The ```yaml blocks of a Markdown file.
fn markdown_yaml(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        match &mut cur {
            None if line.trim_start().starts_with("```yaml") => cur = Some(String::new()),
            Some(_) if line.trim_start().starts_with("```") => out.extend(cur.take()),
            Some(s) => {
                s.push_str(line);
                s.push('\n');
            }
            None => {}
        }
    }
    out
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn repository_yaml_parses_the_same() {
    let root = repo_root();
    let mut files = Vec::new();
    for d in ["testdata", "deploy", "docs", "bench"] {
        yaml_files(&root.join(d), &mut files);
    }
    assert!(files.len() > 40, "found only {} YAML files", files.len());
    let mut fast = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert_same(&text, &f.display().to_string());
        fast += usize::from(fast_accepts(&text));
    }
    let mut md = Vec::new();
    collect_markdown(&root.join("docs"), &mut md);
    md.push(root.join("README.md"));
    let mut blocks = 0;
    for f in &md {
        for (i, block) in markdown_yaml(&std::fs::read_to_string(f).unwrap())
            .iter()
            .enumerate()
        {
            assert_same(block, &format!("{} block {i}", f.display()));
            blocks += 1;
        }
    }
    eprintln!(
        "{} files ({fast} on the fast path), {blocks} Markdown blocks",
        files.len()
    );
    // The policy examples are what the fast path is for.
    assert!(
        fast * 2 > files.len(),
        "only {fast} of {} files took the fast path",
        files.len()
    );
}

fn collect_markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_markdown(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

#[test]
fn synthetic_bundle_takes_the_fast_path() {
    let text = kinf_lang::synthetic::synthetic_bundle(30, 7);
    assert!(fast_accepts(&text));
    assert_same(&text, "synthetic bundle");
}

#[test]
fn hand_written_edge_cases_parse_the_same() {
    let cases = [
        "a: 1\n",
        "a: 1",
        "a: 1 # c",
        "a: 1   \n",
        "a:\n  b: 1\n  c: [1, 2]\n",
        "a:\n- 1\n- 2\nb: x\n",
        "a:\n  - 1\n  - 2\nb: x\n",
        "- a\n- b\n",
        "- a: 1\n  b: 2\n- c: 3\n",
        "---\na: 1\n---\nb: 2\n",
        "---\n---\na: 1\n",
        "# c\n\n---\n# c\na: 1 # c\n# c\n",
        "a: 'it''s'\nb: \"q\"\nc: ''\n",
        "a: { b: 1, c: [x, y], d: {} }\n",
        "a: [ ]\nb: {}\n",
        "a: {b: 1}\n",
        "a: [ {b: 1}, [c] ]\n",
        "a: https://x.example.com:80/v1\nb: a#b\nc: 80%\n",
        "a: { url: https://x.example.com:80/v1 }\n",
        "a: -5\nb: -x\nc: 0x1F\nd: .5\ne: ~\nf: null\ng: True\n",
        "a: b: c\n",
        "a:\n",
        "a:\nb: 1\n",
        "a: 1\na: 2\n",
        "a: x\n  y\n",
        "a: x\n  # c\nb: y\n",
        "a: 'x'\n  # c\nb: y\n",
        "a: \"x\\ty\"\n",
        "a: |\n  x\n",
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "? a\n: b\n",
        "a: [1,\n  2]\n",
        "a: {b: 1,}\n",
        "a: [1, 2,]\n",
        "\ta: 1\n",
        "a: 1\r\n",
        "a: é\n",
        "key : value\n",
        "a:    b   \n",
        "a: 1\n  b: 2\n",
        "a:\n  b: 1\n c: 2\n",
        "- - a\n",
        "-\n  a: 1\n",
        "- \n- a\n",
        "a:\n  -\n    b: 1\n",
        "{a: 1}\n",
        "[1, 2]\n",
        "plain\n",
        "a: [x: y]\n",
        "a: {'b': 1, \"c\": 2}\n",
        "a: {b:1}\n",
        "a: [a,b]\n",
        "a: x,y\n",
        "a: '#x'\n",
        "...\n",
        "--- a\n",
        "%YAML 1.2\n---\na: 1\n",
        "a: 1\n...\n",
        "a: \"unclosed\n",
        "a: [unclosed\n",
        "a: 1\n b: 2\n",
        "a:\n  - x\n  y: 1\n",
        "a: -\n",
        "a: - x\n",
        "- a\nb: 1\n",
        "   \n",
        "",
        "#\n",
        "---",
        "a: 1\n---",
        "a: 1\n--- # c\nb: 2\n",
        "a: >\n  folded\n",
        "a: [b, {c: d, e: [f]}]\nz: 1\n",
    ];
    for c in cases {
        assert_same(c, &format!("{c:?}"));
    }
}

/// A YAML value to render.
#[derive(Clone, Debug)]
enum Gen {
    Scalar(&'static str, u8),
    Map(Vec<(&'static str, Gen)>),
    Seq(Vec<Gen>),
}

const SCALARS: &[&str] = &[
    "a",
    "rule-1",
    "10",
    "-5",
    "0.7",
    "true",
    "null",
    "~",
    "",
    "a b",
    "https://x.y:80/z",
    "a#b",
    "x: y",
    "it's",
    "80%",
    "[x]",
    "{y}",
    "-",
    "- a",
    "#c",
    "a,b",
    "10.0.0.1:8000",
    "family-3",
    "promptTokens < 8000 && tenant in [\"t1\"]",
    "x'y",
    "é",
    "-x",
    ":x",
    "?x",
    "a:b",
    "1e3",
];

const GKEYS: &[&str] = &[
    "name",
    "a",
    "b",
    "kind",
    "spec",
    "x y",
    "a:b",
    "-k",
    "when",
    "greaterThan",
    "url",
];

fn gen_tree() -> impl Strategy<Value = Gen> {
    let leaf = (0..SCALARS.len(), 0u8..3).prop_map(|(i, s)| Gen::Scalar(SCALARS[i], s));
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(
                ((0..GKEYS.len()).prop_map(|i| GKEYS[i]), inner.clone()),
                0..5
            )
            .prop_map(Gen::Map),
            prop::collection::vec(inner, 0..5).prop_map(Gen::Seq),
        ]
    })
}

/// Rendering choices, drawn from a byte string.
struct Choices<'a>(&'a [u8], usize);

impl Choices<'_> {
    fn pick(&mut self, n: u8) -> u8 {
        let b = self.0.get(self.1).copied().unwrap_or(0);
        self.1 += 1;
        b % n
    }
}

fn scalar(s: &str, style: u8) -> String {
    match style {
        0 => s.to_string(),
        1 => format!("'{}'", s.replace('\'', "''")),
        _ => format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
    }
}

fn flow(g: &Gen, c: &mut Choices<'_>) -> String {
    let sp = if c.pick(2) == 0 { " " } else { "" };
    match g {
        Gen::Scalar(s, st) => scalar(s, *st),
        Gen::Map(es) => {
            let items: Vec<String> = es
                .iter()
                .map(|(k, v)| format!("{k}: {}", flow(v, c)))
                .collect();
            format!("{{{sp}{}{sp}}}", items.join(", "))
        }
        Gen::Seq(xs) => {
            let items: Vec<String> = xs.iter().map(|v| flow(v, c)).collect();
            format!("[{sp}{}{sp}]", items.join(", "))
        }
    }
}

fn comment(c: &mut Choices<'_>) -> &'static str {
    match c.pick(8) {
        0 => " # note",
        1 => "  ",
        _ => "",
    }
}

fn extra_lines(c: &mut Choices<'_>, indent: usize, out: &mut String) {
    match c.pick(10) {
        0 => out.push('\n'),
        1 => {
            out.push_str(&" ".repeat(indent));
            out.push_str("# comment line\n");
        }
        _ => {}
    }
}

/// Renders `g` as the value after `key:` or `- ` (the text after the indicator), at `indent`.
fn block_value(g: &Gen, indent: usize, c: &mut Choices<'_>, out: &mut String, in_map: bool) {
    let use_flow = c.pick(4) == 0;
    match g {
        Gen::Scalar(s, st) => {
            out.push(' ');
            out.push_str(&scalar(s, *st));
            out.push_str(comment(c));
            out.push('\n');
        }
        _ if use_flow => {
            out.push(' ');
            out.push_str(&flow(g, c));
            out.push_str(comment(c));
            out.push('\n');
        }
        Gen::Map(es) if es.is_empty() => out.push_str(" {}\n"),
        Gen::Seq(xs) if xs.is_empty() => out.push_str(" []\n"),
        Gen::Map(_) => {
            out.push_str(comment(c));
            out.push('\n');
            let step = 1 + c.pick(3) as usize;
            block(g, indent + step, c, out);
        }
        Gen::Seq(_) => {
            out.push_str(comment(c));
            out.push('\n');
            let step = if in_map && c.pick(2) == 0 {
                0
            } else {
                1 + c.pick(3) as usize
            };
            block(g, indent + step, c, out);
        }
    }
}

/// Renders a collection in block style, every line at `indent`.
fn block(g: &Gen, indent: usize, c: &mut Choices<'_>, out: &mut String) {
    let pad = " ".repeat(indent);
    match g {
        Gen::Scalar(s, st) => {
            out.push_str(&pad);
            out.push_str(&scalar(s, *st));
            out.push('\n');
        }
        Gen::Map(es) => {
            for (k, v) in es {
                extra_lines(c, indent, out);
                out.push_str(&pad);
                out.push_str(k);
                out.push(':');
                block_value(v, indent, c, out, true);
            }
        }
        Gen::Seq(xs) => {
            for x in xs {
                extra_lines(c, indent, out);
                out.push_str(&pad);
                out.push('-');
                match x {
                    // `- key: value` with the mapping's keys aligned after the dash.
                    Gen::Map(es) if !es.is_empty() && c.pick(3) != 0 => {
                        let inner = indent + 2;
                        for (i, (k, v)) in es.iter().enumerate() {
                            if i == 0 {
                                out.push(' ');
                            } else {
                                out.push_str(&" ".repeat(inner));
                            }
                            out.push_str(k);
                            out.push(':');
                            block_value(v, inner, c, out, true);
                        }
                    }
                    _ => block_value(x, indent, c, out, false),
                }
            }
        }
    }
}

fn render(docs: &[Gen], c: &mut Choices<'_>) -> String {
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 || c.pick(2) == 0 {
            out.push_str("---\n");
        }
        match d {
            Gen::Scalar(..) => block(&Gen::Map(vec![("a", d.clone())]), 0, c, &mut out),
            _ => block(d, 0, c, &mut out),
        }
    }
    out
}

/// A random edit: delete a byte, or insert a YAML-significant character.
fn mutate(text: &str, at: usize, what: u8) -> String {
    const INS: &[u8] = b" \n:-#{}[],'\"\\\t&*!|>?%";
    let mut b = text.as_bytes().to_vec();
    if b.is_empty() {
        return String::new();
    }
    let at = at % b.len();
    let w = what as usize % (INS.len() + 1);
    if w == INS.len() {
        b.remove(at);
    } else {
        b.insert(at, INS[w]);
    }
    String::from_utf8_lossy(&b).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(768))]

    #[test]
    fn generated_yaml_parses_the_same(
        docs in prop::collection::vec(gen_tree(), 1..3),
        choices in prop::collection::vec(any::<u8>(), 64..256),
    ) {
        let text = render(&docs, &mut Choices(&choices, 0));
        assert_same(&text, "generated");
    }

    #[test]
    fn edited_yaml_parses_the_same(
        docs in prop::collection::vec(gen_tree(), 1..3),
        choices in prop::collection::vec(any::<u8>(), 64..256),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..3),
    ) {
        let mut text = render(&docs, &mut Choices(&choices, 0));
        for (at, what) in edits {
            text = mutate(&text, at, what);
        }
        assert_same(&text, "edited");
    }

    #[test]
    fn edited_bundles_parse_the_same(
        at in any::<usize>(),
        what in any::<u8>(),
    ) {
        let text = mutate(&kinf_lang::synthetic::synthetic_bundle(3, 2), at, what);
        assert_same(&text, "edited bundle");
    }
}
