//! `kinfctl graph`.

use std::io::Write;
use std::path::PathBuf;

use kinf_lang::dag::{RuleDag, render_pool};

use crate::EXIT_OK;
use crate::cli::GraphFormat;
use crate::report::{self, Error, ErrorKind};

/// `kinfctl graph`.
pub fn run(
    paths: &[PathBuf],
    pool: Option<&str>,
    format: GraphFormat,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let json = format == GraphFormat::Json;
    let sources = match crate::load::read_sources(paths) {
        Ok(s) => s,
        Err(e) => return report::error(json, out, err, e),
    };
    let c = kinf_lang::compile(&sources);
    let Some(policy) = c.policy else {
        // With `json`, the diagnostics themselves, as `lint --format json` gives them.
        let e = report::not_compiled(c.errors());
        return report::compile_errors_brief(json, out, err, &sources, &c.diagnostics, e);
    };
    let pools: Vec<_> = policy
        .pools
        .iter()
        .filter(|p| {
            pool.is_none_or(|n| *p.name == *n || format!("{}/{}", p.namespace, p.name) == n)
        })
        .collect();
    if pools.is_empty() {
        let names: Vec<String> = policy
            .pools
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        let e = Error::new(
            ErrorKind::Unknown,
            format!(
                "no pool `{}`; pools: {}",
                pool.unwrap_or(""),
                names.join(", ")
            ),
        );
        return report::error(json, out, err, e);
    }
    match format {
        GraphFormat::Text => {
            for p in pools {
                let _ = write!(out, "{}", render_pool(p, &policy));
            }
        }
        GraphFormat::Dot => {
            for p in pools {
                let _ = write!(out, "{}", RuleDag::build(p).to_dot(p, &policy));
            }
        }
        GraphFormat::Json => {
            let v: Vec<serde_json::Value> = pools
                .iter()
                .map(|p| serde_json::json!({"pool": format!("{}/{}", p.namespace, p.name), "text": render_pool(p, &policy)}))
                .collect();
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&v).unwrap_or_default()
            );
        }
    }
    EXIT_OK
}
